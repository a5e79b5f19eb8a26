"""Evaluation statistics against known values: mean +/- s.e., paired bootstrap, McNemar exact, the report."""

from __future__ import annotations

import math
import random

import pytest

from conductor.learning.evaluation import EvalReport, compare, summarize
from conductor.stats.paired import (
    EvalRow,
    mcnemar,
    mcnemar_exact,
    mean_se,
    paired_bootstrap,
    question_mean_se,
    to_rows,
)
from conductor.trajectory import CallRecord, Trajectory


def rows_for(acc_by_domain: dict[str, float], n_q: int, repeats: int, seed: int, cost: float = 0.01,
             calls: int = 2) -> list[EvalRow]:
    rng = random.Random(seed)
    out = []
    for d, p in acc_by_domain.items():
        for q in range(n_q):
            for s in range(repeats):
                ok = rng.random() < p
                out.append(EvalRow(f"{d}/{q}", d, s, ok, 1.0 if ok else 0.5, calls, cost))
    return out


def test_mean_and_standard_error_over_repeats_and_over_questions():
    # 3 repeats with accuracies 0.5, 0.75, 1.0 -> mean 0.75, s.e. = sd([.5,.75,1]) / sqrt(3) = 0.25/sqrt(3)
    pattern = {0: [1, 1, 0, 0], 1: [1, 1, 1, 0], 2: [1, 1, 1, 1]}
    rows = [EvalRow(f"q{i}", "math", s, bool(c), 1.0 if c else 0.5) for s, cs in pattern.items() for i, c in enumerate(cs)]
    m, se = mean_se(rows, "correct")
    assert m == pytest.approx(0.75) and se == pytest.approx(0.25 / math.sqrt(3))
    # one repeat: s.e. over questions = sd / sqrt(n), sd with Bessel's correction
    one = [EvalRow(f"q{i}", "math", 0, bool(c), float(c)) for i, c in enumerate([1, 0, 1, 1])]
    m1, se1 = mean_se(one, "correct")
    assert m1 == 0.75 and se1 == pytest.approx(math.sqrt(0.25 * 4 / 3 * 0.75) / 2)


def test_infra_failures_are_counted_but_not_scored():
    rows = [EvalRow("a", "m", 0, True, 1.0, 3, 0.03), EvalRow("b", "m", 0, None, None, 1, 0.01),
            EvalRow("c", "m", 0, False, 0.5, 2, 0.02)]
    s = summarize(rows)
    assert s.accuracy == 0.5 and s.reward == 0.75 and s.n_infra_failed == 1
    assert s.calls_per_question == 2.0 and s.cost_per_question == pytest.approx(0.02)


def test_mcnemar_exact_matches_scipy_binomtest():
    stats = pytest.importorskip("scipy.stats")
    for b, c in [(9, 2), (5, 5), (0, 7), (12, 30), (1, 0), (40, 25)]:
        one, two = mcnemar_exact(b, c)
        assert one == pytest.approx(stats.binomtest(b, b + c, 0.5, alternative="greater").pvalue, rel=1e-9)
        assert two == pytest.approx(stats.binomtest(b, b + c, 0.5).pvalue, rel=1e-9)


def test_mcnemar_hand_computed():
    # b=3, c=0: P(X >= 3 | n=3) = 1/8
    assert mcnemar_exact(3, 0) == (0.125, 0.25)


def test_mcnemar_pairs_once_per_question_not_per_repeat():
    # 3 questions x 10 repeats: the candidate is right on q0 and q1 every time, the champion never; q2 ties.
    # Per (question, sample) pairing would see b=20, c=0 (p ~ 1e-6); there are only 2 informative questions.
    cand = [EvalRow(f"q{q}", "m", s, q < 2 or s % 2 == 0, 1.0) for q in range(3) for s in range(10)]
    champ = [EvalRow(f"q{q}", "m", s, q == 2 and s % 2 == 0, 1.0) for q in range(3) for s in range(10)]
    r = mcnemar(cand, champ)
    assert (r.n_pairs, r.b, r.c) == (3, 2, 0)
    assert r.p_value == 0.25 and r.p_two_sided == 0.5
    # the report carries the same per-question test
    rep = compare(cand, champ, n_boot=500, seed=0)
    assert rep.mcnemar == r and rep.p_value("mcnemar") == 0.25


