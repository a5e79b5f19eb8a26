r"""The headroom check: can this pool be won at all (pool-bound), or did the router fail (router-bound)?

Input: an ``OutcomeMatrix`` of every worker alone on the same questions, y[q, w] in {0, 1} (right or wrong)
and c[q, w] >= 0 (dollars), n questions, m workers, optionally each question's text and domain. Every point
below is (accuracy, bootstrap 95% interval over questions, dollars per question):

* **worker w alone**: acc_w = (1/n) sum_q y[q, w], $_w = (1/n) sum_q c[q, w].
  The best single worker b maximises acc_w (ties: cheaper, then first); the cheapest s minimises $_w
  (ties: more accurate, then first). b is picked in hindsight on the same questions, which biases it up a
  little and so makes a "router-bound" verdict conservative.
* **random-mix line** between s and b: send each question to b with probability lambda, else to s. Both
  coordinates are linear in lambda: acc(lambda) = (1 - lambda) acc_s + lambda acc_b and
  $(lambda) = (1 - lambda) $_s + lambda $_b, so at a cost x in [$_s, $_b] the line reads
  lambda(x) = (x - $_s) / ($_b - $_s); above $_b it stays at acc_b, below $_s it does not exist (NaN).
  This is what mixing without looking at the question buys (LLMRouterBench's Random baseline, made
  cost-aware). The cost-matched baseline the verdict uses is the best such mix of *any* two workers (or one
  worker alone) that spends at most x: the upper envelope of the workers' points (``best_mix_at_cost``), which
  contains the line above. Comparing a router only with the cheapest/best line would credit it for beating a
  line that some mid-priced worker already beats alone.
* **cross-fit routing oracle** X: questions are split into K folds (a permutation seeded by ``seed`` of the
  question ids in sorted order); for each fold f a router is fitted on the other K - 1 folds and picks, for
  each held-out question, w_X(q) = argmax_w  p^(q, w) - kappa c^(q, w)  (kappa: ``cost_weight``, accuracy
  per dollar, default 0; ties: lower expected cost, then lower index). acc_X = (1/n) sum_q y[q, w_X(q)].
  The learner (``CrossFitRouter``, numpy only) shrinks a kNN estimate towards a per-domain estimate, which
  shrinks towards the training accuracy:

      p_all(w) = mean over training questions of y[., w]
      p_dom(q, w) = (sum_{j in train, dom j = dom q} y[j, w] + beta p_all(w)) / (n_dom + beta)
      p^(q, w) = (sum_{j in N_k(q)} s_qj y[j, w] + alpha p_dom(q, w)) / (sum_{j in N_k(q)} s_qj + alpha)

  with N_k(q) the k training questions most cosine-similar to q over IDF-weighted hashed word features
  (``hashed_features``), s_qj = max(cosine, 0), k = 10, alpha = 1, beta = 2; c^ is the per-domain mean cost,
  shrunk the same way. Without text the kNN term drops out (per-domain best worker); without domains too,
  X is the cross-fit best single worker. Fitting on other questions is what keeps X honest: the in-sample
  argmax over noisy outcomes (the winner's curse that TinyRouter's diagnostic warns of) would count luck
  as routable. acc_X is what a router that sees only the question could achieve -- a lower bound, since a
  better learner might predict more.
* **any-correct oracle** A: per question the cheapest correct worker, or the cheapest worker when none is
  right (LLMRouterBench's Oracle). acc_A = (1/n) sum_q max_w y[q, w] >= acc_w for every w and >= acc_X;
  $_A = (1/n) sum_q c[q, w_A(q)]. Not reachable by any router: it reads the answers.

Intervals resample questions with replacement (``n_boot`` draws, percentile 2.5..97.5, the same seeded
resamples for every point). Paired tests on the same questions reuse ``conductor.stats.paired``:
``paired_bootstrap`` (diff, 95% interval, one-sided p) and, for 0/1 outcomes, ``mcnemar_exact`` on
b = #(candidate right, baseline wrong), c = #(candidate wrong, baseline right).

**Verdict** (margin: ``margin``, default 1 point; alpha: ``alpha``, default 0.05; "significantly": diff > 0
and one-sided p < alpha on every paired test that applies):

1. *pool-bound* when the any-correct oracle's gain over b is within noise: its paired interval's lower bound
   <= margin. Even a clairvoyant router could not win here: change the pool.
2. *pool-bound* when X is significantly above neither b nor the best random mix at X's own cost: the pool's
   complementarity exists in hindsight but is not predictable from the question.
3. *router-bound* otherwise: X beats b (or the best random mix at equal cost) significantly, so a router could win,
   and a policy that does not is the problem. An optional ``PolicyOutcome`` (a trained conductor's run) is
   placed between b and X: captured = (acc_P - acc_b) / (acc_X - acc_b), NaN when acc_X <= acc_b (no
   headroom to capture; TinyRouter's ``router_gap_closed`` contract).

References: TinyRouter's oracle-ceiling diagnostic (github.com/philluiz2323/Gittensor-TinyRouter,
docs/ORACLE_CEILING_DIAGNOSTIC.md): the cross-fit oracle as the honest routing ceiling, the "solved by any"
oracle shown separately as not routing-achievable, bootstrap intervals over queries, McNemar and paired
bootstrap against the best single model, a verdict read off intervals, the captured-headroom ratio.
LLMRouterBench (Li et al., 2026, arXiv 2601.07206): BestSingle, Random and Oracle (cheapest correct model per
query) on the accuracy-cost plane. Details and how to read a report: docs/headroom.md.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, SupportsFloat

import numpy as np

from conductor.files import atomic_write_text, save_figure
from conductor.stats.paired import mcnemar_exact, paired_bootstrap

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


# ------------------------------------------------------------------ the report

@dataclass(frozen=True)
class HeadroomReport:
    """Where the pool's ceiling is and whether a router could reach for it; ``verdict`` and ``evidence`` are
    derived from the measured points and tests (one source of truth)."""

    n_questions: int
    workers: tuple[Point, ...]
    best_single: str
    cheapest: str
    random_mix: RandomMixLine
    mix_at_cross_fit_cost: Point     # the best random mix of workers at the cross-fit oracle's dollars
    cross_fit: Point
    any_correct: Point
    cross_fit_vs_best: PairedComparison
    cross_fit_vs_mix: PairedComparison
    any_correct_vs_best: PairedComparison
    router: CrossFitRouter
    margin: float = DEFAULT_MARGIN
    alpha: float = DEFAULT_ALPHA
    n_boot: int = DEFAULT_N_BOOT
    seed: int = 0
    policy: Point | None = None
    policy_vs_best: PairedComparison | None = None
    notes: tuple[str, ...] = ()

    # -- derived views --
    @property
    def best(self) -> Point:
        return next(p for p in self.workers if p.label == self.best_single)

    @property
    def any_correct_headroom(self) -> float:
        """Accuracy the any-correct oracle adds over the best single worker (not reachable by routing)."""
        return self.any_correct.accuracy - self.best.accuracy

    @property
    def cross_fit_headroom(self) -> float:
        """Accuracy a router that sees only the question adds over the best single worker."""
        return self.cross_fit.accuracy - self.best.accuracy

    @property
    def unpredictable_headroom(self) -> float:
        """The part of the any-correct gain the cross-fit router could not predict from the question."""
        return self.any_correct.accuracy - self.cross_fit.accuracy

    @property
    def policy_captured(self) -> float | None:
        """(policy - best single) / (cross-fit - best single); NaN without cross-fit headroom, None without a policy.

        >>> _report_stub(best=0.5, cross_fit=0.7, policy=0.6).policy_captured
        0.5
        >>> _report_stub(best=0.5, cross_fit=0.5, policy=0.6).policy_captured
        nan
        """
        if self.policy is None:
            return None
        h = self.cross_fit_headroom
        return (self.policy.accuracy - self.best.accuracy) / h if h > 1e-12 else math.nan

    @property
    def verdict(self) -> Verdict:
        return "router-bound" if self._rule() == 3 else "pool-bound"

    def _rule(self) -> int:
        if self.any_correct_vs_best.ci_low <= self.margin:
            return 1
        if not (self.cross_fit_vs_best.significant(self.alpha) or self.cross_fit_vs_mix.significant(self.alpha)):
            return 2
        return 3

    @property
    def reason(self) -> str:
        """The verdict's rule, in words."""
        a, m = self.any_correct_vs_best, self.margin
        return {
            1: (f"even the any-correct oracle gains only {100 * a.diff:+.1f} points over the best single worker "
                f"{self.best_single} (95% CI lower bound {100 * a.ci_low:+.1f} <= margin {100 * m:.1f}): "
                "no router can win on this pool; change the pool"),
            2: ("the pool is complementary in hindsight, but a router that sees only the question is not "
                "significantly better than the best single worker, nor than the best random mix of workers at its cost "
                f"(alpha {self.alpha}): the complementarity is not predictable from the question"),
            3: ("a router that sees only the question beats "
                + ("the best single worker" if self.cross_fit_vs_best.significant(self.alpha)
                   else "the best random mix of workers at equal cost")
                + f" significantly (alpha {self.alpha}): a router could win; a policy that does not is the problem"),
        }[self._rule()]

    @property
    def verdict_line(self) -> str:
        return f"verdict: {self.verdict} -- {self.reason}"

    @property
    def evidence(self) -> list[str]:
        """Plain sentences with the numbers behind the verdict."""
        b, x, a, mix = self.best, self.cross_fit, self.any_correct, self.mix_at_cross_fit_cost
        out = [f"On {self.n_questions} questions, each worker alone: "
               + "; ".join(f"{p.label} {p.fmt()}" for p in self.workers) + "."]
        out.append(f"The best single worker is {b.label} ({100 * b.accuracy:.1f}%) and also the cheapest, so the random-mix "
                   "line is a single point." if self.cheapest == b.label else
                   f"The best single worker is {b.label} ({100 * b.accuracy:.1f}%); the cheapest is {self.cheapest} "
                   f"({100 * self.random_mix.cheap_accuracy:.1f}%, ${self.random_mix.cheap_dollars:.6f}/q).")
        ac = self.any_correct_vs_best
        out.append(f"The any-correct oracle (cheapest correct worker per question) reaches {a.fmt()}: "
                   f"{100 * ac.diff:+.1f} points vs {b.label}, 95% CI [{100 * ac.ci_low:+.1f}, {100 * ac.ci_high:+.1f}]"
                   + (f", McNemar b={ac.mcnemar_b} c={ac.mcnemar_c} p={ac.p_mcnemar:.3g}." if ac.p_mcnemar is not None
                      else "."))
        xb, xm = self.cross_fit_vs_best, self.cross_fit_vs_mix
        routed = ", ".join(f"{w} {n}" for w, n in self.router.choices.items() if n)
        out.append(f"The cross-fit router ({self.router.folds}-fold, {self.router.features} features) reaches {x.fmt()}: "
                   f"{100 * xb.diff:+.1f} points vs {b.label}, 95% CI [{100 * xb.ci_low:+.1f}, {100 * xb.ci_high:+.1f}], "
                   f"bootstrap p={xb.p_bootstrap:.3g}, McNemar b={xb.mcnemar_b} c={xb.mcnemar_c} p={xb.p_mcnemar:.3g}; "
                   f"it sent questions to {routed}.")
        out.append(f"At the cross-fit router's ${x.dollars:.6f}/q the best random mix of workers ({mix.label}) reaches "
                   f"{100 * mix.accuracy:.1f}%; the router scores {100 * xm.diff:+.1f} points vs it, 95% CI "
                   f"[{100 * xm.ci_low:+.1f}, {100 * xm.ci_high:+.1f}], bootstrap p={xm.p_bootstrap:.3g}.")
        out.append(f"Of the any-correct oracle's {100 * self.any_correct_headroom:.1f} points over {b.label}, the "
                   f"cross-fit router realises {100 * self.cross_fit_headroom:+.1f}; "
                   f"{100 * self.unpredictable_headroom:.1f} are not predictable from the question by this learner.")
        if self.policy is not None and self.policy_vs_best is not None:
            pb, cap = self.policy_vs_best, self.policy_captured
            captured = ("there is no cross-fit headroom to capture" if cap is None or math.isnan(cap)
                        else f"it captured {100 * cap:.0f}% of the cross-fit headroom")
            out.append(f"The policy {self.policy.label} reaches {self.policy.fmt()}: {100 * pb.diff:+.1f} points vs "
                       f"{b.label}, 95% CI [{100 * pb.ci_low:+.1f}, {100 * pb.ci_high:+.1f}], McNemar p={pb.p_mcnemar:.3g}; "
                       f"{captured}.")
        out.append(f"Verdict: {self.verdict}, because {self.reason}.")
        return out

    # -- outputs --
    def to_json(self) -> dict[str, Any]:
        """Plain JSON: the measured fields, then the derived verdict, reason, evidence and headrooms (NaN -> null)."""
        d = asdict(self)
        d.update(verdict=self.verdict, reason=self.reason, evidence=self.evidence,
                 any_correct_headroom=self.any_correct_headroom, cross_fit_headroom=self.cross_fit_headroom,
                 unpredictable_headroom=self.unpredictable_headroom, policy_captured=self.policy_captured)
        return _no_nan(d)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> HeadroomReport:
        def pc(v: Mapping[str, Any] | None) -> PairedComparison | None:
            return None if v is None else PairedComparison(**v)

        def pt(v: Mapping[str, Any] | None) -> Point | None:
            if v is None:
                return None
            fields: dict[str, Any] = {k: (math.nan if x is None else x) for k, x in v.items()}
            return Point(**fields)

        return cls(
            n_questions=d["n_questions"], workers=tuple(pt(p) for p in d["workers"]),  # type: ignore[misc]
            best_single=d["best_single"], cheapest=d["cheapest"], random_mix=RandomMixLine(**d["random_mix"]),
            mix_at_cross_fit_cost=pt(d["mix_at_cross_fit_cost"]), cross_fit=pt(d["cross_fit"]),  # type: ignore[arg-type]
            any_correct=pt(d["any_correct"]), cross_fit_vs_best=pc(d["cross_fit_vs_best"]),  # type: ignore[arg-type]
            cross_fit_vs_mix=pc(d["cross_fit_vs_mix"]), any_correct_vs_best=pc(d["any_correct_vs_best"]),  # type: ignore[arg-type]
            router=CrossFitRouter(**d["router"]), margin=d["margin"], alpha=d["alpha"], n_boot=d["n_boot"],
            seed=d["seed"], policy=pt(d.get("policy")), policy_vs_best=pc(d.get("policy_vs_best")),
            notes=tuple(d.get("notes") or ()))

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2) + "\n"

    def render_markdown(self, plot: str | None = "headroom.png") -> str:
        """The report as markdown: verdict, the points, the paired tests, the evidence, the settings."""
        lines = ["# Headroom check", "", f"**{self.verdict}** -- {self.reason}.", "",
                 "| point | accuracy | 95% CI | $/question |", "|---|---:|---:|---:|"]
        pts = [(p.label + (" (best single)" if p.label == self.best_single else "")
                + (" (cheapest)" if p.label == self.cheapest else ""), p) for p in self.workers]
        pts += [(f"best random mix at cross-fit cost: {self.mix_at_cross_fit_cost.label}", self.mix_at_cross_fit_cost),
                ("cross-fit routing oracle", self.cross_fit), ("any-correct oracle", self.any_correct)]
        if self.policy is not None:
            pts.append((f"policy: {self.policy.label}", self.policy))
        for name, p in pts:
            lines.append(f"| {name} | {100 * p.accuracy:.1f}% | [{100 * p.ci_low:.1f}, {100 * p.ci_high:.1f}] "
                         f"| {p.dollars:.6f} |")
        lines += ["", "| paired test | diff (points) | 95% CI | bootstrap p | McNemar b/c | McNemar p |",
                  "|---|---:|---:|---:|---:|---:|"]
        tests = [self.cross_fit_vs_best, self.cross_fit_vs_mix, self.any_correct_vs_best]
        tests += [self.policy_vs_best] if self.policy_vs_best is not None else []
        for t in tests:
            mc = ("-", "-") if t.p_mcnemar is None else (f"{t.mcnemar_b}/{t.mcnemar_c}", f"{t.p_mcnemar:.3g}")
            lines.append(f"| {t.candidate} vs {t.baseline} | {100 * t.diff:+.1f} | [{100 * t.ci_low:+.1f}, "
                         f"{100 * t.ci_high:+.1f}] | {t.p_bootstrap:.3g} | {mc[0]} | {mc[1]} |")
        lines += ["", "## Evidence", "", *(f"- {e}" for e in self.evidence), ""]
        r = self.router
        lines.append(f"Settings: {self.n_boot} bootstrap resamples over questions, seed {self.seed}, margin "
                     f"{100 * self.margin:.1f} points, alpha {self.alpha}; cross-fit router: {r.learner}, {r.folds} "
                     f"folds, features {r.features}, cost weight {r.cost_weight}.")
        lines += [f"Note: {n}" for n in self.notes]
        if plot:
            lines += ["", f"![accuracy vs dollars]({plot})"]
        return "\n".join(lines) + "\n"

    def plot(self, path: str | Path) -> Path:
        """Accuracy against dollars per question: the workers, the random-mix line, both oracles, the policy."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig, ax = plt.subplots(figsize=(7.5, 4.8))

        def mark(p: Point, color: str, marker: str, label: str, size: float = 40) -> None:
            err = [[max(p.accuracy - p.ci_low, 0.0)], [max(p.ci_high - p.accuracy, 0.0)]]
            ax.errorbar([p.dollars], [p.accuracy], yerr=err, fmt="none", ecolor=color, alpha=0.6, capsize=3)
            ax.scatter([p.dollars], [p.accuracy], s=size, color=color, marker=marker, zorder=3, label=label)

        for i, p in enumerate(self.workers):
            mark(p, f"C{i % 10}", "o", p.label + (" (best single)" if p.label == self.best_single else ""))
        (x0, y0), (x1, y1) = self.random_mix.endpoints
        ax.plot([x0, x1], [y0, y1], ls="--", color="grey", lw=1, label="random mix (cheapest / best)")
        acc = [p.accuracy for p in self.workers]
        dol = [p.dollars for p in self.workers]
        if max(dol) > min(dol):
            grid = np.linspace(min(dol), max(dol), 200)
            env = [_mix_accuracy(acc, best_mix_at_cost(acc, dol, float(g))) for g in grid]
            ax.plot(grid, env, ls=":", color="grey", lw=1, label="best random mix of two workers")
        mark(self.cross_fit, "black", "*", "cross-fit routing oracle", 140)
        mark(self.any_correct, "black", "^", "any-correct oracle (not reachable)", 70)
        if self.policy is not None:
            mark(self.policy, "crimson", "D", f"policy: {self.policy.label}", 60)
        xs = [p.dollars for p in (*self.workers, self.cross_fit, self.any_correct, *([self.policy] if self.policy else []))]
        top = max(xs, default=0.0)
        ax.set_xlim(0.0, top * 1.25 if top > 0 else 1.0)
        ax.set_ylim(-0.02, 1.05)
        ax.set_xlabel("dollars per question")
        ax.set_ylabel("accuracy (95% bootstrap interval)")
        ax.set_title(f"Headroom: {self.verdict} ({self.n_questions} questions)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        return save_figure(fig, path)

    def write(self, out_dir: str | Path) -> dict[str, Path]:
        """headroom.json, headroom.md and headroom.png in ``out_dir``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        png = self.plot(out / "headroom.png")
        md = atomic_write_text(out / "headroom.md", self.render_markdown("headroom.png"))
        js = atomic_write_text(out / "headroom.json", self.dumps())
        return {"json": js, "markdown": md, "plot": png}


