"""The generation protocol, the policy-backend extension point: prompts in, n sampled completions out.

Backends (``conductor/policy/``: vLLM offline batch, transformers, llama.cpp, any OpenAI-compatible
endpoint) apply the chat template themselves and return token ids and
log-probs when they can, because GRPO needs the behaviour log-probs.

A leaf at the top of the package (it imports nothing of the project): the policy backends implement it, and
the executor's recursion rounds and the conductor-as-a-worker provider call it without importing ``policy/``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class Generation:
    text: str
    token_ids: list[int] | None = None      # completion tokens only
    logprobs: list[float] | None = None     # one per completion token, under the sampling policy
    finish_reason: str | None = None        # "stop" | "length"
    prompt_token_ids: list[int] | None = None
    # Seconds the generation took when it was made; set on a generation read back from the response cache
    # (conductor/policy/cached.py), so a replayed run's conductor time is the recorded one.
    seconds: float | None = None


@dataclass(frozen=True)
class GenerationParams:
    temperature: float = 1.0       # the paper samples GRPO groups at T = 1.0
    max_tokens: int = 1024         # the paper's conductor completion limit
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    logprobs: bool = True
    grammar: str | None = None     # GBNF constraint (conductor.decoding.grammar); honoured by every backend
    n_workers: int | None = None   # how many workers the prompts list: a checkpoint's decoding contract needs it


class PolicyBackend(Protocol):
    @property
    def name(self) -> str: ...        # read-only: a wrapper (CachedPolicy) reports its inner backend's

    def generate(self, prompts: list[str], n: int, params: GenerationParams) -> list[list[Generation]]:
        """For each prompt (a user message), n independent samples."""
        ...

    def close(self) -> None:  # pragma: no cover - optional
        ...
