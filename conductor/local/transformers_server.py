"""The embedded models' fallback server: ``transformers serve`` on a float checkpoint.

WHY: llama-cpp-python compiles llama.cpp at install time; a machine without a C++
compiler still has torch and transformers, and transformers ships an
OpenAI-compatible server (``transformers serve``). It is started on the float
checkpoint the transformers policy backend converts from the GGUF file once
(``$CONDUCTOR_HOME/hf/``, created here if missing), so a start is a safetensors
load, not a GGUF de-quantisation.

Two things make it answer like the llama.cpp server:
- the model name: a server given FORCE_MODEL answers only requests naming exactly
  that string, so it is started in a directory holding ``<alias>/`` and given
  the alias (the embedded name, as in the manifest) as FORCE_MODEL;
- sampling: our checkpoints' generation config has no ``do_sample``, and then the
  server decodes greedily whatever the temperature. ``<alias>/`` therefore links
  the checkpoint's files but carries its own generation config: sampling on,
  no top-k/top-p unless a request asks (the server turns temperature 0 into greedy).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from conductor.local.process import ServerError, ServerProcess, _last_line, default_threads

if TYPE_CHECKING:
    from conductor.workers.pool import Worker

GENERATION_CONFIG = "generation_config.json"

# Converts a GGUF file once, in a child process so the caller never imports torch (the backend caches the result).
_CONVERT = ("import sys; from conductor.policy.transformers_backend import TransformersBackend; "
            "TransformersBackend.load(sys.argv[1], threads=int(sys.argv[2])).close()")


def served_generation_config(original: dict) -> dict:
    """The checkpoint's token ids, with OpenAI-style sampling defaults (sample; no top-k, top-p 1).

    >>> served_generation_config({"eos_token_id": 2, "pad_token_id": 2, "temperature": 0.7, "top_k": 20})
    {'eos_token_id': 2, 'pad_token_id': 2, 'do_sample': True, 'temperature': 1.0, 'top_k': 0, 'top_p': 1.0}
    """
    keep = {k: v for k, v in original.items() if k.endswith("token_id") or k == "use_cache"}
    return {**keep, "do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}


def serving_dir(checkpoint: Path, alias: str) -> Path:
    """``$CONDUCTOR_HOME/serve/<checkpoint>-<hash>/<alias>``: the checkpoint's files linked, our generation config.

    Built in a temp dir and renamed into place, so a concurrent run sees it whole or not at all.
    """
    from conductor.local.embedded import conductor_home

    checkpoint = checkpoint.resolve()
    root = conductor_home() / "serve" / f"{checkpoint.name}-{hashlib.sha256(str(checkpoint).encode()).hexdigest()[:8]}"
    dest = root / alias
    try:
        original = json.loads((checkpoint / GENERATION_CONFIG).read_text())
    except FileNotFoundError:
        original = {}
    except (OSError, ValueError) as e:
        raise ServerError(f"{alias}: cannot read {checkpoint / GENERATION_CONFIG}: {e}") from None
    config = json.dumps(served_generation_config(original), indent=1, sort_keys=True)
    files = sorted(p.name for p in checkpoint.iterdir() if p.name != GENERATION_CONFIG and not p.name.startswith("."))
    if _current(dest, checkpoint, files, config):
        return dest
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{alias}.", dir=root))
    try:
        for name in files:
            (tmp / name).symlink_to(checkpoint / name)
        (tmp / GENERATION_CONFIG).write_text(config)
        os.chmod(tmp, 0o755)   # a shared cache: mkdtemp's 0700 would hide it from other users
        if dest.exists():   # stale (the checkpoint changed): move it aside, then replace
            old = Path(tempfile.mkdtemp(prefix=f".{alias}.old.", dir=root))
            os.replace(dest, old / alias)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, dest)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if not _current(dest, checkpoint, files, config):   # losing a race to an identical build is fine
            raise ServerError(f"{alias}: cannot build the serving directory {dest}: {e}") from None
    return dest


def _current(dest: Path, checkpoint: Path, files: list[str], config: str) -> bool:
    try:
        links = sorted(p.name for p in dest.iterdir() if p.name != GENERATION_CONFIG)
        return (links == files and all(os.readlink(dest / n) == str(checkpoint / n) for n in files)
                and (dest / GENERATION_CONFIG).read_text() == config)
    except OSError:
        return False


def converted_dir(gguf_path: Path) -> Path:
    """Where the float checkpoint converted from a GGUF file is kept (keyed by file name and size): what this
    server serves for a GGUF model, and where the transformers backend and GRPO read and write it."""
    from conductor.local.embedded import conductor_home

    size = gguf_path.stat().st_size
    return conductor_home() / "hf" / f"{gguf_path.stem}-{size}"


@dataclass
class TransformersServer(ServerProcess):
    """``transformers serve`` for one model: a GGUF file (converted once) or a transformers checkpoint dir.

    Requests must name the alias; ``resolve_embedded`` sets workers' model to it (``adapt``).
    Of ``ServerSettings`` it uses ``n_threads`` (torch threads), ``startup_timeout_s`` and ``extra_args``
    (``transformers serve`` flags); the context length is the model's.
    """

    device: str = "cpu"
    checkpoint_dir: Path | None = field(default=None, init=False, repr=False)

    label: ClassVar[str] = "transformers server"
    log_prefix: ClassVar[str] = "transformers-server"

    def checkpoint(self) -> Path:
        """The float checkpoint served: the dir itself, or where the GGUF's conversion is cached."""
        if self.model_path.is_dir():
            return self.model_path
        return converted_dir(self.model_path)

    def prepare(self) -> None:
        if any(c in self.alias for c in "/:@") or not self.alias.strip():
            raise ServerError(f"{self.alias!r}: a transformers server alias may not be empty or hold '/', ':' or '@'")
        if not self.model_path.exists():
            raise ServerError(f"{self.alias}: model {self.model_path} does not exist")
        if self.model_path.is_dir() and not (self.model_path / "config.json").is_file():
            raise ServerError(f"{self.alias}: {self.model_path} is not a transformers checkpoint (no config.json)")
        checkpoint = self.checkpoint()
        if not (checkpoint / "config.json").is_file():
            self._convert(checkpoint)
        self.checkpoint_dir = serving_dir(checkpoint, self.alias)

    def _convert(self, checkpoint: Path) -> None:
        """De-quantise the GGUF into ``checkpoint`` (a child process; output into the server log)."""
        cmd = [sys.executable, "-c", _CONVERT, str(self.model_path), str(self._threads())]
        with open(self.log_path, "ab") as log_file:   # type: ignore[arg-type]
            log_file.write(f"converting {self.model_path} -> {checkpoint}\n".encode())
            log_file.flush()
            try:
                proc = subprocess.run(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=self.env(), timeout=self.settings.startup_timeout_s)
            except subprocess.TimeoutExpired:
                raise ServerError(f"{self.alias}: converting {self.model_path.name} took over "
                                  f"{self.settings.startup_timeout_s:.0f}s (log: {self.log_path})") from None
        if proc.returncode != 0 or not (checkpoint / "config.json").is_file():
            raise ServerError(f"{self.alias}: converting {self.model_path.name} to a transformers checkpoint failed "
                              f"(exit {proc.returncode}): {_last_line(self.log_path)} (log: {self.log_path})")

    def _threads(self) -> int:
        return self.settings.n_threads or default_threads()

    def command(self) -> list[str]:
        return [sys.executable, "-m", "transformers.cli.transformers", "serve", self.alias, "--host", self.host,
                "--port", str(self.port), "--device", self.device, "--dtype", "auto", "--log-level", "warning",
                *self.settings.extra_args]

    def env(self) -> dict[str, str]:
        threads = str(self._threads())
        return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1",
                "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false",
                "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}

    def cwd(self) -> Path | None:
        # FORCE_MODEL is the alias, a relative path to the serving directory
        return self.checkpoint_dir.parent if self.checkpoint_dir is not None else None

    def healthy(self) -> bool:
        """True when ``GET /health`` says ok (the model is loaded before the server listens)."""
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.port}/health", timeout=2) as r:
                return r.status == 200 and b'"ok"' in r.read()
        except (urllib.error.URLError, OSError, ValueError):
            return False

    @classmethod
    def adapt(cls, worker: Worker, alias: str) -> Worker:
        return adapt_worker(worker, alias)