# ------------------------------------------------------------------ the computation

def headroom_report(matrix: OutcomeMatrix, *, policy: PolicyOutcome | None = None, folds: int = DEFAULT_FOLDS,
                    n_boot: int = DEFAULT_N_BOOT, seed: int = 0, margin: float = DEFAULT_MARGIN,
                    alpha: float = DEFAULT_ALPHA, cost_weight: float = 0.0) -> HeadroomReport:
    """The headroom check of ``matrix`` (see the module docstring for every definition).

    Deterministic given ``seed`` and independent of the order of the matrix's rows. With a ``policy``, questions
    the policy did not answer are left out of everything (said in ``notes``).

    >>> nested = OutcomeMatrix([f"q{i}" for i in range(20)], ["big", "small"],
    ...                        [[True, i < 5] if i < 14 else [False, False] for i in range(20)],
    ...                        [[0.01, 0.001]] * 20)
    >>> r = headroom_report(nested, n_boot=500)
    >>> r.best_single, r.any_correct.accuracy == r.best.accuracy, r.verdict
    ('big', True, 'pool-bound')
    """
    if folds < 2:
        raise ValueError("headroom: folds must be at least 2")
    if not 0 < alpha < 1 or n_boot < 100:
        raise ValueError("headroom: alpha must be in (0, 1) and n_boot at least 100")
    notes = list(matrix.notes)
    m = _answered_by(matrix, policy, notes).sorted()
    n = m.n_questions
    if n < 2:
        raise ValueError(f"headroom: needs at least 2 questions (got {n})")
    y = m.correct.astype(float)
    c = m.cost_usd
    names = m.workers
    b, s = m.best_worker, m.cheapest_worker
    qids = m.question_ids

    k = min(folds, n)
    chosen, features = cross_fit_choices(m, k, seed, cost_weight)
    x_y = y[np.arange(n), chosen]
    x_c = c[np.arange(n), chosen]

    # the any-correct oracle: cheapest correct worker, else cheapest worker
    big = np.where(m.correct, c, np.inf)
    a_pick = np.where(m.any_correct, big.argmin(axis=1), c.argmin(axis=1))
    a_y = y[np.arange(n), a_pick]
    a_c = c[np.arange(n), a_pick]

    # the random-mix line (cheapest / best), and the best random mix of any workers at the cross-fit's dollars
    acc, dol = y.mean(axis=0), c.mean(axis=0)
    line = RandomMixLine(names[s], names[b], float(acc[s]), float(dol[s]), float(acc[b]), float(dol[b]))
    mi, mj, lam = best_mix_at_cost(acc.tolist(), dol.tolist(), float(x_c.mean()))
    mix_y = (1 - lam) * y[:, mi] + lam * y[:, mj]
    mix_label = names[mi] if mi == mj else f"{names[mi]} / {names[mj]}, {100 * lam:.0f}% to {names[mj]}"

    p_y, p_c = _policy_columns(policy, qids)

    # one set of resamples for every point's interval
    cols = [y[:, w] for w in range(m.n_workers)] + [mix_y, x_y, a_y] + ([p_y] if p_y is not None else [])
    lo, hi = bootstrap_intervals(np.stack(cols, axis=1), n_boot=n_boot, seed=seed)

    def point(label: str, j: int, values: np.ndarray, dollars: float) -> Point:
        return Point(label, float(values.mean()), float(lo[j]), float(hi[j]), float(dollars), n)

    w_points = tuple(point(names[w], w, y[:, w], dol[w]) for w in range(m.n_workers))
    j = m.n_workers
    mix_p = point(mix_label, j, mix_y, (1 - lam) * dol[mi] + lam * dol[mj])
    x_p = point("cross-fit oracle", j + 1, x_y, x_c.mean())
    a_p = point("any-correct oracle", j + 2, a_y, a_c.mean())
    pol_p = point(policy.label, j + 3, p_y, p_c.mean()) if policy is not None and p_y is not None else None  # type: ignore[union-attr]

    best_y = y[:, b]
    pair = lambda name, v, base, base_name, binary=True: paired(name, v, base_name, base, qids, n_boot, seed, binary)  # noqa: E731
    router = CrossFitRouter(learner=LEARNER, folds=k, seed=seed, cost_weight=cost_weight, features=features,
                            choices={names[w]: int((chosen == w).sum()) for w in range(m.n_workers)})
    return HeadroomReport(
        n_questions=n, workers=w_points, best_single=names[b], cheapest=names[s], random_mix=line,
        mix_at_cross_fit_cost=mix_p, cross_fit=x_p, any_correct=a_p,
        cross_fit_vs_best=pair("cross-fit oracle", x_y, best_y, names[b]),
        cross_fit_vs_mix=pair("cross-fit oracle", x_y, mix_y, "best random mix at equal cost", binary=False),
        any_correct_vs_best=pair("any-correct oracle", a_y, best_y, names[b]),
        router=router, margin=margin, alpha=alpha, n_boot=n_boot, seed=seed, policy=pol_p,
        policy_vs_best=pair(policy.label, p_y, best_y, names[b]) if policy is not None and p_y is not None else None,
        notes=tuple(notes))


