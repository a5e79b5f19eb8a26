"""The GRPO update of one iteration: shuffled optimizer steps over the encoded samples, each accumulating its
micro-batches' gradients, and the sums that become the iteration's metrics.

Every micro-batch adds to a named ``UpdateSums`` record; the statistics in it are token-weighted (a
micro-batch's mean times its token count), so dividing by ``tokens`` gives the iteration's mean. Sharded, one
step's record is summed over the ranks before it is used, so every rank reports the same figures.
torch is imported inside the functions.
"""

from __future__ import annotations

import random
import time
from dataclasses import astuple, dataclass, field, fields
from typing import Any, Protocol

from conductor.learning.grpo.batching import Encoded, make_batch, micro_batches
from conductor.learning.grpo.checkpoint import TrainError
from conductor.learning.grpo.config import GRPOConfig, lr_at
from conductor.learning.grpo.logprobs import completion_logprobs
from conductor.learning.grpo.precision import autocast
from conductor.learning.grpo.samples import Sample, SampleStats


class Trainable(Protocol):
    """What the update needs from a trainer (``conductor.learning.grpo.trainer.PolicyTrainer``)."""

    cfg: GRPOConfig
    model: Any
    optimizer: Any
    tokenizer: Any
    device: str
    sharded: bool
    global_step: int
    iteration: int

    def ref_logprobs(self, batch: dict[str, Any]) -> Any: ...

    def assigned(self, chunks: list[list[Encoded]], share: bool) -> list[tuple[int, bool]]: ...


@dataclass
class UpdateSums:
    """Sums over micro-batches (one optimizer step), then over steps (one iteration).

    >>> s = UpdateSums(loss=0.5, tokens=4); s += UpdateSums(loss=0.25, tokens=2); (s.loss, s.tokens)
    (0.75, 6)
    """

    loss: float = 0.0             # the micro-batches' loss contributions
    clip_fraction: float = 0.0    # token-weighted
    ratio_mean: float = 0.0       # token-weighted
    approx_kl: float = 0.0        # token-weighted KL(behaviour || current)
    kl_ref: float = 0.0           # token-weighted KL(current || reference); 0 when not measured
    entropy: float = 0.0          # summed over tokens
    tokens: float = 0.0           # completion tokens with a gradient
    non_finite: float = 0.0       # micro-batches whose loss was inf/nan (sharded: raised after the sum)

    def __iadd__(self, other: UpdateSums) -> UpdateSums:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def over_ranks(self) -> UpdateSums:
        """Every field summed over the ``torchrun`` ranks. Collective."""
        from conductor.learning.grpo.distributed import sum_over_ranks

        return UpdateSums(*sum_over_ranks(list(astuple(self))))


@dataclass
class UpdateResult:
    """One iteration's update: the summed record plus every optimizer step's gradient norm and learning rate."""

    sums: UpdateSums = field(default_factory=UpdateSums)
    grad_norms: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)


def run_update(trainer: Trainable, enc: list[Encoded], share: bool) -> UpdateResult:
    """``epochs`` passes over the samples in a seeded shuffled order, each split into ``optimizer_steps_per_batch``
    optimizer steps."""
    cfg = trainer.cfg
    rng = random.Random(cfg.seed * 1_000_003 + trainer.iteration)
    result = UpdateResult()
    for _epoch in range(cfg.epochs):
        order = list(range(len(enc)))
        rng.shuffle(order)
        k = cfg.optimizer_steps_per_batch
        for part in range(k):
            group = [enc[i] for i in order[part::k]]
            if group:
                optimizer_step(trainer, group, share, result)
    return result


def optimizer_step(trainer: Trainable, group: list[Encoded], share: bool, result: UpdateResult) -> None:
    """Accumulate the gradients of ``group``'s micro-batches, clip, step; adds the step's figures to ``result``."""
    import torch

    cfg = trainer.cfg
    n_seqs = len(group)
    n_tokens = sum(sum(e.trained()) for e in group)
    # A zero advantage gives exactly zero gradient when beta = 0: skip its forward pass,
    # but keep it in the normalisers so the loss equals the full-batch loss.
    active = [e for e in group if e.advantage != 0 or cfg.kl_beta > 0]
    chunks = micro_batches(active, cfg.micro_batch_size, share)
    n_micro = max(1, len(chunks))
    lr = lr_at(trainer.global_step, cfg)
    for g in trainer.optimizer.param_groups:
        g["lr"] = lr
    trainer.optimizer.zero_grad(set_to_none=True)
    sums = UpdateSums()
    for ci, real in trainer.assigned(chunks, share):
        sums += micro_batch_step(trainer, chunks[ci], real, share, n_seqs=n_seqs, n_tokens=n_tokens, n_micro=n_micro)
    if trainer.sharded:
        sums = sums.over_ranks()
        if sums.non_finite:
            raise TrainError(f"non-finite loss at global step {trainer.global_step} (check lr and dtype)")
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else float("inf")
    gn = torch.nn.utils.clip_grad_norm_(params, max_norm)    # DTensor grads: the global norm
    result.grad_norms.append(float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn))
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.global_step += 1
    result.lrs.append(lr)
    result.sums += sums


