"""Evaluation statistics: is a candidate checkpoint really better than the champion?

Both are run on the same held-out questions with the same pool and seeds, with
repeated samples. This module turns those rows into mean +/- standard error
per domain (as the paper reports), calls and dollars per question, and two
paired tests on the same questions: a paired bootstrap over questions (any
metric) and McNemar's exact test (binary correctness, one pair per question). ``compare`` returns an
``EvalReport`` that the registry's promotion policy reads.

Rows may be ``Trajectory`` objects, lake rows (dicts) or ``EvalRow``s.
Infra-failed samples (reward None) are counted but never scored.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
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


# ------------------------------------------------------------------ summaries

@dataclass(frozen=True)
class Summary:
    """One model on one slice of questions."""

    n_questions: int
    n_samples: int
    n_infra_failed: int
    n_repeats: int
    accuracy: float
    accuracy_se: float
    reward: float
    reward_se: float
    calls_per_question: float
    cost_per_question: float

    def fmt(self, metric: Metric = "correct") -> str:
        m, se = (self.accuracy, self.accuracy_se) if metric == "correct" else (self.reward, self.reward_se)
        return f"{100 * m:.2f} ± {100 * se:.2f}" if metric == "correct" else f"{m:.3f} ± {se:.3f}"


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


def summarize(rows: list[EvalRow]) -> Summary:
    acc, acc_se = mean_se(rows, "correct")
    rew, rew_se = mean_se(rows, "reward")
    questions = {r.question_id for r in rows}
    n = max(len(rows), 1)
    return Summary(
        n_questions=len(questions), n_samples=len(rows),
        n_infra_failed=sum(1 for r in rows if r.reward is None),
        n_repeats=len({r.sample_index for r in rows}),
        accuracy=acc, accuracy_se=acc_se, reward=rew, reward_se=rew_se,
        calls_per_question=sum(r.n_calls for r in rows) / n,
        cost_per_question=sum(r.cost_usd for r in rows) / n)


def by_domain(rows: list[EvalRow]) -> dict[str, Summary]:
    groups: dict[str, list[EvalRow]] = defaultdict(list)
    for r in rows:
        groups[r.domain].append(r)
    return {d: summarize(rs) for d, rs in sorted(groups.items())}


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


# ------------------------------------------------------------------ the report

@dataclass(frozen=True)
class DomainComparison:
    candidate: Summary
    champion: Summary
    diff: float            # candidate - champion on the report's metric
    bootstrap: BootstrapResult


@dataclass(frozen=True)
class EvalReport:
    metric: Metric
    candidate: Summary
    champion: Summary
    bootstrap: BootstrapResult
    mcnemar: McNemarResult
    domains: dict[str, DomainComparison] = field(default_factory=dict)
    candidate_id: str = ""
    champion_id: str = ""

    @property
    def diff(self) -> float:
        return self.bootstrap.diff

    def p_value(self, test: Literal["bootstrap", "mcnemar", "both"] = "bootstrap") -> float:
        """'both' takes the larger p: significant only if both tests agree."""
        if test == "mcnemar":
            return self.mcnemar.p_value
        if test == "both":
            return max(self.bootstrap.p_value, self.mcnemar.p_value)
        return self.bootstrap.p_value

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> EvalReport:
        doms = {k: DomainComparison(Summary(**v["candidate"]), Summary(**v["champion"]), v["diff"],
                                    BootstrapResult(**v["bootstrap"])) for k, v in d.get("domains", {}).items()}
        return cls(d["metric"], Summary(**d["candidate"]), Summary(**d["champion"]), BootstrapResult(**d["bootstrap"]),
                   McNemarResult(**d["mcnemar"]), doms, d.get("candidate_id", ""), d.get("champion_id", ""))

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True)

    def render(self) -> str:
        """A plain-text table: per domain and overall, mean +/- s.e., calls and dollars per question."""
        m = self.metric
        head = f"{'domain':<12} {'candidate':>16} {'champion':>16} {'diff':>8} {'calls c/ch':>11} {'$/q c/ch':>19}"
        lines = [head, "-" * len(head)]
        rows = [(d, dc.candidate, dc.champion, dc.diff) for d, dc in self.domains.items()]
        rows.append(("overall", self.candidate, self.champion, self.diff))
        for name, c, ch, diff in rows:
            lines.append(f"{name:<12} {c.fmt(m):>16} {ch.fmt(m):>16} {diff:>+8.3f} "
                         f"{c.calls_per_question:>5.2f}/{ch.calls_per_question:<5.2f} "
                         f"{c.cost_per_question:>9.5f}/{ch.cost_per_question:<9.5f}")
        bs, mc = self.bootstrap, self.mcnemar
        lines.append(f"paired bootstrap: diff={bs.diff:+.4f} 95% CI [{bs.ci_low:+.4f}, {bs.ci_high:+.4f}] "
                     f"p={bs.p_value:.4g} (n={bs.n_questions} questions, B={bs.n_boot})")
        lines.append(f"McNemar exact: b={mc.b} c={mc.c} p_one_sided={mc.p_value:.4g} p_two_sided={mc.p_two_sided:.4g} "
                     f"(n={mc.n_pairs} pairs)")
        return "\n".join(lines)


def compare(candidate_rows: Iterable[Any], champion_rows: Iterable[Any], metric: Metric = "correct",
            n_boot: int = 10_000, seed: int = 0, candidate_id: str = "", champion_id: str = "") -> EvalReport:
    """Candidate vs champion on the same questions: summaries, per-domain diffs, paired tests."""
    cand, champ = to_rows(candidate_rows), to_rows(champion_rows)
    if not cand or not champ:
        raise ValueError(f"compare: need rows on both sides (candidate {len(cand)}, champion {len(champ)})")
    shared = {r.question_id for r in cand} & {r.question_id for r in champ}
    if not shared:
        raise ValueError("compare: candidate and champion share no question ids; evaluate on the same questions")
    cand = [r for r in cand if r.question_id in shared]
    champ = [r for r in champ if r.question_id in shared]
    boot = paired_bootstrap(question_scores(cand, metric), question_scores(champ, metric), n_boot, seed)
    c_dom, ch_dom = by_domain(cand), by_domain(champ)
    domains = {}
    for d in sorted(set(c_dom) & set(ch_dom)):
        cd = [r for r in cand if r.domain == d]
        chd = [r for r in champ if r.domain == d]
        b = paired_bootstrap(question_scores(cd, metric), question_scores(chd, metric), n_boot, seed)
        domains[d] = DomainComparison(c_dom[d], ch_dom[d], b.diff, b)
    return EvalReport(metric, summarize(cand), summarize(champ), boot, mcnemar(cand, champ), domains,
                      candidate_id, champion_id)
