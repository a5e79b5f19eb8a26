"""Group-normalised advantages (the paper's Eq. 2): A_i = (r_i - mean(r)) / (std(r) + eps).

A GRPO group is every sample for one question in one rollout run; samples are
compared only with their own group, so easy and hard questions contribute
equally. Infra-failed samples (reward ``None``) are not the conductor's fault:
they are left out of the group statistics and get no advantage.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Iterable, Sequence
from typing import Literal

Scale = Literal["group", "none"]


def group_advantages(rewards: Sequence[float | None], eps: float = 1e-4, scale: Scale = "group",
                     ddof: int = 1) -> list[float | None]:
    """Advantages for one group; ``None`` rewards stay ``None`` and do not count.

    ``ddof=1`` (sample std) matches TRL's GRPOTrainer, which the paper's authors used;
    ``scale="none"`` is Dr. GRPO (mean-centred only).

    >>> [round(a, 3) for a in group_advantages([1.0, 0.5, 0.0, 0.5])]
    [1.224, 0.0, -1.224, 0.0]
    >>> group_advantages([1.0, None, 0.0], scale="none")
    [0.5, None, -0.5]
    >>> group_advantages([0.5, 0.5])        # no contrast, no signal
    [0.0, 0.0]
    >>> group_advantages([1.0])             # a group of one teaches nothing
    [0.0]
    """
    valid = [r for r in rewards if r is not None]
    if not valid:
        return [None] * len(rewards)
    mean = sum(valid) / len(valid)
    if scale == "none":
        return [None if r is None else r - mean for r in rewards]
    n = len(valid)
    var = sum((r - mean) ** 2 for r in valid) / max(n - ddof, 1)
    std = math.sqrt(var)
    if std + eps == 0:
        return [None if r is None else 0.0 for r in rewards]
    return [None if r is None else (r - mean) / (std + eps) for r in rewards]


def grouped_advantages(items: Iterable[tuple[Hashable, Hashable, float | None]], eps: float = 1e-4,
                       scale: Scale = "group", ddof: int = 1) -> dict[Hashable, float | None]:
    """Advantages for ``(group_key, item_key, reward)`` triples, normalised within each group.

    >>> adv = grouped_advantages([("q1", "a", 1.0), ("q1", "b", 0.0), ("q2", "c", 0.5), ("q2", "d", None)])
    >>> round(adv["a"], 3), round(adv["b"], 3), adv["c"], adv["d"]
    (0.707, -0.707, 0.0, None)
    """
    groups: dict[Hashable, list[tuple[Hashable, float | None]]] = defaultdict(list)
    for g, k, r in items:
        groups[g].append((k, r))
    out: dict[Hashable, float | None] = {}
    for members in groups.values():
        advs = group_advantages([r for _, r in members], eps=eps, scale=scale, ddof=ddof)
        out.update({k: a for (k, _), a in zip(members, advs)})
    return out


def group_key(run_id: str, question_id: str) -> tuple[str, str]:
    """Groups are keyed by rollout run and question: one prompt, G samples."""
    return (run_id, question_id)


def trajectory_advantages(trajectories: Iterable, eps: float = 1e-4, scale: Scale = "group",
                          ddof: int = 1) -> dict[str, float | None]:
    """trajectory_id -> advantage, from each ``Trajectory.reward`` (infra-failed -> None)."""
    triples = []
    for t in trajectories:
        r = None if t.infra_failed else t.reward
        triples.append((group_key(t.run_id, t.question_id), t.trajectory_id, r))
    return grouped_advantages(triples, eps=eps, scale=scale, ddof=ddof)  # type: ignore[return-value]