def _answered_by(matrix: OutcomeMatrix, policy: PolicyOutcome | None, notes: list[str]) -> OutcomeMatrix:
    """The matrix on the questions the policy answered (all of them without a policy); says what it left out."""
    if policy is None:
        return matrix
    answered = [q for q in matrix.question_ids if q in policy.correct and policy.correct[q] is not None]
    if not answered:
        raise ValueError(f"headroom: the policy {policy.label!r} answered none of the matrix's questions")
    if len(answered) < matrix.n_questions:
        notes.append(f"left out {matrix.n_questions - len(answered)} questions the policy {policy.label} did not "
                     "answer")
        return matrix.subset(answered)
    return matrix


def cross_fit_choices(m: OutcomeMatrix, k: int, seed: int, cost_weight: float) -> tuple[np.ndarray, str]:
    """The cross-fit oracle's worker per question (each fold routed by a router fit on the other folds), and the
    features it routed on."""
    n = m.n_questions
    fold = np.empty(n, dtype=int)
    fold[np.random.default_rng(seed).permutation(n)] = np.arange(n) % k
    feats = hashed_features(m.texts) if m.texts is not None and any(t.strip() for t in m.texts) else None
    doms = m.domains
    chosen = np.empty(n, dtype=int)
    for f in range(k):
        test = np.flatnonzero(fold == f)
        train = np.flatnonzero(fold != f)
        chosen[test] = route(m.correct, m.cost_usd, train, test, features=feats, domains=doms,
                             cost_weight=cost_weight)
    features = ("text+domain" if feats is not None and doms is not None else "text" if feats is not None
                else "domain" if doms is not None else "none")
    return chosen, features


