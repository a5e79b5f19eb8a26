"""What a GRPO update did with each rollout it was given, written back to the lake's rollout rows.

Data teams ask of every sample: was it trained on, with which advantage, by which policy was it sampled, and
if it was left out, why (infrastructure failure, a group whose members all scored the same, nothing to train
on). The update knows all of it; ``training_use`` (pure) recomputes it with the very function the trainer
uses (``build_samples``, same config), and ``record_update`` stores it in the run's rows (lake v3 columns
``policy_version``, ``advantage``, ``used_in_training``, ``unused_reason``) plus one JSON record per update
under ``<lake>/training/`` with its metrics (what ``conductor lake view``'s training page draws).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from conductor.learning.grpo.config import GRPOConfig
from conductor.learning.grpo.samples import build_samples
from conductor.trajectory import Trajectory, UnusedReason


@dataclass(frozen=True)
class TrainingUse:
    """One rollout row as the update saw it."""

    used: bool
    advantage: float | None
    reason: UnusedReason | None   # None when used

    def columns(self, policy_version: int | None) -> dict[str, Any]:
        return {"used_in_training": self.used, "advantage": self.advantage, "unused_reason": self.reason,
                "policy_version": policy_version}


def training_use(trajectories: Iterable[Trajectory], cfg: GRPOConfig) -> dict[str, TrainingUse]:
    """trajectory_id -> how the update used it (the root round's advantage; groups with no contrast unused).

    >>> from conductor.trajectory import Round
    >>> def t(i, q, r, infra=False):
    ...     return Trajectory(f"t{i}", "r", "rollout", q, "d", "math", "?", rounds=[Round(0, "p", "c")],
    ...                       reward=r, infra_failed=infra)
    >>> use = training_use([t(0, "a", 1.0), t(1, "a", 0.0), t(2, "b", 0.5), t(3, "b", 0.5), t(4, "b", None, True)],
    ...                    GRPOConfig())
    >>> use["t0"].used, round(use["t0"].advantage, 3), use["t2"].reason, use["t4"].reason
    (True, 0.707, 'zero_variance_group', 'infra_failed')
    """
    ts = list(trajectories)
    samples, _ = build_samples(ts, cfg.advantage_scale, cfg.advantage_eps, cfg.advantage_ddof, objective=cfg.objective)
    by_group: dict[tuple[str, str], list[float]] = {}
    root_adv: dict[str, float] = {}
    for s in samples:
        by_group.setdefault(s.group, []).append(s.advantage)
        if s.depth == 0 or s.trajectory_id not in root_adv:
            root_adv[s.trajectory_id] = s.advantage
    flat = {g for g, advs in by_group.items() if all(abs(a) < 1e-12 for a in advs)}
    out: dict[str, TrainingUse] = {}
    for t in ts:
        if t.infra_failed or t.reward is None:
            out[t.trajectory_id] = TrainingUse(False, None, "infra_failed")
        elif t.trajectory_id not in root_adv:
            out[t.trajectory_id] = TrainingUse(False, None, "no_completion")
        elif (t.run_id, t.question_id) in flat:
            out[t.trajectory_id] = TrainingUse(False, 0.0, "zero_variance_group")
        else:
            out[t.trajectory_id] = TrainingUse(True, root_adv[t.trajectory_id], None)
    return out


def record_update(lake: str, run_id: str, trajectories: Iterable[Trajectory] | None, cfg: GRPOConfig,
                  metrics: Mapping[str, Any], checkpoint_id: str) -> int:
    """Write the update's use of each rollout row into the lake, and its metrics record; returns rows set.
    ``trajectories``: the rows the update read (None: read the run's rollout rows from the lake).

    ``policy_version`` is the update's starting iteration (``metrics["iteration"] - 1``): the policy that
    sampled an on-policy rollout run. Rerunning it writes the same values (idempotent)."""
    from conductor.lake.writer import set_trajectory_values, write_training_record

    if trajectories is None:
        from conductor.lake.reader import load_trajectories

        trajectories = load_trajectories(lake, run_id, kind="rollout")
    ts = list(trajectories)
    iteration = int(metrics.get("iteration") or 0)
    version = max(iteration - 1, 0)
    use = training_use(ts, cfg)
    kinds = {t.kind for t in ts} or {"rollout"}
    n = 0
    for kind in sorted(kinds):
        n += set_trajectory_values(lake, kind, run_id, {tid: u.columns(version) for tid, u in use.items()})
    record = {"rollout_run": run_id, "checkpoint_id": checkpoint_id, "iteration": iteration,
              "policy_version": version, "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "n_used": sum(u.used for u in use.values()), "n_rows": len(use),
              "metrics": {k: v for k, v in metrics.items() if _jsonable(v)}}
    write_training_record(lake, run_id, record)
    return n


def _jsonable(v: Any) -> bool:
    """Metrics worth keeping in JSON: numbers (finite), text, and mappings of them (worker shares)."""
    if isinstance(v, float) and not math.isfinite(v):
        return False
    try:
        json.dumps(v, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True
