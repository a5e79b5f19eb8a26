"""Checkpoints in and out: a checkpoint spec resolved to a local directory, the trainable model loaded from
it, its lineage and decoding format read back, and new checkpoints written atomically (locally or to an
fsspec URL, ``lineage.json`` last). torch, transformers and peft are imported inside the functions."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conductor.learning.grpo.config import GRPOConfig
from conductor.learning.grpo.precision import device_dtype

if TYPE_CHECKING:
    from conductor.decoding.contract import ConductorFormat


class TrainError(ValueError):
    """A training input that cannot be used (bad checkpoint path, empty run, ...); one line."""


def is_remote(uri: str) -> bool:
    """An fsspec URL other than ``file://``.

    >>> is_remote("s3://b/ckpt"), is_remote("file:///tmp/ckpt"), is_remote("/tmp/ckpt")
    (True, False, False)
    """
    return "://" in uri and not uri.startswith("file://")


def _cache_root() -> Path:
    from conductor.local.embedded import conductor_home

    return conductor_home() / "checkpoints-cache"


def _ensure(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


def resolve_model(spec: str) -> tuple[Path, str | None]:
    """A checkpoint spec -> (local directory, gguf file name or None).

    Accepts a HF checkpoint directory, a ``.gguf`` file (de-quantised by
    transformers; its converted copy under ``$CONDUCTOR_HOME/hf`` is used when
    the transformers backend made one), or an ``s3://``/fsspec URL of a
    checkpoint directory (downloaded once into a local cache).
    """
    if is_remote(spec):
        import fsspec

        local = _cache_root() / hashlib.sha256(spec.encode()).hexdigest()[:16]
        if not (local / "config.json").is_file():
            fs, path = fsspec.core.url_to_fs(spec)
            if not fs.exists(f"{path.rstrip('/')}/config.json"):
                raise TrainError(f"{spec}: not a checkpoint (no config.json)")
            tmp = Path(tempfile.mkdtemp(prefix=".dl-", dir=_ensure(local.parent)))
            fs.get(path.rstrip("/") + "/", str(tmp), recursive=True)
            tmp.rename(local)
        return local, None
    p = Path(spec.removeprefix("file://"))
    if p.is_file() and p.suffix == ".gguf":
        try:
            from conductor.local.transformers_server import converted_dir

            conv = converted_dir(p)
            if (conv / "config.json").is_file():
                return conv, None
        except ImportError:
            pass
        return p.parent, p.name
    if p.is_dir() and (p / "config.json").is_file():
        return p, None
    raise TrainError(f"{spec}: not a checkpoint directory (no config.json) nor a .gguf file")


def read_parent_lineage(spec: str) -> dict[str, Any]:
    """The checkpoint's ``lineage.json`` (``{}`` for a base model, a GGUF or an unreadable file)."""
    try:
        local, gguf = resolve_model(spec)
    except TrainError:
        return {}
    f = local / "lineage.json"
    if gguf is None and f.is_file():
        try:
            return json.loads(f.read_text())
        except ValueError:
            return {}
    return {}


def parent_format(spec: str) -> Any:
    """The parent checkpoint's ``conductor_format.json`` (``conductor.decoding.contract``), or None."""
    from conductor.decoding.contract import load_format

    try:
        local, gguf = resolve_model(spec)
    except TrainError:
        return None
    return None if gguf is not None else load_format(local)


def optimizer_state_file(spec: str) -> Path | None:
    """The checkpoint's ``optimizer.pt`` when it has one (full fine-tuning with ``save_optimizer``)."""
    try:
        local, gguf = resolve_model(spec)
    except TrainError:
        return None
    f = local / "optimizer.pt"
    return f if gguf is None and f.is_file() else None