def _policy_columns(policy: PolicyOutcome | None, qids: Sequence[str]) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The policy's correctness and dollars per question, in ``qids`` order (None, None without a policy)."""
    if policy is None:
        return None, None
    p_y = np.array([float(bool(policy.correct[q])) for q in qids])
    cost = policy.cost_usd
    p_c = (np.array([float(cost.get(q, 0.0)) for q in qids]) if isinstance(cost, Mapping)
           else np.full(len(qids), float(cost)))
    return p_y, p_c


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


# ------------------------------------------------------------------ the cross-fit learner

K_NEIGHBOURS = 10
ALPHA_PRIOR = 1.0       # the domain estimate counts as one perfectly similar neighbour
BETA_PRIOR = 2.0        # the training accuracy counts as two questions of the domain
HASH_DIM = 2048
LEARNER = (f"kNN (k={K_NEIGHBOURS}, cosine over IDF-weighted hashed words, {HASH_DIM} buckets) shrunk towards the "
           f"per-domain rate (prior weight {ALPHA_PRIOR:g}), itself shrunk towards the training rate (prior weight "
           f"{BETA_PRIOR:g} questions)")
_WORD = re.compile(r"[a-z]+[a-z0-9]*")


def hashed_features(texts: Sequence[str], dim: int = HASH_DIM) -> np.ndarray:
    """Binary bag of words (lower-case, numbers dropped: they identify a question, not its kind), hashed with
    CRC-32 into ``dim`` buckets (stable across runs, unlike ``hash``), IDF-weighted, L2-normalised rows.

    >>> X = hashed_features(["Integrate x squared", "integrate the sine", "Write a sonnet 42"])
    >>> X.shape, bool(X[0] @ X[1] > 0), float(X[0] @ X[2]), float(np.round(np.linalg.norm(X[2]), 6))
    ((3, 2048), True, 0.0, 1.0)
    """
    X = np.zeros((len(texts), dim), dtype=np.float32)
    for i, t in enumerate(texts):
        for tok in set(_WORD.findall((t or "").lower())):
            X[i, zlib.crc32(tok.encode()) % dim] = 1.0
    df = X.sum(axis=0)
    X *= (np.log((1 + len(texts)) / (1 + df)) + 1.0).astype(np.float32)
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return X / np.where(norms > 0, norms, 1.0)


