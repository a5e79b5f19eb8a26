"""RouteLLM's router metrics: PGR, APGR and CPT over a strong/weak pair, from per-question outcomes.

Definitions (Ong et al., "RouteLLM", arXiv 2406.18665, Sec. 3.2; computed as in their ``evals/benchmarks.py``
and ``evals/evaluate.py``). A router scores each question with the probability it should go to the strong
model; sending the questions above a threshold gives a point (call fraction c, accuracy r(c)):

    PGR(c)  = (r(c) - r_weak) / (r_strong - r_weak)           performance gap recovered
    APGR    = area under PGR over c in [0, 1] (trapezoids on the 11 decile points 0, 0.1, ..., 1)
    CPT(x)  = the smallest strong-call fraction whose PGR reaches x (linear between grid points)

The repository cuts thresholds at the deciles of the router's own scores; ranking the questions by score and
sending the top ``round(c * n)`` to the strong model is the same cut, and breaks ties (a router that scores
every question alike) in a seeded random order, so a constant router is a random one. A random router's
expected PGR(c) is c, so its APGR is 0.5 (RouteLLM reports 0.497 +/- 0.01 on GSM8K, Table 3).

>>> strong = [True, True, True, True, False]; weak = [True, False, True, False, False]
>>> perfect = [0.0, 1.0, 0.0, 1.0, 0.5]      # sends exactly the questions only the strong model gets right
>>> curve = route_curve(perfect, strong, weak)
>>> round(apgr(curve), 3), cpt(curve, 0.5), round(random_apgr(strong, weak), 1)
(0.8, 0.2, 0.5)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

GRID = tuple(i / 10 for i in range(11))


@dataclass(frozen=True)
class RouteCurve:
    """Accuracy and dollars at each strong-call fraction, with the two ends for PGR."""

    fractions: tuple[float, ...]
    accuracy: tuple[float, ...]
    dollars: tuple[float, ...]
    strong_accuracy: float
    weak_accuracy: float

    @property
    def pgr(self) -> tuple[float, ...]:
        gap = self.strong_accuracy - self.weak_accuracy
        if abs(gap) < 1e-12:
            return tuple(0.0 for _ in self.accuracy)
        return tuple((a - self.weak_accuracy) / gap for a in self.accuracy)


def route_curve(scores: Sequence[float] | np.ndarray, strong_correct: Sequence[bool], weak_correct: Sequence[bool],
                strong_cost: Sequence[float] | None = None, weak_cost: Sequence[float] | None = None,
                grid: Sequence[float] = GRID, seed: int = 0) -> RouteCurve:
    """The router's curve: for each fraction c, the top ``round(c * n)`` questions by score go to the strong model.

    >>> c = route_curve([0.9, 0.1], [True, True], [False, True], [1.0, 1.0], [0.0, 0.0], grid=(0, 0.5, 1))
    >>> c.accuracy, c.dollars, c.pgr
    ((0.5, 1.0, 1.0), (0.0, 0.5, 1.0), (0.0, 1.0, 1.0))
    """
    n = len(scores)
    if n == 0 or len(strong_correct) != n or len(weak_correct) != n:
        raise ValueError("route_curve: scores and both correctness lists must be non-empty and of one length")
    s = np.asarray(strong_correct, dtype=float)
    w = np.asarray(weak_correct, dtype=float)
    sc = np.asarray(strong_cost if strong_cost is not None else np.zeros(n), dtype=float)
    wc = np.asarray(weak_cost if weak_cost is not None else np.zeros(n), dtype=float)
    tiebreak = np.random.default_rng(seed).permutation(n)
    order = np.lexsort((tiebreak, -np.asarray(scores, dtype=float)))    # highest score first, ties seeded
    acc, dollars = [], []
    for c in grid:
        to_strong = np.zeros(n, dtype=bool)
        to_strong[order[: int(round(c * n))]] = True
        acc.append(float(np.where(to_strong, s, w).mean()))
        dollars.append(float(np.where(to_strong, sc, wc).mean()))
    return RouteCurve(tuple(float(c) for c in grid), tuple(acc), tuple(dollars), float(s.mean()), float(w.mean()))


def apgr(curve: RouteCurve) -> float:
    """Average PGR: the trapezoid area under PGR over the call fractions, divided by their range.

    >>> apgr(RouteCurve((0, 0.5, 1), (0.0, 0.5, 1.0), (0, 0, 0), 1.0, 0.0))
    0.5
    """
    x = np.asarray(curve.fractions)
    y = np.asarray(curve.pgr)
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2) / (x[-1] - x[0]))


def cpt(curve: RouteCurve, target: float) -> float | None:
    """The smallest strong-call fraction whose PGR reaches ``target`` (linear between grid points); None if never.

    >>> cpt(RouteCurve((0, 0.5, 1), (0.0, 0.5, 1.0), (0, 0, 0), 1.0, 0.0), 0.8)
    0.8
    >>> cpt(RouteCurve((0, 1), (0.0, 0.4), (0, 0), 1.0, 0.0), 0.5) is None
    True
    """
    x, y = curve.fractions, curve.pgr
    if y[0] >= target:
        return float(x[0])
    for i in range(1, len(x)):
        if y[i] >= target:
            t = (target - y[i - 1]) / (y[i] - y[i - 1])
            return round(float(x[i - 1] + t * (x[i] - x[i - 1])), 10)
    return None


def random_apgr(strong_correct: Sequence[bool], weak_correct: Sequence[bool], repeats: int = 200, seed: int = 0) -> float:
    """The mean APGR of routers that score questions at random (about 0.5; RouteLLM's "random" row).

    >>> round(random_apgr([True, True, False, True] * 25, [False, True, False, False] * 25), 1)
    0.5
    """
    rng = np.random.default_rng(seed)
    n = len(strong_correct)
    return float(np.mean([apgr(route_curve(rng.random(n), strong_correct, weak_correct, seed=int(rng.integers(1 << 30))))
                          for _ in range(repeats)]))
