"""Typed GRPO hyperparameters with the paper's defaults (arXiv 2512.04388, App. A.1).

Paper setting: Qwen2.5-7B, 200 iterations x (4 questions x 64 rollouts), AdamW
(0.9, 0.999), lr 1e-6 with cosine decay and 3% warm-up, clip 0.2, no KL, 1,024
completion tokens, sampled at temperature 1.0, bf16 on 2 x H100 (full fine-tuning: sharded with FSDP2,
``distributed="fsdp"``, launched with ``torchrun``). ``GRPOConfig.cpu()``
is the setting that makes a 135M conductor learn in minutes on two cores: the
same objective with a larger learning rate and a short schedule (see docs/learning.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from conductor.grading.objective import CostObjective

LossAggregation = Literal["sequence-mean", "token-mean", "dapo", "dr-grpo"]


class GRPOConfigError(ValueError):
    """A config that cannot be used; one line naming the field."""


class GRPOConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # optimiser and schedule (paper App. A.1)
    learning_rate: float = Field(1e-6, gt=0)
    lr_schedule: Literal["cosine", "constant"] = "cosine"
    warmup_ratio: float = Field(0.03, ge=0, lt=1)
    total_iterations: int = Field(200, ge=1)          # the schedule's length in GRPO iterations
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float | None = Field(1.0, gt=0)
    # objective
    clip_eps_low: float = Field(0.2, gt=0, lt=1)       # the paper's "eps = 0.2"
    clip_eps_high: float = Field(0.2, gt=0)            # DAPO's clip-higher uses 0.28
    kl_beta: float = Field(0.0, ge=0)                  # paper: no KL, no reference model
    track_kl: bool = False                             # monitor KL to the starting policy even when beta = 0
                                                       # (loads a frozen reference: free with LoRA, a model copy else)
    loss_aggregation: LossAggregation = "sequence-mean"
    max_completion_tokens: int = Field(1024, gt=0)     # also the dr-grpo normaliser
    advantage_scale: Literal["group", "none"] = "group"
    advantage_eps: float = Field(1e-4, gt=0)
    advantage_ddof: int = Field(1, ge=0, le=1)
    temperature: float = Field(1.0, gt=0)              # sampling temperature: logits are divided by it
    # the reward GRPO normalises: the paper's accuracy reward, or (cost_lambda > 0) the success-gated cost-aware
    # objective of conductor/grading/objective.py; the lake keeps reward and cost_usd apart either way
    objective: CostObjective = CostObjective()
    # batching
    micro_batch_size: int = Field(4, ge=1)
    optimizer_steps_per_batch: int = Field(1, ge=1)    # split one rollout batch into this many updates
    epochs: int = Field(1, ge=1)                       # passes over the batch (GRPO's mu)
    max_prompt_tokens: int = Field(4096, gt=0)         # longer prompts are left-truncated
    share_prompt_forward: bool = True                  # a group's G samples share one prompt forward pass (exact;
                                                       # off automatically with gradient checkpointing)
    # model
    # auto: bf16-mixed on GPU (fp32 weights and AdamW state, bf16 autocast forward), float32 on CPU.
    # Pure bfloat16 weights lose lr-1e-6 updates to rounding: use it only with LoRA (adapters stay fp32).
    dtype: Literal["auto", "float32", "bf16-mixed", "bfloat16", "float16"] = "auto"
    device: str = "auto"
    gradient_checkpointing: bool = False
    lora_r: int = Field(0, ge=0)                       # 0 = full fine-tuning
    lora_alpha: int = Field(32, ge=1)
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    lora_target_modules: str | list[str] = "all-linear"
    lora_merge_on_save: bool = True                    # save a plain HF checkpoint a generator can load
    # fsdp: shard weights, gradients and AdamW state over the processes of a `torchrun` launch (FSDP2,
    # conductor/learning/grpo/distributed.py); in one process (WORLD_SIZE unset or 1) it is exactly "none".
    distributed: Literal["none", "fsdp"] = "none"
    # bookkeeping
    seed: int = 0
    save_optimizer: bool = True                        # keep AdamW moments across steps (needed for lr 1e-6)

    @field_validator("distributed")
    @classmethod
    def _sharding_is_for_full_fine_tuning(cls, v: str, info: ValidationInfo) -> str:
        if v == "fsdp" and info.data.get("lora_r", 0) > 0:
            raise ValueError("fsdp shards full fine-tuning; LoRA (lora_r > 0) trains on one GPU: "
                             "set distributed: none or lora_r: 0")
        return v

    @classmethod
    def paper(cls, **overrides: Any) -> GRPOConfig:
        """The paper's optimisation setting on GPU: full fine-tuning in bf16 mixed precision with gradient
        checkpointing, sharded over the GPUs of a ``torchrun`` launch (FSDP2).

        >>> GRPOConfig.paper().distributed, GRPOConfig.paper(lora_r=64, distributed="none").lora_r
        ('fsdp', 64)
        """
        return cls(**{**_PAPER, **overrides})

    @classmethod
    def cpu(cls, **overrides: Any) -> GRPOConfig:
        """The CPU setting for SmolLM2-135M: fp32, small micro-batches, a short schedule, a larger lr.

        >>> GRPOConfig.cpu().dtype, GRPOConfig.cpu(total_iterations=5).total_iterations
        ('float32', 5)
        """
        return cls(**{**_CPU, **overrides})

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<config>") -> GRPOConfig:
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            err = e.errors()[0]
            msg = str(err["msg"]).removeprefix("Value error, ")
            raise GRPOConfigError(f"{source}: {'.'.join(map(str, err['loc']))}: {msg}") from None

    @classmethod
    def load(cls, path: str | Path) -> GRPOConfig:
        """Read JSON or YAML; errors name the file and field."""
        import yaml

        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as e:
            raise GRPOConfigError(f"{p}: cannot read config: {e}") from None
        if not isinstance(data, dict):
            raise GRPOConfigError(f"{p}: a GRPO config is a mapping of field: value")
        preset = data.pop("preset", None)
        if preset is not None and preset not in _PRESETS:
            raise GRPOConfigError(f"{p}: preset: must be one of {sorted(k for k in _PRESETS if k)}, not {preset!r}")
        return cls.from_dict({**_PRESETS.get(preset, {}), **data}, str(p))

    def to_json(self) -> dict[str, Any]:
        return json.loads(self.model_dump_json())


_PAPER = dict(micro_batch_size=8, gradient_checkpointing=True, dtype="bf16-mixed", device="cuda", distributed="fsdp")
_CPU = dict(learning_rate=1e-5, total_iterations=30, warmup_ratio=0.03, micro_batch_size=4,
            dtype="float32", device="cpu", max_completion_tokens=256, max_prompt_tokens=2048)
_PRESETS: dict[str | None, dict[str, Any]] = {"paper": _PAPER, "cpu": _CPU}


def lr_at(step: int, cfg: GRPOConfig) -> float:
    """Learning rate for optimiser step ``step`` (0-based): linear warm-up, then cosine to min_lr.

    >>> c = GRPOConfig(learning_rate=1.0, total_iterations=100, warmup_ratio=0.1)
    >>> [round(lr_at(s, c), 3) for s in (0, 9, 10, 99)]
    [0.1, 1.0, 1.0, 0.0]
    """
    import math

    total = cfg.total_iterations * cfg.optimizer_steps_per_batch * cfg.epochs
    warm = math.ceil(cfg.warmup_ratio * total)
    if step < warm:
        return cfg.learning_rate * (step + 1) / warm
    if cfg.lr_schedule == "constant":
        return cfg.learning_rate
    progress = min(1.0, (step - warm) / max(1, total - warm - 1))
    cos = 0.5 * (1 + math.cos(math.pi * progress))
    return cfg.learning_rate * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cos)