def micro_batch_step(trainer: Trainable, chunk: list[Encoded], real: bool, share: bool, *, n_seqs: int,
                     n_tokens: int, n_micro: int) -> UpdateSums:
    """Forward and backward of one micro-batch; its sums. ``real=False``: a padding copy (sharded ranks short
    of micro-batches) that makes the same collective calls with zero gradient and adds nothing."""
    import torch

    from conductor.learning.grpo.loss import aggregate, clipped_token_loss, loss_stats

    cfg, device = trainer.cfg, trainer.device
    b = make_batch(chunk, trainer.tokenizer.pad_token_id, device, share)
    with autocast(cfg, device):
        logp, ent = completion_logprobs(trainer.model, b, cfg.temperature, with_entropy=True)
    mask = b["loss_mask"]
    beh = torch.zeros_like(logp)
    for j, e in enumerate(chunk):
        if e.behaviour is None:             # filled in (recomputed) before any micro-batch runs
            raise ValueError("micro_batch_step: a sample without behaviour log-probs")
        beh[j, : len(e.behaviour)] = torch.tensor(e.behaviour, dtype=logp.dtype, device=logp.device)
    adv = torch.tensor([e.advantage for e in chunk], dtype=logp.dtype, device=logp.device)
    with autocast(cfg, device):
        ref = trainer.ref_logprobs(b) if (cfg.kl_beta > 0 or cfg.track_kl) else None
    tl = clipped_token_loss(logp, beh, adv, cfg.clip_eps_low, cfg.clip_eps_high, ref, cfg.kl_beta)
    loss = aggregate(tl.loss, mask, cfg.loss_aggregation, n_seqs_total=n_seqs, n_tokens_total=n_tokens,
                     n_micro=n_micro, max_len=cfg.max_completion_tokens)
    sums = UpdateSums()
    if not real:
        (loss * 0.0).backward()
        return sums
    if not torch.isfinite(loss):
        if not trainer.sharded:
            raise TrainError(f"non-finite loss at global step {trainer.global_step} (check lr and dtype)")
        sums.non_finite = 1        # raised on every rank once summed, before the optimizer step
    loss.backward()
    st = loss_stats(tl, mask, logp.detach(), beh, ref)
    ntok = int(mask.sum())
    sums.loss = float(loss.detach())
    sums.tokens = ntok
    sums.clip_fraction = st["clip_fraction"] * ntok
    sums.ratio_mean = st["ratio_mean"] * ntok
    sums.approx_kl = st["approx_kl"] * ntok
    sums.kl_ref = (st["kl_ref"] or 0.0) * ntok
    sums.entropy = float((ent * mask).sum())
    return sums


def iteration_metrics(trainer: Trainable, result: UpdateResult, trajectories: list[Any], samples: list[Sample],
                      stats: SampleStats, enc: list[Encoded], n_recomputed: int, t0: float) -> dict[str, Any]:
    """The metrics of one iteration (logged, kept in the lineage's history, returned by ``step``)."""
    from conductor.learning.grpo.tracking import rollout_metrics

    cfg, s = trainer.cfg, result.sums
    n_tok = int(s.tokens)
    n_updates = max(1, len(result.lrs))
    rewards = [x.reward for x in samples]
    reward_mean = sum(rewards) / len(rewards)
    metrics = {
        "iteration": trainer.iteration, "global_step": trainer.global_step,
        "loss": s.loss / n_updates,
        "reward_mean": reward_mean,
        "reward_std": (sum((r - reward_mean) ** 2 for r in rewards) / len(rewards)) ** 0.5,
        "accuracy": (sum(1 for t in trajectories if t.correct) /
                     max(1, sum(1 for t in trajectories if t.reward is not None and not t.infra_failed))),
        "advantage_abs_mean": sum(abs(x.advantage) for x in samples) / len(samples),
        "clip_fraction": s.clip_fraction / max(n_tok, 1),
        "ratio_mean": s.ratio_mean / max(n_tok, 1) if n_tok else 1.0,
        "approx_kl": s.approx_kl / max(n_tok, 1),
        # KL(current || starting policy), k3 estimate over the tokens of the samples with a gradient
        "kl_ref": s.kl_ref / n_tok if (cfg.kl_beta > 0 or cfg.track_kl) and n_tok else None,
        "entropy": s.entropy / n_tok if n_tok else None,
        "grad_norm": sum(result.grad_norms) / max(1, len(result.grad_norms)),
        "lr": result.lrs[-1] if result.lrs else None,
        "n_trajectories": stats.n_trajectories, "n_samples": stats.n_samples, "n_groups": stats.n_groups,
        "n_zero_advantage_groups": stats.n_zero_advantage_groups, "n_infra_failed": stats.n_infra_failed,
        "n_recomputed_behaviour": n_recomputed, "n_tokens": sum(len(e.completion_ids) for e in enc),
        "n_choice_tokens": sum(sum(e.trained()) for e in enc),    # what the loss sees (a grammar's choices)
        "time_s": round(time.time() - t0, 3),
    }
    roll = rollout_metrics(trajectories)
    for key in ("parse_rate", "worker_share", "calls_per_trajectory", "cache_hit_rate", "steps_per_workflow",
                "call_seconds", "rollout_s"):
        metrics[key] = roll[key]
    return metrics