def test_mcnemar_per_question_means_and_single_sample_equivalence():
    stats = pytest.importorskip("scipy.stats")
    # per-question mean correctness decides the direction: 0.6 vs 0.4 counts for the candidate
    cand = [EvalRow("a", "m", s, s < 3, 1.0) for s in range(5)] + [EvalRow("b", "m", s, False, 0.5) for s in range(5)]
    champ = [EvalRow("a", "m", s, s < 2, 1.0) for s in range(5)] + [EvalRow("b", "m", s, s == 0, 1.0) for s in range(5)]
    r = mcnemar(cand, champ)
    assert (r.b, r.c) == (1, 1)
    # one sample per question: exactly the classical McNemar on the discordant pairs
    rng = random.Random(3)
    c1 = [EvalRow(f"q{i}", "m", 0, rng.random() < 0.7, 1.0) for i in range(60)]
    c0 = [EvalRow(f"q{i}", "m", 0, rng.random() < 0.5, 1.0) for i in range(60)]
    r1 = mcnemar(c1, c0)
    b = sum(x.correct and not y.correct for x, y in zip(c1, c0))
    c = sum(y.correct and not x.correct for x, y in zip(c1, c0))
    assert (r1.b, r1.c, r1.n_pairs) == (b, c, 60)
    assert r1.p_value == pytest.approx(stats.binomtest(b, b + c, 0.5, alternative="greater").pvalue, rel=1e-9)
    # infra-failed repeats are ignored; a question with no scored repeat on one side is not a pair
    c1.append(EvalRow("only-cand", "m", 0, True, 1.0))
    c0.append(EvalRow("only-cand", "m", 0, None, None))
    assert mcnemar(c1, c0).n_pairs == 60


def test_question_level_standard_error():
    rows = [EvalRow(f"q{i}", "m", s, bool(c), 1.0) for i, c in enumerate([1, 1, 0, 0]) for s in range(3)]
    m, se = question_mean_se(rows, "correct")
    # per-repeat means are all 0.5 (repeat s.e. 0); over questions: sd([1,1,0,0]) / 2
    assert m == 0.5 and mean_se(rows, "correct")[1] == 0.0
    assert se == pytest.approx(math.sqrt(1 / 3) / 2)


def test_paired_bootstrap_detects_a_real_gain_and_not_noise():
    qs = [f"q{i}" for i in range(200)]
    rng = random.Random(0)
    champ = {q: float(rng.random() < 0.5) for q in qs}
    better = {q: 1.0 if champ[q] == 1.0 else float(rng.random() < 0.4) for q in qs}   # fixes 40% of the misses
    r = paired_bootstrap(better, champ, n_boot=4000, seed=1)
    assert r.diff > 0.1 and r.p_value < 0.01 and r.ci_low > 0
    same = paired_bootstrap(champ, dict(champ), n_boot=2000, seed=1)
    assert same.diff == 0 and same.p_value > 0.4
    noisy = {q: float(rng.random() < 0.5) for q in qs}
    assert paired_bootstrap(noisy, champ, n_boot=2000, seed=1).p_value > 0.01
    assert paired_bootstrap(better, champ, n_boot=500, seed=7) == paired_bootstrap(better, champ, n_boot=500, seed=7)


def test_compare_builds_a_report_per_domain_that_round_trips():
    champ = rows_for({"math": 0.5, "mcq": 0.6}, 100, 3, seed=1)
    cand = rows_for({"math": 0.85, "mcq": 0.6}, 100, 3, seed=2, cost=0.02, calls=3)
    rep = compare(cand, champ, n_boot=2000, seed=0, candidate_id="c1", champion_id="c0")
    assert set(rep.domains) == {"math", "mcq"}
    assert rep.domains["math"].diff > 0.2 and abs(rep.domains["mcq"].diff) < 0.1
    assert rep.p_value("bootstrap") < 0.01 and rep.p_value("mcnemar") < 0.01
    assert rep.candidate.calls_per_question == 3 and rep.champion.cost_per_question == pytest.approx(0.01)
    assert rep.candidate.n_repeats == 3 and rep.candidate.accuracy_se > 0
    again = EvalReport.from_json(rep.to_json())
    assert again == rep
    text = rep.render()
    assert "math" in text and "McNemar" in text and "overall" in text


def test_compare_refuses_disjoint_question_sets():
    a = [EvalRow("q1", "m", 0, True, 1.0)]
    b = [EvalRow("q2", "m", 0, True, 1.0)]
    with pytest.raises(ValueError, match="share no question ids"):
        compare(a, b)


def test_rows_from_trajectories_and_lake_dicts():
    call = CallRecord("0.0", None, 0, 0, 0, "w", "simulated", "m", "s", cost_usd=0.004)
    t = Trajectory("t1", "r", "eval", "q1", "d", "math", "?", sample_index=2, calls=[call, call], correct=True, reward=1.0)
    bad = Trajectory("t2", "r", "eval", "q2", "d", "mcq", "?", infra_failed=True, reward=None)
    r1, r2 = to_rows([t, bad])
    assert (r1.question_id, r1.sample_index, r1.correct, r1.n_calls, r1.cost_usd) == ("q1", 2, True, 2, 0.008)
    assert r2.correct is None and r2.reward is None
    d = to_rows([{"question_id": "q3", "domain": "math", "sample_index": 0, "correct": False, "reward": 0.5,
                  "n_calls": 4, "cost_usd": 0.1, "infra_failed": False}])[0]
    assert d.n_calls == 4 and d.correct is False
