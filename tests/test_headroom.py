"""The headroom check (conductor/stats/headroom/, `conductor headroom`): a pool built to be pool-bound says so,
one built to be router-bound says so, the intervals and the random-mix line are what they claim, the report is
seeded and order-free, and the command writes its three files or fails in one line."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conductor.stats.headroom import (
    HeadroomReport,
    OutcomeMatrix,
    PolicyOutcome,
    RandomMixLine,
    headroom_report,
)

ROOT = Path(__file__).resolve().parent.parent
SIM_POOL = ROOT / "data/pools/simulated.yaml"
MATH = "integral derivative equation solve algebra polynomial fraction limit".split()
POETRY = "sonnet rhyme stanza metaphor verse poem meter haiku".split()


def nested_pool(n: int = 40) -> OutcomeMatrix:
    """Correct sets nested: big ⊇ mid ⊇ small, so the any-correct oracle is the best single worker."""
    correct = [[i < 30, i < 20, i < 8] for i in range(n)]
    texts = [f"Question {i} about {MATH[i % len(MATH)]} and {POETRY[i % len(POETRY)]}" for i in range(n)]
    return OutcomeMatrix([f"q{i:02d}" for i in range(n)], ["big", "mid", "small"], correct,
                         [[0.02, 0.005, 0.001]] * n, texts, ["math" if i % 2 else "poetry" for i in range(n)])


def specialist_pool(n: int = 60, domains: bool = True, seed: int = 0) -> OutcomeMatrix:
    """Two specialists, each right exactly on its domain, whose words give the domain away; a cheap weak third."""
    rng = np.random.default_rng(seed)
    texts, doms, correct = [], [], []
    for i in range(n):
        dom = "math" if i % 2 == 0 else "poetry"
        words = rng.choice(MATH if dom == "math" else POETRY, 4)
        texts.append(f"Please help: {' '.join(words)} (item {i})")
        doms.append(dom)
        correct.append([dom == "math", dom == "poetry", i % 7 == 0])
    return OutcomeMatrix([f"q{i:02d}" for i in range(n)], ["mathwiz", "poet", "budget"], correct,
                         [[0.010, 0.012, 0.001]] * n, texts, doms if domains else None)


def noise_pool(n: int = 120, seed: int = 3) -> OutcomeMatrix:
    """Independent coin-flip workers: complementary in hindsight, unpredictable from the question."""
    rng = np.random.default_rng(seed)
    texts = [f"Tell me about {rng.choice(MATH + POETRY)} and {rng.choice(MATH + POETRY)}" for _ in range(n)]
    return OutcomeMatrix([f"q{i:03d}" for i in range(n)], ["a", "b", "c"], rng.random((n, 3)) < 0.5,
                         np.full((n, 3), 0.003), texts)


def all_points(r: HeadroomReport) -> list:
    return [*r.workers, r.mix_at_cross_fit_cost, r.cross_fit, r.any_correct, *([r.policy] if r.policy else [])]


# ------------------------------------------------------------------ verdicts

def test_a_nested_pool_is_pool_bound():
    r = headroom_report(nested_pool(), n_boot=1000)
    assert r.best_single == "big" and r.any_correct.accuracy == r.best.accuracy == 0.75
    assert r.any_correct_vs_best.diff == 0 and r.any_correct_vs_best.ci_low <= r.margin
    assert r.verdict == "pool-bound" and "any-correct oracle gains only" in r.reason
    assert r.cross_fit.accuracy <= r.any_correct.accuracy


@pytest.mark.parametrize("domains", [True, False], ids=["text+domain", "text-only"])
def test_domain_specialists_are_router_bound(domains):
    r = headroom_report(specialist_pool(domains=domains), n_boot=1000)
    assert r.router.features == ("text+domain" if domains else "text")
    assert r.best.accuracy == pytest.approx(0.5)
    assert r.cross_fit.accuracy >= r.best.accuracy + 0.4          # the words give each question's specialist away
    assert r.cross_fit_vs_best.significant(r.alpha) and r.cross_fit_vs_best.p_mcnemar < 1e-6
    assert r.any_correct.accuracy == 1.0 and r.verdict == "router-bound"
    assert r.router.choices["mathwiz"] >= 25 and r.router.choices["poet"] >= 25


def test_unpredictable_complementarity_is_pool_bound():
    r = headroom_report(noise_pool(), n_boot=1000)
    assert r.any_correct_vs_best.ci_low > r.margin                 # lots of hindsight headroom...
    assert not r.cross_fit_vs_best.significant(r.alpha)           # ...that no router can predict
    assert r.verdict == "pool-bound" and "not predictable from the question" in r.reason
    assert r.unpredictable_headroom > 0.2


def test_without_features_the_cross_fit_oracle_is_a_single_worker():
    m = specialist_pool()
    bare = OutcomeMatrix(m.question_ids, m.workers, m.correct, m.cost_usd)
    r = headroom_report(bare, n_boot=200)
    assert r.router.features == "none" and r.verdict == "pool-bound"
    assert sum(1 for n in r.router.choices.values() if n) <= 2     # one training-best worker per fold
    assert r.cross_fit.accuracy <= r.best.accuracy + 1e-12


def test_the_policy_sits_between_the_best_single_worker_and_the_cross_fit_oracle():
    m = specialist_pool()
    # right on every math question and on half of the poetry ones: half the cross-fit headroom
    correct = {q: d == "math" or i % 4 == 1 for i, (q, d) in enumerate(zip(m.question_ids, m.domains))}
    r = headroom_report(m, policy=PolicyOutcome("trained", correct, 0.011), n_boot=500)
    assert r.policy is not None and r.policy.accuracy == pytest.approx(0.75) and r.policy.dollars == pytest.approx(0.011)
    assert r.policy_captured == pytest.approx(0.5)
    assert any("captured 50% of the cross-fit headroom" in e for e in r.evidence)
    # a policy that answered only some questions restricts the check to those, and says so
    part = headroom_report(m, policy=PolicyOutcome("p", dict(list(correct.items())[:40])), n_boot=200)
    assert part.n_questions == 40 and any("did not answer" in n for n in part.notes)
    # no cross-fit headroom: nothing to capture
    nested = nested_pool()
    r = headroom_report(nested, policy=PolicyOutcome("p", {q: True for q in nested.question_ids}), n_boot=200)
    assert math.isnan(r.policy_captured) and r.to_json()["policy_captured"] is None


# ------------------------------------------------------------------ the points themselves

def test_bootstrap_intervals_cover_the_point_estimates():
    for m in (nested_pool(), specialist_pool(), noise_pool()):
        r = headroom_report(m, n_boot=500)
        for p in all_points(r):
            assert p.ci_low - 1e-12 <= p.accuracy <= p.ci_high + 1e-12, p
        for t in (r.cross_fit_vs_best, r.cross_fit_vs_mix, r.any_correct_vs_best):
            assert t.ci_low - 1e-12 <= t.diff <= t.ci_high + 1e-12, t


def test_the_random_mix_line_runs_from_the_cheapest_to_the_most_accurate_worker():
    r = headroom_report(specialist_pool(), n_boot=200)
    line = r.random_mix
    assert (line.cheap, line.best) == ("budget", "mathwiz")
    budget = next(p for p in r.workers if p.label == "budget")
    assert line.endpoints == ((budget.dollars, budget.accuracy), (r.best.dollars, r.best.accuracy))
    mid = (budget.dollars + r.best.dollars) / 2
    assert line.fraction_at_cost(mid) == pytest.approx(0.5)
    assert line.accuracy_at_cost(mid) == pytest.approx((budget.accuracy + r.best.accuracy) / 2)
    assert line.dollars_at_fraction(0.25) == pytest.approx(0.75 * budget.dollars + 0.25 * r.best.dollars)
    assert line.accuracy_at_cost(r.best.dollars * 3) == r.best.accuracy and math.isnan(line.accuracy_at_cost(0.0))
    # the cross-fit router spends more than the best worker here: the mix at its cost is the best worker
    assert r.cross_fit.dollars > r.best.dollars and r.mix_at_cross_fit_cost.accuracy == r.best.accuracy
    assert RandomMixLine("a", "a", 0.6, 0.1, 0.6, 0.1).accuracy_at_cost(0.1) == 0.6


def test_the_cost_matched_baseline_is_the_best_mix_of_any_two_workers():
    from conductor.stats.headroom import best_mix_at_cost

    # a mid-priced worker above the cheapest/best line: a router is measured against it, not against the line
    acc, dol = [0.20, 0.57, 0.62], [0.00002, 0.00024, 0.00081]
    line = RandomMixLine("cheap", "dear", 0.20, 0.00002, 0.62, 0.00081)
    assert line.accuracy_at_cost(0.0005) == pytest.approx(0.20 + 0.42 * (0.0005 - 0.00002) / 0.00079)
    i, j, lam = best_mix_at_cost(acc, dol, 0.0005)
    assert (i, j) == (1, 2) and (1 - lam) * dol[1] + lam * dol[2] == pytest.approx(0.0005)
    assert (1 - lam) * acc[1] + lam * acc[2] > line.accuracy_at_cost(0.0005) + 0.1
    assert best_mix_at_cost(acc, dol, 0.00024) == (1, 1, 0.0) and best_mix_at_cost(acc, dol, 0.0) == (0, 0, 0.0)


def test_the_any_correct_oracle_takes_the_cheapest_correct_worker():
    m = OutcomeMatrix(["q1", "q2", "q3"], ["dear", "cheap"], [[True, True], [True, False], [False, False]],
                      [[0.5, 0.1], [0.5, 0.1], [0.5, 0.2]])
    r = headroom_report(m, n_boot=100, folds=3)
    assert r.any_correct.accuracy == pytest.approx(2 / 3)
    assert r.any_correct.dollars == pytest.approx((0.1 + 0.5 + 0.2) / 3)   # none right on q3: the cheapest


def test_the_report_is_seeded_and_ignores_row_order():
    m = specialist_pool(48)
    a = headroom_report(m, n_boot=300, seed=5).to_json()
    assert headroom_report(m, n_boot=300, seed=5).to_json() == a
    order = np.random.default_rng(1).permutation(m.n_questions)
    shuffled = OutcomeMatrix([m.question_ids[i] for i in order], m.workers, m.correct[order], m.cost_usd[order],
                             [m.texts[i] for i in order], [m.domains[i] for i in order])
    assert headroom_report(shuffled, n_boot=300, seed=5).to_json() == a
    other = headroom_report(noise_pool(), n_boot=300, seed=6).to_json()
    assert other != headroom_report(noise_pool(), n_boot=300, seed=5).to_json()


def test_json_round_trip_and_outputs(tmp_path):
    r = headroom_report(specialist_pool(), policy=PolicyOutcome("trained", {f"q{i:02d}": i % 3 > 0 for i in range(60)}),
                        n_boot=300)
    d = json.loads(r.dumps())
    assert d["verdict"] == "router-bound" and d["evidence"] == r.evidence and d["cross_fit"]["label"] == "cross-fit oracle"
    assert HeadroomReport.from_json(d) == r
    paths = r.write(tmp_path)
    assert {p.name for p in paths.values()} == {"headroom.json", "headroom.md", "headroom.png"}
    assert all(p.stat().st_size > 0 for p in paths.values())
    md = (tmp_path / "headroom.md").read_text()
    assert "**router-bound**" in md and "| cross-fit routing oracle |" in md and "![accuracy vs dollars](headroom.png)" in md


def test_from_rows_keeps_only_questions_every_worker_answered():
    rows = [dict(question_id=q, worker=w, correct=(q, w) != ("q2", "b"), cost_usd=0.01, sample_index=s,
                 question=f"text {q}", domain="d")
            for q in ("q1", "q2", "q3") for w in ("a", "b") for s in (1, 0)]
    rows = [r for r in rows if not (r["question_id"] == "q3" and r["worker"] == "b")]
    m = OutcomeMatrix.from_rows(rows)
    assert m.question_ids == ("q1", "q2") and m.workers == ("a", "b") and m.texts == ("text q1", "text q2")
    assert m.correct.tolist() == [[True, True], [True, False]]
    assert any("repeat rows ignored" in n for n in m.notes) and any("1 not answered by every worker" in n for n in m.notes)


@pytest.mark.parametrize("kwargs,msg", [
    (dict(question_ids=[], workers=["a"], correct=np.zeros((0, 1)), cost_usd=np.zeros((0, 1))), "at least one"),
    (dict(question_ids=["q", "q"], workers=["a"], correct=[[True], [False]], cost_usd=[[0], [0]]), "ids repeat"),
    (dict(question_ids=["q"], workers=["a", "b"], correct=[[True]], cost_usd=[[0]]), "must both be"),
    (dict(question_ids=["q"], workers=["a"], correct=[[2]], cost_usd=[[0]]), "booleans"),
    (dict(question_ids=["q"], workers=["a"], correct=[[True]], cost_usd=[[math.nan]]), "finite"),
    (dict(question_ids=["q"], workers=["a"], correct=[[True]], cost_usd=[[0]], domains=["x", "y"]), "2 domains"),
])
def test_bad_matrices_are_refused(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        OutcomeMatrix(**kwargs)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 25).flatmap(lambda n: st.tuples(
    st.lists(st.lists(st.booleans(), min_size=3, max_size=3), min_size=n, max_size=n),
    st.lists(st.lists(st.floats(0, 0.05), min_size=3, max_size=3), min_size=n, max_size=n),
    st.lists(st.sampled_from(["math", "mcq", "code"]), min_size=n, max_size=n),
    st.integers(0, 10))))
def test_random_matrices_keep_the_order_of_the_points(data):
    correct, cost, domains, seed = data
    n = len(correct)
    m = OutcomeMatrix([f"q{i}" for i in range(n)], ["x", "y", "z"], correct, cost,
                      [f"{d} question {i}" for i, d in enumerate(domains)], domains)
    r = headroom_report(m, n_boot=100, seed=seed, folds=3)
    for p in all_points(r):
        assert 0.0 <= p.ci_low <= p.accuracy + 1e-12 and p.accuracy <= p.ci_high + 1e-12 and p.ci_high <= 1.0
        assert p.dollars >= 0
    assert all(r.any_correct.accuracy >= w.accuracy - 1e-12 for w in r.workers)     # any-correct >= every worker
    assert all(r.best.accuracy >= w.accuracy - 1e-12 for w in r.workers)            # best single >= every worker
    assert r.any_correct.accuracy >= r.cross_fit.accuracy - 1e-12                   # no router beats hindsight
    assert r.best.accuracy >= r.mix_at_cross_fit_cost.accuracy - 1e-12              # no mix beats the best worker
    x = r.cross_fit.dollars                    # the cost-matched baseline contains the line and every affordable worker
    line = r.random_mix.accuracy_at_cost(x)
    assert math.isnan(line) or r.mix_at_cross_fit_cost.accuracy >= line - 1e-12
    assert all(r.mix_at_cross_fit_cost.accuracy >= w.accuracy - 1e-12 for w in r.workers if w.dollars <= x)
    assert r.mix_at_cross_fit_cost.dollars <= x + 1e-12 or all(w.dollars > x for w in r.workers)
    assert sum(r.router.choices.values()) == n and r.verdict in ("pool-bound", "router-bound")


# ------------------------------------------------------------------ the command

def cli(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conductor.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_the_command_runs_each_worker_alone_and_writes_the_check(tmp_path):
    a = tmp_path / "a.jsonl"
    a.write_text("".join(json.dumps({"id": f"a{i}", "question": f"What is {i} + 4?", "answer": str(i + 4)}) + "\n"
                         for i in range(6)))
    b = tmp_path / "b.jsonl"
    b.write_text("".join(json.dumps({"id": f"b{i}", "question": f"What is {i} times 3?", "answer": str(3 * i)}) + "\n"
                         for i in range(4)))
    out = tmp_path / "out"
    r = cli("headroom", f"{a},{b}", "--out", str(out), "--pool", str(SIM_POOL), "--n-boot", "300")
    assert r.returncode == 0, r.stderr[-3000:]
    for f in ("headroom.json", "headroom.md", "headroom.png"):
        assert (out / f).stat().st_size > 0
    data = json.loads((out / "headroom.json").read_text())
    assert [w["label"] for w in data["workers"]] == ["sim-mathwiz", "sim-scholar", "sim-generalist", "sim-budget"]
    assert data["n_questions"] == 10 and data["verdict"] in ("pool-bound", "router-bound")
    assert r.stdout.strip().splitlines()[-1] == f"verdict: {data['verdict']} -- {data['reason']}"
    # read mode over the same lake gives the same check, and places a run as the policy
    again = cli("headroom", "--lake", str(out / "lake"), "--out", str(tmp_path / "again"), "--n-boot", "300",
                "--policy", "fixed:2", timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    d2 = json.loads((tmp_path / "again" / "headroom.json").read_text())
    assert d2["workers"] == data["workers"] and d2["cross_fit"] == data["cross_fit"]
    assert d2["policy"]["accuracy"] == data["workers"][2]["accuracy"]


def test_bad_input_is_one_error_line(tmp_path):
    r = cli("headroom", "--out", str(tmp_path / "o"), "--lake", str(tmp_path / "nolake"), timeout=300)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1
    assert "no lake" in r.stderr
    (tmp_path / "empty").mkdir()
    r = cli("headroom", "--out", str(tmp_path / "o"), "--lake", str(tmp_path / "empty"), timeout=300)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "single-worker runs" in r.stderr
    assert not (tmp_path / "o").exists()