def load_policy(spec: str, cfg: GRPOConfig, *, for_sharding: bool = False) -> tuple[Any, Any]:
    """(model, tokenizer) ready to train: dtype/device per config, LoRA wrapped when ``lora_r > 0``.

    ``for_sharding``: left on the CPU (FSDP moves each shard to its GPU) and with non-reentrant gradient
    checkpointing, the kind FSDP2 supports.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local, gguf = resolve_model(spec)
    device, dtype = device_dtype(cfg)
    kw = {"gguf_file": gguf} if gguf else {}
    tokenizer = AutoTokenizer.from_pretrained(local, local_files_only=True, **kw)
    # Any: transformers' decorated methods (``to``) and peft's wrapper do not type-check as one model class
    model: Any = AutoModelForCausalLM.from_pretrained(local, local_files_only=True, dtype=dtype, **kw)
    if gguf:
        _drop_gguf_marker(model)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not for_sharding:
        model.to(device)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(**({"gradient_checkpointing_kwargs": {"use_reentrant": False}}
                                               if for_sharding else {}))
        model.config.use_cache = False
    if cfg.lora_r > 0:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                                                 target_modules=cfg.lora_target_modules, task_type="CAUSAL_LM"))
    torch.manual_seed(cfg.seed)
    return model, tokenizer


def _drop_gguf_marker(model: Any) -> None:
    """De-quantised GGUF weights are plain tensors; drop the quantisation marker so ``save_pretrained`` works."""
    model.hf_quantizer = None
    for obj in (model, model.config):
        if hasattr(obj, "quantization_config"):
            try:
                delattr(obj, "quantization_config")
            except AttributeError:
                pass
    try:
        model.is_quantized = False
    except AttributeError:      # a read-only property in some transformers versions
        pass


def publish_dir(dest: Path, marker: str, fill: Callable[[Path], None]) -> Path:
    """Write a directory atomically: ``fill`` a temp dir beside ``dest``, then rename it into place, unless
    another process published ``dest`` (its ``marker`` file exists) meanwhile; nothing half-written stays."""
    stage = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        fill(stage)
        if (dest / marker).is_file():      # another process won the race
            shutil.rmtree(stage, ignore_errors=True)
        else:
            os.rename(stage, dest)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return dest


def ensure_hf_checkpoint(gguf_path: str | Path) -> Path:
    """A trainable HF checkpoint for a .gguf file: de-quantised once, cached where the transformers
    backend looks (``converted_dir``), written atomically. Training from the GGUF directly works too but
    de-quantises on every load (about a minute for SmolLM2-135M on two cores)."""
    from conductor.local.transformers_server import converted_dir

    gguf = Path(gguf_path)
    if not gguf.is_file():
        raise TrainError(f"{gguf}: no such GGUF file")
    dest = converted_dir(gguf)
    if (dest / "config.json").is_file():
        return dest
    model, tok = load_policy(str(gguf), GRPOConfig(device="cpu", dtype="float32"))
    _ensure(dest.parent)

    def fill(stage: Path) -> None:
        model.save_pretrained(stage)
        tok.save_pretrained(stage)

    return publish_dir(dest, "config.json", fill)


def formatted_base(base: str, fmt: ConductorFormat, root: str | Path) -> Path:
    """A HF copy of ``base`` (a .gguf file or a checkpoint directory) carrying ``fmt``, under ``root``; made
    once (atomically), reused after. The trainer then carries the format to every descendant."""
    from conductor.decoding.contract import FORMAT_FILE, write_format

    src = Path(base)
    if src.is_file() and src.suffix == ".gguf":
        src = ensure_hf_checkpoint(src)
    else:
        local, gguf = resolve_model(base)
        if gguf is not None:
            raise TrainError(f"{base}: a GGUF inside a directory; pass the .gguf file")
        src = local
    dest = Path(root) / f"{src.name}-fmt{fmt.digest}"
    if (dest / FORMAT_FILE).is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)

    def fill(stage: Path) -> None:
        for f in src.iterdir():
            if f.is_file() and f.name not in (FORMAT_FILE, "optimizer.pt"):
                shutil.copy2(f, stage / f.name)
        write_format(stage, fmt)

    return publish_dir(dest, FORMAT_FILE, fill)


def child_checkpoint_path(parent: str, iteration: int) -> str:
    """Where ``grpo_step`` writes the child of ``parent`` by default: a sibling ``<stem>-it<N>`` directory, or
    ``$CONDUCTOR_HOME/checkpoints/<stem>-it<N>`` for a .gguf file or a remote parent.

    >>> child_checkpoint_path("/ckpt/base-it0002", 3)
    '/ckpt/base-it0003'
    """
    base = parent.rstrip("/")
    stem = base.rsplit("/", 1)[-1].removesuffix(".gguf").split("-it")[0]
    if base.endswith(".gguf") or is_remote(base):
        from conductor.local.embedded import conductor_home

        return str(conductor_home() / "checkpoints" / f"{stem}-it{iteration:04d}")
    return str(Path(base).parent / f"{stem}-it{iteration:04d}")


def check_free(out: str, overwrite: bool) -> None:
    """Refuse to write over an existing checkpoint unless ``overwrite``."""
    if overwrite:
        return
    if is_remote(out):
        import fsspec

        fs, rpath = fsspec.core.url_to_fs(out)
        if fs.exists(f"{rpath.rstrip('/')}/lineage.json"):
            raise TrainError(f"{out}: a checkpoint already exists there")
    elif Path(out.removeprefix("file://")).exists():
        raise TrainError(f"{Path(out.removeprefix('file://'))}: a checkpoint already exists there")


def write_checkpoint(out: str, *, model: Any, tokenizer: Any, cfg: GRPOConfig, lineage: Callable[[], dict[str, Any]],
                     conductor_format: ConductorFormat | None = None, weights: dict[str, Any] | None = None,
                     optimizer_state: dict[str, Any] | None = None, overwrite: bool = False) -> None:
    """Stage a HF checkpoint + tokenizer (+ ``conductor_format.json``, ``optimizer.pt``) + ``lineage.json``, then
    rename it into place (local) or upload it with ``lineage.json`` last (remote).

    ``weights``: a gathered full state dict (sharded training) or None (``model``'s own). ``optimizer_state`` is
    written only for full fine-tuning with ``save_optimizer``. ``lineage`` is called once the weights are staged.
    """
    import torch

    check_free(out, overwrite)
    remote = is_remote(out)
    if remote:
        import fsspec

        fs, rpath = fsspec.core.url_to_fs(out)
        stage = Path(tempfile.mkdtemp(prefix=".ckpt-"))
    else:
        dest = Path(out.removeprefix("file://"))
        _ensure(dest.parent)
        stage = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        if cfg.lora_r > 0 and cfg.lora_merge_on_save:
            import copy

            model = copy.deepcopy(model).merge_and_unload()
        if weights is not None:
            model.save_pretrained(stage, state_dict=weights)
        else:
            model.save_pretrained(stage)
        tokenizer.save_pretrained(stage)
        if conductor_format is not None:
            from conductor.decoding.contract import write_format

            write_format(stage, conductor_format)
        if cfg.save_optimizer and cfg.lora_r == 0 and optimizer_state is not None:
            torch.save(optimizer_state, stage / "optimizer.pt")
        (stage / "lineage.json").write_text(json.dumps(lineage(), indent=1, default=str))
        if remote:
            _upload(fs, stage, rpath.rstrip("/"))
            shutil.rmtree(stage, ignore_errors=True)
        else:
            if dest.exists():
                shutil.rmtree(dest)
            os.rename(stage, dest)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def _upload(fs: Any, stage: Path, rpath: str) -> None:
    """Every staged file, then ``lineage.json`` last: its presence marks a complete remote checkpoint."""
    lineage = stage / "lineage.json"
    for f in sorted(stage.iterdir()):
        if f != lineage:
            fs.put(str(f), f"{rpath}/{f.name}", recursive=f.is_dir())
    fs.put(str(lineage), f"{rpath}/lineage.json")
