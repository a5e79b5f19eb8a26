"""The headroom check's data model: the input (``OutcomeMatrix``, ``PolicyOutcome``), the measured records
(``Point``, ``PairedComparison``, ``CrossFitRouter``) and the random-mix baseline (``RandomMixLine``,
``best_mix_at_cost``). Definitions: ``conductor/stats/headroom/__init__.py``."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, SupportsFloat

import numpy as np

Verdict = Literal["pool-bound", "router-bound"]

DEFAULT_FOLDS = 5
DEFAULT_MARGIN = 0.01      # one accuracy point
DEFAULT_ALPHA = 0.05
DEFAULT_N_BOOT = 2000


# ------------------------------------------------------------------ the input

@dataclass(frozen=True)
class OutcomeMatrix:
    """Every worker alone on the same questions: ``correct[q][w]`` (bool) and ``cost_usd[q][w]`` (dollars).

    Rows are questions (``question_ids``), columns workers (``workers``). ``texts`` (the question, or any
    feature string) and ``domains`` are optional, one per question; the cross-fit router reads only them.

    >>> m = OutcomeMatrix(["q1", "q2"], ["a", "b"], [[True, False], [True, True]], [[0.02, 0.01], [0.02, 0.01]])
    >>> m.n_questions, m.n_workers, m.accuracy.tolist(), m.dollars.tolist()
    (2, 2, [1.0, 0.5], [0.02, 0.01])
    >>> m.best_worker, m.cheapest_worker, m.any_correct.tolist()
    (0, 1, [True, True])
    >>> OutcomeMatrix(["q1"], ["a"], [[True]], [[-1.0]])
    Traceback (most recent call last):
    ...
    ValueError: outcome matrix: costs must be finite and >= 0
    """

    question_ids: tuple[str, ...]
    workers: tuple[str, ...]
    correct: np.ndarray            # bool, (n_questions, n_workers)
    cost_usd: np.ndarray           # float, (n_questions, n_workers)
    texts: tuple[str, ...] | None = None
    domains: tuple[str, ...] | None = None
    notes: tuple[str, ...] = ()    # what building the matrix left out (see ``from_rows``)

    def __post_init__(self) -> None:
        put = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen: normalise once, here)
        put("question_ids", tuple(str(q) for q in self.question_ids))
        put("workers", tuple(str(w) for w in self.workers))
        n, m = len(self.question_ids), len(self.workers)
        if n == 0 or m == 0:
            raise ValueError(f"outcome matrix: needs at least one question and one worker (got {n} x {m})")
        if len(set(self.question_ids)) != n:
            raise ValueError("outcome matrix: question ids repeat")
        if len(set(self.workers)) != m:
            raise ValueError("outcome matrix: worker names repeat")
        correct = np.asarray(self.correct)
        cost = np.asarray(self.cost_usd, dtype=float)
        if correct.shape != (n, m) or cost.shape != (n, m):
            raise ValueError(f"outcome matrix: correct {correct.shape} and cost_usd {cost.shape} must both be "
                             f"(questions, workers) = ({n}, {m})")
        if correct.dtype != bool and not np.isin(correct, (0, 1)).all():
            raise ValueError("outcome matrix: correct must be booleans")
        if not (np.isfinite(cost).all() and (cost >= 0).all()):
            raise ValueError("outcome matrix: costs must be finite and >= 0")
        correct, cost = correct.astype(bool), cost.copy()
        correct.setflags(write=False)
        cost.setflags(write=False)
        put("correct", correct)
        put("cost_usd", cost)
        for name in ("texts", "domains"):
            v = getattr(self, name)
            if v is not None:
                v = tuple("" if x is None else str(x) for x in v)
                if len(v) != n:
                    raise ValueError(f"outcome matrix: {len(v)} {name} for {n} questions")
                put(name, v)
        put("notes", tuple(self.notes))

    # -- derived views: one source of truth is the two arrays above --
    @property
    def n_questions(self) -> int:
        return len(self.question_ids)

    @property
    def n_workers(self) -> int:
        return len(self.workers)

    @property
    def accuracy(self) -> np.ndarray:
        """Per worker, the fraction of questions it gets right."""
        return self.correct.mean(axis=0)

    @property
    def dollars(self) -> np.ndarray:
        """Per worker, dollars per question."""
        return self.cost_usd.mean(axis=0)

    @property
    def best_worker(self) -> int:
        """The most accurate worker; ties go to the cheaper, then the first."""
        return int(min(range(self.n_workers), key=lambda w: (-_r(self.accuracy[w]), _r(self.dollars[w]), w)))

    @property
    def cheapest_worker(self) -> int:
        """The cheapest worker; ties go to the more accurate, then the first."""
        return int(min(range(self.n_workers), key=lambda w: (_r(self.dollars[w]), -_r(self.accuracy[w]), w)))

    @property
    def any_correct(self) -> np.ndarray:
        """Per question, whether some worker got it right."""
        return np.asarray(self.correct.any(axis=1))

    def sorted(self) -> OutcomeMatrix:
        """The same matrix with questions in id order (what every computation here starts from)."""
        order = sorted(range(self.n_questions), key=lambda i: self.question_ids[i])
        return self._take(order)

    def subset(self, question_ids: Iterable[str]) -> OutcomeMatrix:
        """Only these questions (in this matrix's order); unknown ids are ignored."""
        keep = set(question_ids)
        return self._take([i for i, q in enumerate(self.question_ids) if q in keep])

    def _take(self, idx: Sequence[int]) -> OutcomeMatrix:
        pick = lambda v: None if v is None else tuple(v[i] for i in idx)  # noqa: E731
        return OutcomeMatrix(pick(self.question_ids), self.workers, self.correct[list(idx)],  # type: ignore[arg-type]
                             self.cost_usd[list(idx)], pick(self.texts), pick(self.domains), self.notes)

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]]) -> OutcomeMatrix:
        """Build from one row per (question, worker) answer: ``question_id``, ``worker``, ``correct``,
        ``cost_usd`` and optionally ``question`` (text), ``domain``, ``sample_index``, ``infra_failed``.

        The lowest sample index of each (question, worker) is kept; a question that some worker did not
        answer, or answered with an infrastructure failure (``infra_failed`` or ``correct`` None), is left out,
        so every worker is scored on the same questions. What was left out is said in ``notes``.

        >>> rows = [dict(question_id="q1", worker="a", correct=True, cost_usd=0.1, domain="math"),
        ...         dict(question_id="q1", worker="b", correct=False, cost_usd=0.0),
        ...         dict(question_id="q2", worker="a", correct=None, cost_usd=0.0, infra_failed=True),
        ...         dict(question_id="q2", worker="b", correct=True, cost_usd=0.0)]
        >>> m = OutcomeMatrix.from_rows(rows)
        >>> m.question_ids, m.workers, m.correct.tolist(), m.domains
        (('q1',), ('a', 'b'), [[True, False]], ('math',))
        >>> m.notes
        ('left out 1 of 2 questions: 1 with an infrastructure failure, 0 not answered by every worker',)
        """
        cells: dict[tuple[str, str], tuple[int, Mapping[str, Any]]] = {}
        workers: dict[str, None] = {}      # insertion-ordered sets
        questions: dict[str, None] = {}
        repeats = 0
        for r in rows:
            q, w = str(r["question_id"]), str(r["worker"])
            workers.setdefault(w)
            questions.setdefault(q)
            s = int(r.get("sample_index") or 0)
            if (q, w) in cells:
                repeats += 1
                if s >= cells[(q, w)][0]:
                    continue
            cells[(q, w)] = (s, r)
        if not cells:
            raise ValueError("outcome matrix: no rows")
        failed = {q for (q, _), (_, r) in cells.items() if r.get("infra_failed") or r.get("correct") is None}
        missing = {q for q in questions if any((q, w) not in cells for w in workers)} - failed
        keep = [q for q in questions if q not in failed and q not in missing]
        notes = []
        if repeats:
            notes.append(f"kept the first sample of each (question, worker); {repeats} repeat rows ignored")
        if failed or missing:
            notes.append(f"left out {len(failed) + len(missing)} of {len(questions)} questions: {len(failed)} with "
                         f"an infrastructure failure, {len(missing)} not answered by every worker")
        if not keep:
            raise ValueError(f"outcome matrix: no question was scored for every worker ({notes[-1]})")

        def col(name: str) -> tuple[str, ...] | None:
            vals = [next((cells[(q, w)][1].get(name) for w in workers if cells[(q, w)][1].get(name)), None)
                    for q in keep]
            return None if all(v is None for v in vals) else tuple("" if v is None else str(v) for v in vals)

        correct = [[bool(cells[(q, w)][1]["correct"]) for w in workers] for q in keep]
        cost = [[float(cells[(q, w)][1].get("cost_usd") or 0.0) for w in workers] for q in keep]
        return cls(tuple(keep), tuple(workers), np.array(correct, dtype=bool), np.array(cost, dtype=float),
                   col("question"), col("domain"), tuple(notes))


