"""Samples -> token ids -> padded micro-batch tensors.

Prompts are rendered exactly as the transformers policy backend renders them, so the stored completion token
ids line up with the prompt they were sampled from. torch is imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from conductor.learning.grpo.config import GRPOConfig
from conductor.learning.grpo.samples import Sample


class ChatTokenizer(Protocol):
    """What GRPO needs of a tokenizer (a transformers tokenizer is one): the chat template, and text to ids."""

    def apply_chat_template(self, conversation: list[dict[str, str]], *, add_generation_prompt: bool,
                            tokenize: bool) -> str: ...

    def __call__(self, text: str, *, add_special_tokens: bool) -> Mapping[str, Any]: ...


@dataclass
class Encoded:
    """One sample as token ids, with its behaviour log-probs (None: to be recomputed) and advantage."""

    prompt_ids: list[int]
    completion_ids: list[int]
    behaviour: list[float] | None
    advantage: float
    reward: float
    choice: list[bool] | None = None    # per completion token: a grammar choice (None: every token is one)

    def trained(self) -> list[bool]:
        """Which completion tokens the loss sees: the grammar's choices (forced tokens carry no decision)."""
        return list(self.choice) if self.choice is not None else [True] * len(self.completion_ids)


def render_prompt(tokenizer: ChatTokenizer, prompt: str, system_prompt: str | None = None) -> list[int]:
    """Prompt token ids exactly as the transformers policy backend builds them (chat template, no extra specials)."""
    messages = [{"role": "user", "content": prompt}]
    if system_prompt:
        messages.insert(0, {"role": "system", "content": system_prompt})
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode(tokenizer: ChatTokenizer, s: Sample, cfg: GRPOConfig, system_prompt: str | None = None) -> Encoded:
    """A sample truncated to the configured prompt and completion lengths; the stored ids when there are any."""
    p = render_prompt(tokenizer, s.prompt, system_prompt)[-cfg.max_prompt_tokens:]
    if s.completion_token_ids:
        c = list(s.completion_token_ids)
    else:     # no stored ids: re-tokenise the text (no EOS is added: the stop reason is unknown)
        c = list(tokenizer(s.completion, add_special_tokens=False)["input_ids"])
    c = c[: cfg.max_completion_tokens]
    b = s.behaviour_logprobs
    behaviour = list(b[: len(c)]) if b and len(b) >= len(c) and s.completion_token_ids else None
    return Encoded(p, c, behaviour, s.advantage, s.reward)


def same_prompt(items: list[Encoded]) -> bool:
    """More than one item, all with the same prompt (the samples of one GRPO group)."""
    return len(items) > 1 and all(e.prompt_ids == items[0].prompt_ids for e in items)


def make_batch(items: list[Encoded], pad_id: int, device: str, share_prompt: bool = False) -> dict[str, Any]:
    """Tensors for a micro-batch.

    Normal layout: prompts left-padded and completions right-padded, so every
    completion starts at the same column. Shared layout (all items have the same
    prompt, as the samples of one GRPO group do): the prompt once, completions
    right-padded; the prompt is then run once for the whole micro-batch.
    """
    import torch

    C = max(len(e.completion_ids) for e in items)
    comp = torch.tensor([e.completion_ids + [pad_id] * (C - len(e.completion_ids)) for e in items], device=device)
    cmask = torch.tensor([[1] * len(e.completion_ids) + [0] * (C - len(e.completion_ids)) for e in items],
                         device=device, dtype=torch.bool)
    # the tokens the loss sees (attention still sees every completion token): the grammar's choices
    lmask = torch.tensor([e.trained() + [False] * (C - len(e.completion_ids)) for e in items],
                         device=device, dtype=torch.bool)
    if share_prompt and same_prompt(items):
        return {"prompt_ids": torch.tensor([items[0].prompt_ids], device=device), "completion_ids": comp,
                "completion_mask": cmask, "loss_mask": lmask, "P": len(items[0].prompt_ids), "C": C, "shared": True}
    P = max(len(e.prompt_ids) for e in items)
    ids, att = [], []
    for e in items:
        lp, lc = len(e.prompt_ids), len(e.completion_ids)
        ids.append([pad_id] * (P - lp) + e.prompt_ids + e.completion_ids + [pad_id] * (C - lc))
        att.append([0] * (P - lp) + [1] * (lp + lc) + [0] * (C - lc))
    input_ids = torch.tensor(ids, device=device)
    attention = torch.tensor(att, device=device)
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": input_ids, "attention_mask": attention, "position_ids": position_ids,
            "completion_ids": comp, "completion_mask": cmask, "loss_mask": lmask, "P": P, "C": C, "shared": False}


def model_calls(items: list[Encoded], share: bool) -> int:
    """How many forward calls ``completion_logprobs`` makes for this micro-batch (the shared layout: two)."""
    return 2 if share and same_prompt(items) and max(len(e.completion_ids) for e in items) > 1 else 1


def micro_batches(items: list[Encoded], size: int, share: bool) -> list[list[Encoded]]:
    """Micro-batches of at most ``size``; with ``share``, each holds one prompt (one GRPO group's samples)."""
    if not share:
        return [items[i:i + size] for i in range(0, len(items), size)]
    by_prompt: dict[tuple[int, ...], list[Encoded]] = {}
    for e in items:
        by_prompt.setdefault(tuple(e.prompt_ids), []).append(e)
    return [g[i:i + size] for g in by_prompt.values() for i in range(0, len(g), size)]
