"""The cost-aware objective: the accuracy reward, discounted by dollars only when the answer is right.

The lake keeps the two ingredients apart, ``reward`` (the paper's accuracy reward: 1 right, 0.5
well-formed but wrong, 0 unparseable) and ``cost_usd`` (the trajectory's dollars over all worker
calls), so any objective can be recomputed from stored rows; this module is the one GRPO trains on
when ``GRPOConfig.objective.cost_lambda > 0`` (off by default: the paper's reward unchanged).

**Success-gated, scale-free**, after xRouter (Qian et al. 2025, arXiv 2510.08439; as implemented in
SalesforceAIResearch/xRouter, ``R = s * (K - min(lambda * C, c_max))`` with s the task score, C the
call dollars, K = 1): the cost penalty applies only to successful trajectories, so the policy is never
paid for failing cheaply. Ours normalises the dollars first, so lambda means the same on any pool
(Router-R1, arXiv 2506.09033, normalises by percentiles of recent costs for the same reason)::

    c_hat = cost / c_ref                          normalised cost (scale-free)
    r'    = r * (1 - min(lambda * c_hat, cap))    if the answer is correct
    r'    = r                                     otherwise (wrong or unparseable)

``c_ref`` is either a fixed dollar figure (``cost_ref_usd``, e.g. the strongest worker's price per
question) or, by default, the most expensive *correct* member of the question's GRPO group: then
``c_hat`` is in [0, 1] whatever the pool's price level (a group that pays $3 or $0.003 learns the same),
and the cheapest correct workflow of a group earns the most. ``cap < correct - wrong`` keeps every
right answer above every wrong one (checked), so the penalty can reorder right answers by price but
never make a wrong answer preferable: lambda trades dollars against accuracy only among successes.

>>> obj = CostObjective(cost_lambda=0.3)
>>> obj.reward(1.0, True, cost=0.006, ref=0.006), obj.reward(1.0, True, cost=0.0002, ref=0.006)
(0.7, 0.99)
>>> obj.reward(0.5, False, cost=0.006, ref=0.006), CostObjective().reward(1.0, True, 9.0, 0.1)
(0.5, 1.0)
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: the paper's reward for a well-formed wrong answer and a right one (conductor.grading.reward.PAPER)
_WRONG, _RIGHT = 0.5, 1.0


class CostObjective(BaseModel):
    """``correct x (1 - min(lambda x cost / c_ref, cap))``; ``cost_lambda = 0`` is the paper's reward."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    cost_lambda: float = Field(0.0, ge=0)
    cap: float = Field(0.4, ge=0, lt=1)
    cost_ref_usd: float | None = Field(None, gt=0)   # None: the group's most expensive correct member

    @model_validator(mode="after")
    def _right_stays_above_wrong(self) -> CostObjective:
        if self.cap >= _RIGHT - _WRONG:
            raise ValueError(f"cap ({self.cap:g}) must stay below {_RIGHT - _WRONG:g} (right minus wrong reward), "
                             "or a cheap wrong answer would outscore an expensive right one")
        return self

    @property
    def active(self) -> bool:
        return self.cost_lambda > 0

    def penalty(self, cost: float, ref: float) -> float:
        """The fraction taken off a right answer's reward.

        >>> o = CostObjective(cost_lambda=2.0)
        >>> o.penalty(0.5, 1.0), o.penalty(0.1, 1.0), o.penalty(0.0, 0.0), o.penalty(1.0, 0.0)
        (0.4, 0.2, 0.0, 0.4)
        """
        if cost <= 0:
            return 0.0
        c_hat = cost / ref if ref > 0 else float("inf")
        return min(self.cost_lambda * c_hat, self.cap)

    def reward(self, reward: float, correct: bool | None, cost: float, ref: float) -> float:
        """The objective of one trajectory (or recursion round) from its accuracy reward and dollars."""
        if not correct or not self.active:
            return reward
        return round(reward * (1.0 - self.penalty(cost, ref)), 10)

    def group_ref(self, members: Iterable[tuple[bool | None, float]]) -> float:
        """``c_ref`` of one GRPO group from its (correct, cost) members.

        >>> CostObjective(cost_lambda=1).group_ref([(True, 0.2), (False, 0.9), (True, 0.05)])
        0.2
        >>> CostObjective(cost_lambda=1, cost_ref_usd=0.01).group_ref([(True, 0.2)])
        0.01
        >>> CostObjective(cost_lambda=1).group_ref([(False, 0.3)])
        0.0
        """
        if self.cost_ref_usd is not None:
            return self.cost_ref_usd
        return max((c for ok, c in members if ok), default=0.0)


def with_objective(rows: list[dict], objective: CostObjective) -> list[dict]:
    """Lake rows (``reward``, ``correct``, ``cost_usd``) with ``reward`` replaced by the objective, against one
    reference cost for all of them (the most expensive right row, or ``cost_ref_usd``): how an evaluation
    compares a candidate and a champion on the objective they were trained for.

    >>> rows = [{"reward": 1.0, "correct": True, "cost_usd": 0.01}, {"reward": 1.0, "correct": True, "cost_usd": 0.0},
    ...         {"reward": 0.5, "correct": False, "cost_usd": 0.01}, {"reward": None, "correct": None, "cost_usd": 0}]
    >>> [r["reward"] for r in with_objective(rows, CostObjective(cost_lambda=0.2))]
    [0.8, 1.0, 0.5, None]
    """
    if not objective.active:
        return rows
    ref = objective.group_ref((r.get("correct"), float(r.get("cost_usd") or 0.0)) for r in rows)
    return [{**r, "reward": None if r.get("reward") is None else
             objective.reward(float(r["reward"]), r.get("correct"), float(r.get("cost_usd") or 0.0), ref)}
            for r in rows]
