"""Paired statistics on the same questions: per-question scores, their mean and standard error, a paired
bootstrap over questions and McNemar's exact test.

One home for what ``learning/evaluation.py`` (candidate against champion), ``run/compare.py`` (a strategy
against the best single worker) and ``stats/headroom/`` (workers and oracles) all compute: two sides scored
on the same questions, where the question (not the sample) is the unit that is resampled and paired, because
repeats of one question are not independent.

Rows may be ``Trajectory`` objects, lake rows (dicts) or ``EvalRow``s.
Infra-failed samples (reward None) are counted but never scored.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

Metric = Literal["correct", "reward"]


@dataclass(frozen=True)
class EvalRow:
    question_id: str
    domain: str
    sample_index: int
    correct: bool | None          # None: infra-failed, not scored
    reward: float | None
    n_calls: int = 0
    cost_usd: float = 0.0

    def score(self, metric: Metric) -> float | None:
        if self.reward is None:
            return None
        if metric == "reward":
            return float(self.reward)
        return None if self.correct is None else float(bool(self.correct))


def to_rows(items: Iterable[Any]) -> list[EvalRow]:
    """Normalise Trajectory objects, dict rows (lake) or EvalRows into EvalRows."""
    out: list[EvalRow] = []
    for it in items:
        if isinstance(it, EvalRow):
            out.append(it)
            continue
        if isinstance(it, dict):
            get = it.get
            calls = it.get("n_calls")
            if calls is None:
                calls = len(it.get("calls") or [])
            cost = it.get("cost_usd")
            if cost is None:
                cost = sum((c.get("cost_usd") or 0.0) for c in it.get("calls") or [])
        else:
            get = lambda k, _it=it: getattr(_it, k, None)   # noqa: E731
            calls, cost = it.n_calls, it.cost_usd
        infra = bool(get("infra_failed"))
        reward = None if infra else get("reward")
        correct = None if reward is None else bool(get("correct"))
        out.append(EvalRow(str(get("question_id")), str(get("domain") or "all"), int(get("sample_index") or 0),
                           correct, None if reward is None else float(reward), int(calls or 0), float(cost or 0.0)))
    return out


# ------------------------------------------------------------------ mean and standard error

def mean_se(rows: list[EvalRow], metric: Metric) -> tuple[float, float]:
    """Mean and standard error. With >= 2 repeats: SE of the per-repeat means (the paper's
    "mean +/- s.e. over repeated evaluations"); with one: SE over questions.

    >>> rows = [EvalRow(f"q{i}", "m", s, c, float(c)) for s, cs in enumerate([[1, 1, 0, 0], [1, 0, 0, 0]])
    ...         for i, c in enumerate(cs)]
    >>> m, se = mean_se(rows, "correct"); round(m, 3), round(se, 3)
    (0.375, 0.125)
    >>> m, se = mean_se([EvalRow("a", "m", 0, True, 1.0), EvalRow("b", "m", 0, False, 0.5)], "reward")
    >>> m, round(se, 3)
    (0.75, 0.25)
    """
    by_rep: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        s = r.score(metric)
        if s is not None:
            by_rep[r.sample_index].append(s)
    values = [v for vs in by_rep.values() for v in vs]
    if not values:
        return float("nan"), float("nan")
    if len(by_rep) >= 2:
        means = [sum(v) / len(v) for v in by_rep.values()]
        return sum(means) / len(means), _sd(means) / math.sqrt(len(means))
    return sum(values) / len(values), (_sd(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0)


def question_mean_se(rows: list[EvalRow], metric: Metric) -> tuple[float, float]:
    """Mean over questions of each question's mean score over its repeats, and its standard error over
    QUESTIONS (sd with Bessel's correction / sqrt(n)): the uncertainty of a held-out set that is a sample of
    questions. ``mean_se`` with repeats measures only the spread between repeats, which is ~0 for a
    near-deterministic policy over temperature-0 workers.

    >>> rows = [EvalRow("a", "m", s, True, 1.0) for s in range(2)] + [EvalRow("b", "m", s, s == 0, 1.0) for s in range(2)]
    >>> m, se = question_mean_se(rows, "correct"); m, round(se, 3)
    (0.75, 0.25)
    """
    vals = list(question_scores(rows, metric).values())
    if not vals:
        return float("nan"), float("nan")
    return sum(vals) / len(vals), (_sd(vals) / math.sqrt(len(vals)) if len(vals) > 1 else 0.0)


def _sd(xs: list[float]) -> float:
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


# ------------------------------------------------------------------ paired tests

@dataclass(frozen=True)
class BootstrapResult:
    n_questions: int
    diff: float            # candidate - champion, mean over questions
    ci_low: float          # 95% percentile interval
    ci_high: float
    p_value: float         # one-sided, H0: candidate is not better
    n_boot: int
    seed: int


def question_scores(rows: list[EvalRow], metric: Metric) -> dict[str, float]:
    """Per question, the mean score over its scored repeats."""
    acc: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        s = r.score(metric)
        if s is not None:
            acc[r.question_id].append(s)
    return {q: sum(v) / len(v) for q, v in acc.items()}


def paired_bootstrap(candidate: dict[str, float], champion: dict[str, float], n_boot: int = 10_000,
                     seed: int = 0) -> BootstrapResult:
    """Resample questions with replacement; p = P(mean of centred resampled diffs >= observed diff).

    >>> r = paired_bootstrap({"a": 1, "b": 1, "c": 1, "d": 0}, {"a": 0, "b": 0, "c": 0, "d": 0}, seed=1)
    >>> r.diff, r.p_value < 0.2
    (0.75, True)
    """
    import numpy as np

    qs = sorted(set(candidate) & set(champion))
    if not qs:
        return BootstrapResult(0, 0.0, 0.0, 0.0, 1.0, n_boot, seed)
    d = np.array([candidate[q] - champion[q] for q in qs], dtype=float)
    obs = float(d.mean())
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot)
    for start in range(0, n_boot, 1000):      # chunks keep memory flat for large question sets
        stop = min(n_boot, start + 1000)
        idx = rng.integers(0, len(d), size=(stop - start, len(d)))
        means[start:stop] = d[idx].mean(axis=1)
    p = (1 + int(np.sum(means - obs >= obs - 1e-12))) / (n_boot + 1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return BootstrapResult(len(qs), obs, float(lo), float(hi), min(1.0, p), n_boot, seed)


@dataclass(frozen=True)
class McNemarResult:
    n_pairs: int           # questions scored on both sides
    b: int                 # questions where the candidate does better (one sample: right vs wrong)
    c: int                 # questions where the champion does better
    p_value: float         # exact, one-sided: candidate better
    p_two_sided: float


def _binom_tail_ge(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2), exactly."""
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2 ** n


def mcnemar_exact(b: int, c: int) -> tuple[float, float]:
    """Exact McNemar (binomial) p-values: (one-sided for b > c, two-sided).

    >>> [round(p, 4) for p in mcnemar_exact(9, 2)]
    [0.0327, 0.0654]
    >>> mcnemar_exact(0, 0)
    (1.0, 1.0)
    """
    n = b + c
    if n == 0:
        return 1.0, 1.0
    one = _binom_tail_ge(b, n)
    two = min(1.0, 2 * _binom_tail_ge(max(b, c), n))    # symmetric at p = 1/2
    return one, two


def mcnemar(candidate: list[EvalRow], champion: list[EvalRow]) -> McNemarResult:
    """One pair per QUESTION scored on both sides (repeats of a question are not independent pairs).

    Per question each side's score is its mean correctness over its scored repeats; b counts questions where
    the candidate's mean is higher, c where it is lower, ties are dropped. With one sample per question this
    is exactly McNemar's test; with repeats it is the exact sign test on per-question differences, its
    usual generalisation. Pairing on (question, sample index) instead would count each repeat as an
    independent pair and make p too small.

    >>> cand = [EvalRow("q1", "m", s, True, 1.0) for s in range(3)] + [EvalRow("q2", "m", 0, False, 0.5)]
    >>> champ = [EvalRow("q1", "m", s, False, 0.5) for s in range(3)] + [EvalRow("q2", "m", 0, False, 0.5)]
    >>> r = mcnemar(cand, champ); (r.n_pairs, r.b, r.c, r.p_value)
    (2, 1, 0, 0.5)
    """
    cand_q = question_scores(candidate, "correct")
    champ_q = question_scores(champion, "correct")
    b = c = n = 0
    for q, score in cand_q.items():
        other = champ_q.get(q)
        if other is None:
            continue
        n += 1
        b += int(score > other + 1e-12)
        c += int(other > score + 1e-12)
    one, two = mcnemar_exact(b, c)
    return McNemarResult(n, b, c, one, two)