@dataclass(frozen=True)
class PolicyOutcome:
    """A policy to place on the map (a trained conductor's run): per-question correctness and its dollars,
    either per question or one number per question on average."""

    label: str
    correct: Mapping[str, bool]
    cost_usd: float | Mapping[str, float] = 0.0


# ------------------------------------------------------------------ the output records

@dataclass(frozen=True)
class Point:
    """One strategy on the accuracy-dollars plane, with its bootstrap 95% interval over questions."""

    label: str
    accuracy: float
    ci_low: float
    ci_high: float
    dollars: float                  # per question
    n_questions: int

    @property
    def interval(self) -> tuple[float, float]:
        return (self.ci_low, self.ci_high)

    def fmt(self) -> str:
        """
        >>> Point("x", 0.5, 0.4, 0.6, 0.0012, 50).fmt()
        '50.0% [40.0, 60.0], $0.001200/q'
        """
        return f"{100 * self.accuracy:.1f}% [{100 * self.ci_low:.1f}, {100 * self.ci_high:.1f}], ${self.dollars:.6f}/q"


@dataclass(frozen=True)
class PairedComparison:
    """Candidate minus baseline on the same questions: paired bootstrap, and exact McNemar when both are 0/1."""

    candidate: str
    baseline: str
    n_questions: int
    diff: float                     # mean over questions, candidate - baseline
    ci_low: float                   # paired bootstrap 95% interval
    ci_high: float
    p_bootstrap: float              # one-sided: the candidate is better
    mcnemar_b: int | None = None    # candidate right, baseline wrong
    mcnemar_c: int | None = None    # candidate wrong, baseline right
    p_mcnemar: float | None = None  # exact, one-sided
    p_mcnemar_two_sided: float | None = None

    @property
    def p_value(self) -> float:
        """The larger one-sided p of the tests that apply: significant only if they agree."""
        return max(self.p_bootstrap, self.p_mcnemar if self.p_mcnemar is not None else 0.0)

    def significant(self, alpha: float = DEFAULT_ALPHA) -> bool:
        """
        >>> PairedComparison("x", "b", 40, 0.2, 0.05, 0.35, 0.01, 10, 2, 0.019, 0.039).significant()
        True
        >>> PairedComparison("x", "b", 40, 0.2, 0.05, 0.35, 0.01, 10, 5, 0.15, 0.3).significant()
        False
        """
        return self.diff > 0 and self.p_value < alpha

    def fmt(self) -> str:
        s = (f"{self.candidate} - {self.baseline}: {100 * self.diff:+.1f} points "
             f"[{100 * self.ci_low:+.1f}, {100 * self.ci_high:+.1f}], bootstrap p={self.p_bootstrap:.3g}")
        if self.p_mcnemar is not None:
            s += f"; McNemar b={self.mcnemar_b} c={self.mcnemar_c} p={self.p_mcnemar:.3g}"
        return s


