"""Evaluation: is a candidate checkpoint really better than the champion?

Both are run on the same held-out questions with the same pool and seeds, with
repeated samples. This module turns those rows into mean +/- standard error
per domain (as the paper reports), calls and dollars per question, and two
paired tests on the same questions (``conductor.stats.paired``: a paired bootstrap over questions, any
metric, and McNemar's exact test, binary correctness, one pair per question). ``compare`` returns an
``EvalReport`` that the registry's promotion policy reads.

Rows may be ``Trajectory`` objects, lake rows (dicts) or ``EvalRow``s.
Infra-failed samples (reward None) are counted but never scored.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from conductor.stats.paired import (
    BootstrapResult,
    EvalRow,
    McNemarResult,
    Metric,
    mcnemar,
    mean_se,
    paired_bootstrap,
    question_scores,
    to_rows,
)

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
