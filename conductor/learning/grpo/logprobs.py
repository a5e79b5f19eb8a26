"""Per-token log-probs (and entropy) of completion tokens under a model, temperature-scaled as the sampler was.

From TRL: ``selective_log_softmax`` (memory-efficient log_softmax + gather). The shared-prompt layout runs a
GRPO group's common prompt once and reuses its KV cache for every completion. torch/trl are imported inside.
"""

from __future__ import annotations

from typing import Any


def completion_logprobs(model: Any, batch: dict[str, Any], temperature: float, with_entropy: bool = False) -> Any:
    """Per-token log-probs of the completion tokens, (B, C), under logits / temperature; with ``with_entropy``
    also the per-token entropy of that distribution (no gradient), as ``(logp, entropy)``.
    ``batch`` comes from ``conductor.learning.grpo.batching.make_batch``."""
    from trl.trainer.utils import selective_log_softmax, selective_log_softmax_and_entropy

    C = batch["C"]
    if batch.get("shared"):
        logits = _shared_prompt_logits(model, batch)
    else:
        kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                      position_ids=batch["position_ids"], use_cache=False)
        try:
            logits = model(**kwargs, logits_to_keep=C + 1).logits      # only the positions that predict the completion
        except TypeError:
            logits = model(**kwargs).logits[:, -(C + 1):]
        logits = logits[:, :C]
    if with_entropy:
        return selective_log_softmax_and_entropy(logits.float(), batch["completion_ids"], entropy_requires_grad=False,
                                                 temperature=temperature)
    return selective_log_softmax(logits.float(), batch["completion_ids"], temperature=temperature)


def _shared_prompt_logits(model: Any, batch: dict[str, Any]) -> Any:
    """Run the shared prompt once, repeat its KV cache over the batch, then run the completions.

    Gradients flow back through the cache into the single prompt pass, so this is
    the same loss and gradient as the padded layout (tested) at a fraction of the
    cost when prompts are long (few-shot conductor prompts are ~1k tokens).
    """
    import torch

    comp, cmask, P, C = batch["completion_ids"], batch["completion_mask"], batch["P"], batch["C"]
    B = comp.shape[0]
    out = model(input_ids=batch["prompt_ids"], use_cache=True, logits_to_keep=1)
    first = out.logits[:, -1:].expand(B, 1, out.logits.shape[-1])
    if C == 1:
        return first
    cache = out.past_key_values
    cache.batch_repeat_interleave(B)
    att = torch.cat([torch.ones(B, P, dtype=torch.long, device=comp.device), cmask[:, :-1].long()], dim=1)
    pos = torch.arange(P, P + C - 1, device=comp.device).unsqueeze(0).expand(B, -1)
    rest = model(input_ids=comp[:, :-1], attention_mask=att, position_ids=pos, past_key_values=cache, use_cache=True)
    return torch.cat([first, rest.logits], dim=1)