@dataclass(frozen=True)
class RandomMixLine:
    """Mixing the cheapest worker and the most accurate one at random: a segment on the accuracy-dollars plane.

    >>> line = RandomMixLine("cheap", "best", 0.4, 0.001, 0.8, 0.011)
    >>> line.endpoints
    ((0.001, 0.4), (0.011, 0.8))
    >>> round(line.accuracy_at_cost(0.006), 6), line.accuracy_at_cost(0.05), line.accuracy_at_cost(0.0)
    (0.6, 0.8, nan)
    >>> RandomMixLine("a", "a", 0.7, 0.0, 0.7, 0.0).accuracy_at_cost(0.0)     # one worker is both: a point
    0.7
    """

    cheap: str
    best: str
    cheap_accuracy: float
    cheap_dollars: float
    best_accuracy: float
    best_dollars: float

    @property
    def endpoints(self) -> tuple[tuple[float, float], tuple[float, float]]:
        """((dollars, accuracy) of the cheapest worker, (dollars, accuracy) of the most accurate)."""
        return ((self.cheap_dollars, self.cheap_accuracy), (self.best_dollars, self.best_accuracy))

    def fraction_at_cost(self, dollars: float) -> float:
        """lambda, the share of questions sent to the best worker, that spends ``dollars`` per question
        (clipped to 1 above the best worker's cost; NaN below the cheapest's)."""
        if dollars < self.cheap_dollars - 1e-15:
            return math.nan
        span = self.best_dollars - self.cheap_dollars
        return 1.0 if span <= 1e-15 else min(1.0, (dollars - self.cheap_dollars) / span)

    def accuracy_at_fraction(self, lam: float) -> float:
        return (1 - lam) * self.cheap_accuracy + lam * self.best_accuracy

    def dollars_at_fraction(self, lam: float) -> float:
        return (1 - lam) * self.cheap_dollars + lam * self.best_dollars

    def accuracy_at_cost(self, dollars: float) -> float:
        lam = self.fraction_at_cost(dollars)
        return math.nan if math.isnan(lam) else self.accuracy_at_fraction(lam)


