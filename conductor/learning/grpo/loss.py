"""The clipped GRPO objective (the paper's Eq. 1) on per-token log-probs.

Per completion token t of sample i, with ratio rho = exp(logp - logp_behaviour):

    l_it = -min(rho * A_i, clip(rho, 1 - eps_low, 1 + eps_high) * A_i) + beta * KL_it

where KL_it is the k3 estimator exp(ref - logp) - (ref - logp) - 1 against a
frozen reference (beta = 0 in the paper, so no reference model is loaded).
The behaviour log-probs are the ones stored with the rollout (the sampler's),
so the ratio corrects for any drift between sampling and training.

Aggregation over tokens (``GRPOConfig.loss_aggregation``):

* ``sequence-mean``: mean over each completion's tokens, then over completions
  (the original GRPO; long and short completions weigh the same);
* ``token-mean``: mean over all tokens of a micro-batch (TRL's "bnpo");
* ``dapo``: sum over all tokens of the whole update / their count (DAPO);
* ``dr-grpo``: sum / (completions x max completion tokens) (Dr. GRPO, no length bias).

Each function returns a micro-batch's *contribution* to the update's loss, so
summing contributions over micro-batches (gradient accumulation) equals the
loss of the whole update computed at once. torch is imported by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass
class TokenLoss:
    loss: torch.Tensor          # (B, T) per-token loss
    ratio: torch.Tensor         # (B, T)
    clipped: torch.Tensor       # (B, T) bool: the clipped branch was active
    kl: torch.Tensor | None     # (B, T) k3 estimate, when a reference is given


def clipped_token_loss(logp: torch.Tensor, behaviour_logp: torch.Tensor, advantages: torch.Tensor,
                       eps_low: float = 0.2, eps_high: float = 0.2, ref_logp: torch.Tensor | None = None,
                       beta: float = 0.0) -> TokenLoss:
    """Per-token clipped surrogate (to minimise). ``advantages`` has shape (B,)."""
    import torch

    ratio = torch.exp(logp - behaviour_logp)
    adv = advantages.unsqueeze(-1)
    unclipped = ratio * adv
    clipped_ratio = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    clipped = clipped_ratio * adv
    loss = -torch.min(unclipped, clipped)
    kl = None
    if ref_logp is not None and beta > 0:
        d = ref_logp - logp
        kl = torch.exp(d) - d - 1
        loss = loss + beta * kl
    return TokenLoss(loss, ratio, (clipped < unclipped), kl)


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, *, n_seqs_total: int,
              n_tokens_total: int, n_micro: int, max_len: int) -> torch.Tensor:
    """This micro-batch's share of the update's loss (see the module docstring)."""
    m = mask.to(per_token.dtype)
    if mode == "sequence-mean":
        per_seq = (per_token * m).sum(-1) / m.sum(-1).clamp(min=1)
        return per_seq.sum() / max(n_seqs_total, 1)
    if mode == "token-mean":
        return (per_token * m).sum() / m.sum().clamp(min=1) / max(n_micro, 1)
    if mode == "dapo":
        return (per_token * m).sum() / max(n_tokens_total, 1)
    if mode == "dr-grpo":
        return (per_token * m).sum() / max(n_seqs_total * max_len, 1)
    raise ValueError(f"loss_aggregation: unknown mode {mode!r}")


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    m = mask.to(x.dtype)
    return float((x * m).sum() / m.sum().clamp(min=1))


def loss_stats(tl: TokenLoss, mask: torch.Tensor, logp: torch.Tensor, behaviour_logp: torch.Tensor,
               ref_logp: torch.Tensor | None = None) -> dict[str, Any]:
    """Monitoring: clip fraction, mean ratio, approximate KL(behaviour || current), and KL(current || reference)
    (k3) when reference log-probs are given (the penalty's own estimate when beta > 0)."""
    d = logp - behaviour_logp          # k3 estimate of KL(behaviour || current) from behaviour samples
    kl_ref = None
    if tl.kl is not None:
        kl_ref = masked_mean(tl.kl.detach(), mask)
    elif ref_logp is not None:
        r = (ref_logp - logp).detach()
        kl_ref = masked_mean(r.exp() - r - 1, mask)
    return {"clip_fraction": masked_mean(tl.clipped.float(), mask), "ratio_mean": masked_mean(tl.ratio.detach(), mask),
            "approx_kl": masked_mean((d.exp() - 1 - d).detach(), mask), "kl_ref": kl_ref}
