"""Tokens and dollars per call, per workflow and per run, from the manifest's price table.

Every call records its *nominal* cost (its tokens at the worker's price), cached
or not, so budgets and reports do not change when a shard is replayed from the
cache; ``spent_usd`` counts only calls that actually reached a provider.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conductor.trajectory import CallRecord, Trajectory
    from conductor.workers.pool import Worker


BATCH_DISCOUNT = 0.5   # OpenAI Batch, Anthropic Message Batches and Gemini batch mode all bill half the list price


def call_cost(worker: Worker, input_tokens: int, output_tokens: int, *, cached_input_tokens: int = 0,
              batch: bool = False, seconds: float = 0.0) -> float:
    """Dollars for one call of ``worker``: its tokens at the token prices, plus ``seconds`` of wall time at
    ``per_second`` (local compute, priced as the machine it runs on costs: docs/workflow-replay.md).

    ``cached_input_tokens`` (a part of ``input_tokens``) are billed at ``cached_input_per_mtok`` (default: the
    input price); ``batch`` bills at the batch prices (default: half the list prices), prompt-cache reads at the
    cached price scaled by the same batch ratio as input.

    >>> from conductor.workers.pool import Worker, Price
    >>> w = Worker(name="w", provider="openai", model="m", price=Price(input_per_mtok=2, output_per_mtok=8))
    >>> call_cost(w, 1000, 500)
    0.006
    >>> call_cost(w, 1000, 500, batch=True)
    0.003
    >>> c = Worker(name="c", provider="openai", model="m",
    ...            price=Price(input_per_mtok=2, output_per_mtok=8, cached_input_per_mtok=0.5))
    >>> call_cost(c, 1000, 500, cached_input_tokens=400), call_cost(c, 1000, 500, cached_input_tokens=400, batch=True)
    (0.0054, 0.0027)
    >>> local = Worker(name="l", provider="local", model="m", price=Price(per_second=0.0001))
    >>> call_cost(local, 500, 200, seconds=12.5)
    0.00125
    """
    p = worker.price
    compute = round(max(seconds, 0.0) * p.per_second, 10) if p.per_second else 0.0
    if not cached_input_tokens and not batch:
        return round(p.cost(input_tokens, output_tokens) + compute, 10)
    in_rate, out_rate = p.input_per_mtok, p.output_per_mtok
    cached_rate = p.cached_input_per_mtok if p.cached_input_per_mtok is not None else in_rate
    if batch:
        b_in = p.batch_input_per_mtok if p.batch_input_per_mtok is not None else in_rate * BATCH_DISCOUNT
        b_out = p.batch_output_per_mtok if p.batch_output_per_mtok is not None else out_rate * BATCH_DISCOUNT
        cached_rate *= (b_in / in_rate) if in_rate else BATCH_DISCOUNT
        in_rate, out_rate = b_in, b_out
    cached = min(max(cached_input_tokens, 0), input_tokens)
    dollars = (input_tokens - cached) * in_rate + cached * cached_rate + output_tokens * out_rate
    return round(dollars / 1e6 + compute, 10)


@dataclass
class CostSummary:
    calls: int = 0
    cache_hits: int = 0
    failed_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0     # nominal: what these calls cost at list price
    spent_usd: float = 0.0    # paid in this run: excludes cache hits
    workflows: int = 0
    by_worker: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def usd_per_workflow(self) -> float:
        return self.cost_usd / self.workflows if self.workflows else 0.0

    def add(self, c: CallRecord) -> None:
        self.calls += 1
        self.cache_hits += int(c.cache_hit)
        self.failed_calls += int(c.error is not None)
        self.input_tokens += c.input_tokens
        self.output_tokens += c.output_tokens
        self.cost_usd += c.cost_usd
        self.spent_usd += 0.0 if c.cache_hit else c.cost_usd
        w = self.by_worker.setdefault(c.worker, defaultdict(float))
        w["calls"] += 1
        w["input_tokens"] += c.input_tokens
        w["output_tokens"] += c.output_tokens
        w["cost_usd"] += c.cost_usd


def summarize_calls(calls: Iterable[CallRecord]) -> CostSummary:
    """Totals over calls (one workflow's, or any selection).

    >>> from conductor.trajectory import CallRecord
    >>> c = CallRecord("0.0", None, 0, 0, 0, "w", "openai", "m", "t", input_tokens=10, output_tokens=5, cost_usd=0.5)
    >>> s = summarize_calls([c, c]); (s.calls, s.input_tokens, s.cost_usd)
    (2, 20, 1.0)
    """
    s = CostSummary()
    for c in calls:
        s.add(c)
    s.by_worker = {k: dict(v) for k, v in s.by_worker.items()}
    return s


def summarize_run(trajectories: Iterable[Trajectory]) -> CostSummary:
    """Totals for a run; ``usd_per_workflow`` divides by the trajectories seen."""
    s = CostSummary()
    for t in trajectories:
        s.workflows += 1
        for c in t.calls:
            s.add(c)
    s.by_worker = {k: dict(v) for k, v in s.by_worker.items()}
    return s
