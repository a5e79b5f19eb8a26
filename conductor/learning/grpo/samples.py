"""Trajectories -> GRPO training samples (one per conductor round), with their advantages.

A normal rollout gives one sample per trajectory: its root round, rewarded with
``Trajectory.reward``. A trajectory with recursion rounds carries
``round_rewards`` (written when it is scored, ``conductor.grading.reward``, with the
root round already discounted by the paper's 0.25) and each round becomes its
own sample; all rounds of a question are normalised together ("rewards are
normalised across rounds", paper App. A.1). Infra-failed trajectories, and
rounds whose grading failed (round reward None), are left out: the conductor
is not to blame.

With a cost-aware objective (``conductor.grading.objective``, ``GRPOConfig.objective``) each reward is
first turned into its objective value: a right trajectory's reward (every round of it) is discounted by
its dollars relative to the group's reference cost; wrong ones keep theirs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from conductor.grading.objective import CostObjective
from conductor.learning.grpo.advantages import Scale, group_key, grouped_advantages

if TYPE_CHECKING:
    from conductor.trajectory import Trajectory


@dataclass
class Sample:
    """One conductor completion to train on."""

    trajectory_id: str
    depth: int
    group: tuple[str, str]
    prompt: str
    completion: str
    reward: float
    advantage: float = 0.0
    completion_token_ids: list[int] | None = None
    behaviour_logprobs: list[float] | None = None
    extra: dict = field(default_factory=dict)
    n_workers: int | None = None            # the sub-pool the prompt lists (a decoding contract's grammar needs it)


@dataclass
class SampleStats:
    n_trajectories: int = 0
    n_infra_failed: int = 0
    n_no_completion: int = 0
    n_samples: int = 0
    n_groups: int = 0
    n_zero_advantage_groups: int = 0


def build_samples(trajectories: Iterable[Trajectory], scale: Scale = "group", eps: float = 1e-4, ddof: int = 1,
                  objective: CostObjective | None = None) -> tuple[list[Sample], SampleStats]:
    """Turn trajectories into samples with group-normalised advantages.

    >>> from conductor.trajectory import Trajectory, Round
    >>> ts = [Trajectory(trajectory_id=f"t{i}", run_id="r", kind="rollout", question_id="q", dataset="d",
    ...                  domain="math", question="?", rounds=[Round(0, "p", "c")], reward=r)
    ...       for i, r in enumerate([1.0, 0.0, None])]
    >>> ts[2].infra_failed = True
    >>> samples, stats = build_samples(ts)
    >>> [(s.trajectory_id, round(s.advantage, 2)) for s in samples], stats.n_infra_failed
    ([('t0', 0.71), ('t1', -0.71)], 1)

    With a cost objective, two right answers of different price get different rewards:

    >>> from conductor.trajectory import CallRecord
    >>> for t, cost in zip(ts, (0.006, 0.0002)):
    ...     t.reward, t.correct = 1.0, True
    ...     t.calls = [CallRecord("0.0", None, 0, 0, 0, "w", "replay", "m", "s", cost_usd=cost)]
    >>> samples, _ = build_samples(ts, objective=CostObjective(cost_lambda=0.3))
    >>> [(s.trajectory_id, s.reward) for s in samples]
    [('t0', 0.7), ('t1', 0.99)]
    """
    stats = SampleStats()
    samples: list[Sample] = []
    trajectories = list(trajectories)
    factor = _objective_factors(trajectories, objective) if objective is not None and objective.active else {}
    for t in trajectories:
        stats.n_trajectories += 1
        if t.infra_failed or t.reward is None:
            stats.n_infra_failed += 1
            continue
        rounds = sorted(t.rounds, key=lambda r: r.depth)
        if not rounds or not rounds[0].completion:
            stats.n_no_completion += 1
            continue
        g = group_key(t.run_id, t.question_id)
        if t.round_rewards and len(rounds) > 1:
            pairs = list(zip(rounds, t.round_rewards))
        else:
            pairs = [(rounds[0], float(t.reward))]
        for rnd, rew in pairs:
            if rew is None or (not rnd.completion and not rnd.completion_token_ids):
                continue
            rew = round(float(rew) * factor.get(t.trajectory_id, 1.0), 10)
            samples.append(Sample(t.trajectory_id, rnd.depth, g, rnd.prompt, rnd.completion, rew,
                                  completion_token_ids=rnd.completion_token_ids,
                                  behaviour_logprobs=rnd.completion_logprobs, n_workers=len(t.subpool) or None))
    adv = grouped_advantages(((s.group, (s.trajectory_id, s.depth), s.reward) for s in samples),
                             eps=eps, scale=scale, ddof=ddof)
    for s in samples:
        s.advantage = float(adv[(s.trajectory_id, s.depth)] or 0.0)
    groups: dict[tuple[str, str], list[float]] = {}
    for s in samples:
        groups.setdefault(s.group, []).append(s.advantage)
    stats.n_samples = len(samples)
    stats.n_groups = len(groups)
    stats.n_zero_advantage_groups = sum(1 for a in groups.values() if all(abs(x) < 1e-12 for x in a))
    return samples, stats


def _objective_factors(trajectories: list[Trajectory], objective: CostObjective) -> dict[str, float]:
    """Per right trajectory, the factor ``1 - penalty`` its rewards are multiplied by (group-relative cost)."""
    groups: dict[tuple[str, str], list] = {}
    for t in trajectories:
        if not t.infra_failed and t.reward is not None:
            groups.setdefault(group_key(t.run_id, t.question_id), []).append(t)
    out: dict[str, float] = {}
    for members in groups.values():
        ref = objective.group_ref((t.correct, t.cost_usd) for t in members)
        for t in members:
            if t.correct:
                out[t.trajectory_id] = 1.0 - objective.penalty(t.cost_usd, ref)
    return out
