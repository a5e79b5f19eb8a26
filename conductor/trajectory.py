"""The one record that flows end to end: conductor output -> execution -> reward -> Parquet row.

A ``Trajectory`` is one sampled workflow for one question (one member of a GRPO
group). Its ``rounds`` hold the root conductor round (depth 0) and any recursion
rounds; its ``calls`` hold every worker call with depth and parent so the call
tree can be rebuilt. The lake stores exactly these fields (see docs/schema.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["rollout", "eval", "answer", "served"]
ParseStatus = Literal["ok", "parse_error", "invalid", "not_run"]
# Why a GRPO update left a rollout out (conductor/learning/grpo/usage.py): no fair reward, nothing to train on,
# or a group whose scored members all have the same reward (no gradient).
UnusedReason = Literal["infra_failed", "no_completion", "zero_variance_group"]
# How a worker call failed: the provider's classification (conductor/workers/providers/base.py raises these), or
# "budget" for a step not run under the dollar budget. Rows read back from the lake carry the same strings.
ErrorKind = Literal["rate_limited", "timeout", "server", "malformed", "auth", "permanent", "budget", "missing_key",
                    "cache_miss"]


def trajectory_id(run_id: str, question_id: str, sample_index: int, salt: str = "") -> str:
    """Stable id, so reruns of the same shard line up and replace rows, never duplicate them.

    >>> trajectory_id("r1", "gsm8k/test/0", 3) == trajectory_id("r1", "gsm8k/test/0", 3)
    True
    """
    key = f"{run_id}\x1f{question_id}\x1f{sample_index}\x1f{salt}".encode()
    return hashlib.sha256(key).hexdigest()[:24]


@dataclass
class CallRecord:
    """One worker call (or, for recursion, the conductor called again)."""

    call_id: str                  # "{depth}.{step}" within the trajectory
    parent_call_id: str | None    # the call whose round spawned this one (None at depth 0)
    depth: int                    # recursion round, 0 = root workflow
    step: int                     # position in that round's workflow
    worker_index: int             # ordinal the conductor used ("Model i")
    worker: str                   # real worker name from the pool manifest
    provider: str
    model: str
    subtask: str
    access: list[int] = field(default_factory=list)   # resolved indices of visible steps
    access_all: bool = False
    messages_hash: str = ""
    response: str = ""
    finish_reason: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0
    cache_hit: bool = False
    retries: int = 0
    error: str | None = None         # redacted message
    error_kind: ErrorKind | None = None
    # Seeded faults the pool manifest applied to this call (conductor/workers/faults.py), ";"-joined, with the
    # planted value where useful: "wrong_answer:41", "rewrite_step:12->13", "inject", "fail:timeout". None: clean.
    fault: str | None = None


@dataclass
class Round:
    """One conductor round: the prompt it saw, what it wrote, and how that parsed."""

    depth: int
    prompt: str
    completion: str
    completion_token_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    parse_status: ParseStatus = "not_run"
    parse_error: str | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)   # Step.to_json() each
    final_answer: str | None = None
    kept_previous: bool = False      # recursion round answered with three empty lists


@dataclass
class Trajectory:
    trajectory_id: str
    run_id: str
    kind: Kind
    question_id: str
    dataset: str
    domain: str
    question: str
    sample_index: int = 0
    date: str = ""                     # YYYY-MM-DD of the run, a partition key
    checkpoint_id: str = ""
    pool_id: str = ""
    subpool: list[str] = field(default_factory=list)   # worker names in the order shown (Model 0..k-1)
    gold: str | None = None
    rounds: list[Round] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)
    final_answer: str | None = None
    extracted_answer: str | None = None
    correct: bool | None = None
    reward: float | None = None
    round_rewards: list[float] | None = None   # recursion fine-tuning: per-round reward
    infra_failed: bool = False
    infra_cause: str | None = None
    wall_s: float = 0.0
    conductor_s: float = 0.0   # conductor generation: this trajectory's share of the batched call that wrote it
    shard: str = ""
    # -- the training signal, written back by the GRPO update that consumed a rollout run (lake v3) --
    policy_version: int | None = None      # training iteration of the policy that sampled it (0 = untrained base)
    advantage: float | None = None         # the root round's group-normalised advantage used in the update
    used_in_training: bool | None = None   # None: no update has consumed this row (yet)
    unused_reason: UnusedReason | None = None   # None when used, or when no update has consumed it

    # -- derived views: one source of truth is the rounds and calls above --
    @property
    def root(self) -> Round | None:
        return self.rounds[0] if self.rounds else None

    @property
    def parse_status(self) -> ParseStatus:
        return self.rounds[0].parse_status if self.rounds else "not_run"

    @property
    def n_calls(self) -> int:
        return len(self.calls)

    @property
    def n_cache_hits(self) -> int:
        return sum(1 for c in self.calls if c.cache_hit)

    @property
    def input_tokens(self) -> int:
        return sum(c.input_tokens for c in self.calls)

    @property
    def output_tokens(self) -> int:
        return sum(c.output_tokens for c in self.calls)

    @property
    def cost_usd(self) -> float:
        return sum(c.cost_usd for c in self.calls)

    @property
    def recursion_depth(self) -> int:
        return max((r.depth for r in self.rounds), default=0)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (the Parquet row, before the lake adds derived columns)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["rounds"] = [Round(**{k: v for k, v in r.items() if k in _ROUND_FIELDS}) for r in d.get("rounds") or []]
        kw["calls"] = [CallRecord(**{k: v for k, v in c.items() if k in _CALL_FIELDS}) for c in d.get("calls") or []]
        return cls(**kw)


_ROUND_FIELDS = {f.name for f in dataclasses.fields(Round)}
_CALL_FIELDS = {f.name for f in dataclasses.fields(CallRecord)}