@dataclass(frozen=True)
class CrossFitRouter:
    """How the cross-fit oracle was fitted, and where it sent the questions."""

    learner: str                    # in words
    features: str                   # "text+domain", "text", "domain" or "none"
    folds: int
    seed: int
    cost_weight: float              # kappa: accuracy per dollar traded in the objective
    choices: dict[str, int] = field(default_factory=dict)   # worker -> questions routed to it


# ------------------------------------------------------------------ the random-mix baseline

def best_mix_at_cost(accuracy: Sequence[float], dollars: Sequence[float], budget: float) -> tuple[int, int, float]:
    """The most accurate random mix of at most two workers that spends at most ``budget`` per question:
    (i, j, lambda), lambda of the questions to j and the rest to i (i == j: one worker alone, lambda 0). Below
    every worker's cost, the cheapest worker alone. Ties: one worker before two, then lower indices.

    >>> acc, dol = [0.20, 0.57, 0.62], [0.00002, 0.00024, 0.00081]
    >>> i, j, lam = best_mix_at_cost(acc, dol, 0.0003); (i, j, round(lam, 4))   # not the cheapest/best line
    (1, 2, 0.1053)
    >>> best_mix_at_cost(acc, dol, 0.00024)         # the mid-priced worker alone
    (1, 1, 0.0)
    >>> best_mix_at_cost(acc, dol, 0.00001), best_mix_at_cost(acc, dol, 0.01)
    ((0, 0, 0.0), (2, 2, 0.0))
    """
    m = len(accuracy)
    eps = 1e-15
    cands: list[tuple[float, int, int, int, float]] = []
    for i in range(m):
        if dollars[i] <= budget + eps:
            cands.append((-_r(accuracy[i]), 0, i, i, 0.0))
        for j in range(m):
            if dollars[i] <= budget + eps < dollars[j]:
                lam = (budget - dollars[i]) / (dollars[j] - dollars[i])
                cands.append((-_r((1 - lam) * accuracy[i] + lam * accuracy[j]), 1, i, j, lam))
    if not cands:
        s = min(range(m), key=lambda w: (_r(dollars[w]), -_r(accuracy[w]), w))
        return s, s, 0.0
    _, _, i, j, lam = min(cands)
    return i, j, lam


def _mix_accuracy(accuracy: Sequence[float], mix: tuple[int, int, float]) -> float:
    i, j, lam = mix
    return (1 - lam) * accuracy[i] + lam * accuracy[j]


def _r(x: SupportsFloat) -> float:
    return round(float(x), 12)
