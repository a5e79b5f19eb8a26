"""The headroom check's statistics over questions: percentile bootstrap intervals with one set of resamples for
every point, and paired comparisons (``conductor.stats.paired``: paired bootstrap, exact McNemar)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from conductor.stats.headroom.model import DEFAULT_N_BOOT, PairedComparison
from conductor.stats.paired import mcnemar_exact, paired_bootstrap


def paired(candidate: str, cand: np.ndarray, baseline: str, base: np.ndarray, question_ids: Sequence[str],
           n_boot: int = DEFAULT_N_BOOT, seed: int = 0, binary: bool = True) -> PairedComparison:
    """Paired bootstrap (``conductor.stats.paired.paired_bootstrap``) and, for 0/1 scores, exact McNemar.

    >>> p = paired("x", np.array([1., 1, 1, 0]), "b", np.array([0., 0, 1, 0]), ["a", "b", "c", "d"], 500)
    >>> p.diff, p.mcnemar_b, p.mcnemar_c, round(p.p_mcnemar, 3)
    (0.5, 2, 0, 0.25)
    """
    bs = paired_bootstrap(dict(zip(question_ids, cand.tolist())), dict(zip(question_ids, base.tolist())),
                          n_boot=n_boot, seed=seed)
    if not binary:
        return PairedComparison(candidate, baseline, bs.n_questions, bs.diff, bs.ci_low, bs.ci_high, bs.p_value)
    nb = int(((cand > 0.5) & (base < 0.5)).sum())
    nc = int(((cand < 0.5) & (base > 0.5)).sum())
    one, two = mcnemar_exact(nb, nc)
    return PairedComparison(candidate, baseline, bs.n_questions, bs.diff, bs.ci_low, bs.ci_high, bs.p_value,
                            nb, nc, one, two)


def bootstrap_intervals(values: np.ndarray, n_boot: int = DEFAULT_N_BOOT, seed: int = 0,
                        level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Percentile intervals of the column means of ``values`` (questions x points), resampling questions
    (rows) with replacement; every column sees the same resamples. Resamples are drawn as multinomial counts,
    so memory stays (chunk x questions) however many points there are.

    >>> lo, hi = bootstrap_intervals(np.array([[1.0, 0.0], [1.0, 1.0]]), n_boot=200)
    >>> lo.tolist(), hi.tolist()
    ([1.0, 0.0], [1.0, 1.0])
    """
    values = np.asarray(values, dtype=float)
    n = values.shape[0]
    rng = np.random.default_rng(seed)
    means = np.empty((n_boot, values.shape[1]))
    chunk = max(1, 1_000_000 // max(n, 1))
    for start in range(0, n_boot, chunk):
        stop = min(n_boot, start + chunk)
        counts = rng.multinomial(n, np.full(n, 1.0 / n), size=stop - start)
        means[start:stop] = counts @ values / n
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(means, [tail, 100 - tail], axis=0)
    return lo, hi
