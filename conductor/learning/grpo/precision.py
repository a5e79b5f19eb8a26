"""Device and number format of a training process: ``GRPOConfig.device``/``dtype`` resolved, and the autocast
that bf16-mixed training wraps every forward pass in. torch is imported inside the functions."""

from __future__ import annotations

from typing import Any

from conductor.learning.grpo.config import GRPOConfig


def dtype_mode(cfg: GRPOConfig, device: str) -> str:
    """``cfg.dtype`` with ``auto`` resolved: bf16-mixed on GPU, float32 elsewhere.

    >>> dtype_mode(GRPOConfig(), "cuda:0"), dtype_mode(GRPOConfig(), "cpu"), dtype_mode(GRPOConfig(dtype="float16"), "cpu")
    ('bf16-mixed', 'float32', 'float16')
    """
    return cfg.dtype if cfg.dtype != "auto" else ("bf16-mixed" if device.startswith("cuda") else "float32")


def device_dtype(cfg: GRPOConfig) -> tuple[str, Any]:
    """(device, weight dtype); bf16-mixed keeps fp32 weights and autocasts the forward (see ``autocast``)."""
    import torch

    device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    mode = dtype_mode(cfg, device)
    dtype = torch.float32 if mode in ("float32", "bf16-mixed") else getattr(torch, mode)
    return device, dtype


def autocast(cfg: GRPOConfig, device: str) -> Any:
    """bf16 autocast for the forward pass under bf16-mixed; a no-op context otherwise."""
    import contextlib

    import torch

    if dtype_mode(cfg, device) != "bf16-mixed":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16)
