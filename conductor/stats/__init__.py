"""One home for the statistics that ``run/`` and ``learning/`` both read.

``headroom``: can this worker pool be won at all (pool-bound), or did the router fail (router-bound)? Per-worker
points, the random-mix line, the cross-fit routing oracle and the any-correct oracle, with bootstrap intervals
and paired tests. The paired tests themselves (``paired_bootstrap``, ``mcnemar_exact``) still live in
``conductor.learning.evaluation`` and are imported from there.
"""

from __future__ import annotations

from conductor.stats.headroom import (
    CrossFitRouter,
    HeadroomReport,
    OutcomeMatrix,
    PairedComparison,
    Point,
    PolicyOutcome,
    RandomMixLine,
    best_mix_at_cost,
    headroom_report,
)

__all__ = ["CrossFitRouter", "HeadroomReport", "OutcomeMatrix", "PairedComparison", "Point", "PolicyOutcome",
           "RandomMixLine", "best_mix_at_cost", "headroom_report"]