def route(correct: np.ndarray, cost: np.ndarray, train: np.ndarray, test: np.ndarray, *,
          features: np.ndarray | None = None, domains: Sequence[str] | None = None,
          cost_weight: float = 0.0, k: int = K_NEIGHBOURS) -> np.ndarray:
    """Fit on the ``train`` rows, pick a worker for each ``test`` row from its features and domain only.

    >>> y = np.array([[1, 0], [1, 0], [0, 1], [0, 1]], dtype=bool)
    >>> route(y, np.zeros((4, 2)), np.array([0, 2]), np.array([1, 3]), domains=["m", "m", "p", "p"]).tolist()
    [0, 1]
    >>> route(y, np.zeros((4, 2)), np.array([0, 2]), np.array([1, 3])).tolist()    # no features: one worker
    [0, 0]
    """
    yt = correct[train].astype(float)
    ct = cost[train]
    p_all, c_all = yt.mean(axis=0), ct.mean(axis=0)
    p_prior = np.tile(p_all, (len(test), 1))
    c_prior = np.tile(c_all, (len(test), 1))
    if domains is not None:
        dom = np.asarray(domains, dtype=object)
        for d in set(dom[test].tolist()):
            rows = dom[test] == d
            mask = dom[train] == d
            n_d = int(mask.sum())
            p_prior[rows] = (yt[mask].sum(axis=0) + BETA_PRIOR * p_all) / (n_d + BETA_PRIOR)
            c_prior[rows] = (ct[mask].sum(axis=0) + BETA_PRIOR * c_all) / (n_d + BETA_PRIOR)
    p_hat = p_prior
    if features is not None and len(train):
        sim = np.clip(features[test] @ features[train].T, 0.0, None).astype(float)
        kk = min(k, len(train))
        if kk < len(train):       # keep each row's k most similar training questions
            cut = np.argpartition(-sim, kk - 1, axis=1)[:, kk:]
            np.put_along_axis(sim, cut, 0.0, axis=1)
        p_hat = (sim @ yt + ALPHA_PRIOR * p_prior) / (sim.sum(axis=1, keepdims=True) + ALPHA_PRIOR)
    score = np.round(p_hat - cost_weight * c_prior, 12)
    out = np.empty(len(test), dtype=int)
    for i in range(len(test)):
        out[i] = int(np.lexsort((np.arange(score.shape[1]), np.round(c_prior[i], 15), -score[i]))[0])
    return out


# ------------------------------------------------------------------ helpers

def _r(x: SupportsFloat) -> float:
    return round(float(x), 12)


def _no_nan(x: Any) -> Any:
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _no_nan(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_no_nan(v) for v in x]
    return x


def _report_stub(best: float, cross_fit: float, policy: float) -> HeadroomReport:
    """A report with only the accuracies the doctests read."""
    p = lambda label, a: Point(label, a, a, a, 0.0, 1)  # noqa: E731
    t = PairedComparison("x", "b", 1, 0.0, 0.0, 0.0, 1.0)
    return replace(HeadroomReport(1, (p("b", best),), "b", "b", RandomMixLine("b", "b", best, 0, best, 0),
                                  p("mix", best), p("x", cross_fit), p("a", 1.0), t, t, t,
                                  CrossFitRouter("", "none", 2, 0, 0.0)), policy=p("pol", policy))
