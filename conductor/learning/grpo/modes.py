"""The paper's two short fine-tune modes, as pure functions the rollout and training sides share.

* Randomized-pool fine-tuning (paper sec. 3.2/4.4): each question sees a random
  k-of-n sub-pool, listed as "Model 0..k-1". Every sample of one GRPO group must
  see the same sub-pool (one prompt per group), so the sub-pool is a function
  of (seed, question id), never of the sample index.
* Recursion fine-tuning (paper App. A.1): half of the samples of each group get
  one forced recursion round; the root round's reward is scaled by 0.25 when it
  is scored (``conductor.grading.reward.recursion_round_rewards`` fills
  ``Trajectory.round_rewards``) and advantages are normalised across rounds
  (``samples.build_samples``).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conductor.workers.pool import Pool, SubPool


def _seed(*parts: object) -> int:
    h = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "big")


@dataclass(frozen=True)
class RandomizedPoolConfig:
    """k is drawn uniformly from [k_min, k_max] per question (k_max None = the whole pool).

    >>> RandomizedPoolConfig(k_min=2, k_max=3, seed=7).k_for("q1", 5) in (2, 3)
    True
    """

    k_min: int = 1
    k_max: int | None = None
    seed: int = 0
    shuffle: bool = False      # also permute the order the workers are listed in

    def k_for(self, question_id: str, n_workers: int) -> int:
        hi = min(self.k_max or n_workers, n_workers)
        lo = max(1, min(self.k_min, hi))
        return random.Random(_seed(self.seed, "k", question_id)).randint(lo, hi)

    def subpool_for(self, pool: Pool, question_id: str) -> SubPool:
        """The sub-pool every sample of this question's group sees."""
        k = self.k_for(question_id, len(pool.workers))
        return pool.sample(k, seed=_seed(self.seed, "pool", question_id), shuffle=self.shuffle)


def forced_recursion_samples(question_ids: Iterable[str], group_size: int, seed: int = 0,
                             fraction: float = 0.5) -> dict[str, frozenset[int]]:
    """For each question, which sample indices get a forced recursion round (exactly round(fraction*G)).

    Choosing within each group keeps both kinds of sample in every group, so the
    rewards of root-only and recursive samples are normalised against each other.

    >>> m = forced_recursion_samples(["q1", "q2"], group_size=4, seed=0)
    >>> sorted(len(v) for v in m.values())
    [2, 2]
    >>> m == forced_recursion_samples(["q1", "q2"], group_size=4, seed=0)
    True
    """
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    n = round(fraction * group_size)
    return {q: frozenset(random.Random(_seed(seed, "rec", q)).sample(range(group_size), n))
            for q in question_ids}