# Sampling fields transformers serve would ignore (it only logs a warning): refuse them rather than drift.
_UNSUPPORTED = ("presence_penalty", "reasoning_effort")


def adapt_worker(worker: Worker, served_model: str) -> Worker:
    """A worker called through ``transformers serve``: the served model name; top-k as a generation config.

    >>> from conductor.workers.pool import Worker
    >>> w = adapt_worker(Worker(name="w", provider="local", model="smol-2", sampling={"top_k": 20}), "smol")
    >>> w.model, w.sampling.top_k, w.options["extra_body"]["generation_config"]
    ('smol', None, '{"do_sample": true, "top_k": 20}')
    >>> adapt_worker(Worker(name="w", provider="local", model="m", sampling={"presence_penalty": 1}), "m")
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    conductor.local.process.ServerError: worker w: sampling.presence_penalty is not supported by the transformers server (...)
    """
    s = worker.sampling
    bad = [f"sampling.{f}" for f in _UNSUPPORTED if getattr(s, f) is not None]
    if worker.options.get("continue_final_message") and s.assistant_prefill:
        bad.append("options.continue_final_message")
    if bad:
        verb = "is" if len(bad) == 1 else "are"
        raise ServerError(f"worker {worker.name}: {', '.join(bad)} {verb} not supported by the transformers server "
                          f"(drop it, or serve with llama.cpp: CONDUCTOR_EMBEDDED_SERVER=llamacpp)")
    update: dict = {}
    if worker.model != served_model:
        update["model"] = served_model
    if s.top_k is not None:   # the server rejects a top_k field but takes a generation config (JSON) per request
        extra = {**(worker.options.get("extra_body") or {}),
                 "generation_config": json.dumps({"do_sample": True, "top_k": s.top_k})}
        update["options"] = {**worker.options, "extra_body": extra}
        update["sampling"] = s.model_copy(update={"top_k": None})
    return worker.model_copy(update=update) if update else worker
