"""`conductor compare`: every strategy as a run in one lake, the paper's table, the paired test, the plot;
run mode and read mode agree; bad input is a one-line error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conductor.lake.reader import scan
from conductor.lake.report import cost_axis_limits
from conductor.run.compare import compare_runs, elapsed_seconds, split_strategies

ROOT = Path(__file__).resolve().parent.parent
SIM_POOL = ROOT / "data/pools/simulated.yaml"


def cli(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conductor.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=None)


def write_questions(path: Path) -> Path:
    rows = [{"id": f"a{i}", "question": f"What is {i} + 4?", "answer": str(i + 4)} for i in range(8)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    b = path.with_name("b.jsonl")
    b.write_text("".join(json.dumps({"id": f"b{i}", "question": f"What is {i} times 3?", "answer": str(3 * i)}) + "\n"
                         for i in range(6)))
    return b


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """One run-mode compare over the simulated pool, two datasets (each questions file is one dataset)."""
    tmp = tmp_path_factory.mktemp("compare")
    a = tmp / "a.jsonl"
    b = write_questions(a)
    out = tmp / "out"
    r = cli("compare", f"{a},{b}", "--out", str(out), "--pool", str(SIM_POOL), "--conductor", "random:7",
            "--strategies", "conductor,fixed:*,sc:0:3,moa:0,1,2:2,random", "--n-boot", "2000")
    return r, out


def test_compare_runs_every_strategy_and_prints_the_table(ran):
    r, out = ran
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((out / "compare.json").read_text())
    labels = [row["label"] for row in data["rows"]]
    assert labels == ["conductor", "fixed:0", "fixed:1", "fixed:2", "fixed:3", "sc:0:3", "moa:0+1+2:2", "random"]
    assert data["datasets"] == ["a", "b"] and data["cost_axis"] == "dollars"
    table = r.stdout[r.stdout.index("strategy"):]
    header = table.splitlines()[0].split()
    assert header[:4] == ["strategy", "a", "b", "average"] and "$/q" in header and "s/q" in header
    assert "(best single)" in table and "paired test, conductor vs best single worker" in table
    p = data["paired"]
    verdict = next(line for line in table.splitlines() if line.startswith("In words: "))
    if p["ci_low"] <= 0 <= p["ci_high"]:   # 14 questions: the random conductor is not told apart from fixed:i
        assert f"are not distinguishable at {p['n_questions']} questions" in verdict and "would take about" in verdict
    else:
        assert f"on these {p['n_questions']} questions" in verdict and "excludes 0" in verdict
    for f in ("compare.md", "compare.png"):
        assert (out / f).stat().st_size > 0
    md = (out / "compare.md").read_text()
    assert "| strategy | a | b | average |" in md and "![accuracy vs dollars](compare.png)" in md


def test_the_table_is_the_lake_recomputed(ran):
    _, out = ran
    data = json.loads((out / "compare.json").read_text())
    lake = str(out / "lake")
    for row in data["rows"]:
        df = scan(lake, run_id=row["run_id"]).collect()
        assert set(df["checkpoint_id"]) == {"random:7" if row["label"] == "conductor" else row["label"]}
        for ds, score in row["datasets"].items():
            part = df.filter(pl.col("dataset") == ds)
            assert score["accuracy"] == pytest.approx(part["correct"].cast(pl.Float64).mean())
            assert score["n_questions"] == part.height
        assert row["average"] == pytest.approx(sum(s["accuracy"] for s in row["datasets"].values()) / 2)
        assert row["calls"] == pytest.approx(df["n_calls"].sum() / df.height)
        assert row["dollars"] == pytest.approx(df["cost_usd"].sum() / df.height)
    sc = next(r for r in data["rows"] if r["label"] == "sc:0:3")
    assert sc["calls"] == 4 and sc["parse_failures"] == 0 and sc["infra_failures"] == 0
    singles = [r for r in data["rows"] if r["label"].startswith("fixed:")]
    assert data["best_single"] == max(singles, key=lambda r: r["average"])["label"]
    p = data["paired"]
    assert p["conductor"] == "conductor" and p["baseline"] == data["best_single"] and p["n_questions"] == 14
    cond = next(r for r in data["rows"] if r["label"] == "conductor")
    best = next(r for r in data["rows"] if r["label"] == data["best_single"])
    # the paired diff is over questions (14), the table's average over datasets: recompute the former
    cdf = scan(lake, run_id=cond["run_id"]).collect()
    bdf = scan(lake, run_id=best["run_id"]).collect()
    assert p["diff"] == pytest.approx(cdf["correct"].cast(pl.Float64).mean() - bdf["correct"].cast(pl.Float64).mean())
    assert 0 <= p["p_bootstrap"] <= 1 and 0 <= p["p_mcnemar"] <= 1


def test_read_mode_reproduces_the_run_mode_table(ran, tmp_path):
    _, out = ran
    data = json.loads((out / "compare.json").read_text())
    runs = ",".join(f"{row['label']}={row['run_id']}" for row in data["rows"])
    r = cli("compare", "--out", str(tmp_path / "again"), "--lake", str(out / "lake"), "--runs", runs, "--n-boot", "2000")
    assert r.returncode == 0, r.stderr[-2000:]
    again = json.loads((tmp_path / "again" / "compare.json").read_text())
    # seconds: run mode measured each run's wall clock; read mode can only estimate them from the lake
    for row, measured in zip(again["rows"], data["rows"]):
        df = scan(str(out / "lake"), run_id=row["run_id"]).collect()
        assert row.pop("seconds") == pytest.approx(elapsed_seconds(df) / df.height)
        assert measured.pop("seconds") > 0
    again.pop("notes"), data.pop("notes")
    assert again == data
    # without --runs: every answer run, labelled by its strategy (the stand-in conductor is random:7 here)
    r = cli("compare", "--out", str(tmp_path / "all"), "--lake", str(out / "lake"), "--n-boot", "2000")
    assert r.returncode == 0, r.stderr[-2000:]
    labels = {row["label"] for row in json.loads((tmp_path / "all" / "compare.json").read_text())["rows"]}
    assert labels == {"random:7", "fixed:0", "fixed:1", "fixed:2", "fixed:3", "sc:0:3", "moa:0+1+2:2", "random"}


def test_a_free_pool_is_plotted_against_seconds(tmp_path):
    from conductor.run.config import AnswerConfig
    from flows.answer import answer_flow

    pool = tmp_path / "free.yaml"
    pool.write_text(SIM_POOL.read_text().replace("price:", "# price:"))
    q = tmp_path / "q.jsonl"
    write_questions(q)
    lake = str(tmp_path / "lake")
    runs = []
    for spec in ("fixed:0", "moa:0+1:2"):
        s = answer_flow(AnswerConfig(questions=str(q), out=str(tmp_path / spec.replace(":", "_")), pool=str(pool),
                                     conductor=spec, lake=lake, show_progress=False))
        assert s.dollars_per_question == 0
        runs.append((spec, s.run_id))
    c = compare_runs(lake, runs)
    assert c.cost_axis == "seconds" and c.paired is None and c.best_single == "fixed:0"
    measured = compare_runs(lake, runs, elapsed={runs[0][1]: 70.0})    # a wall clock compare measured itself
    assert measured.rows[0].seconds == pytest.approx(70.0 / measured.rows[0].n_questions) and measured.rows[1].seconds == c.rows[1].seconds
    assert "measured run wall clock where compare ran the strategy now, else the lake's estimate" in measured.notes[0]
    assert "needs a conductor run" in c.render()
    # the run's own report plots the free run against seconds too, on an axis that starts at 0
    from conductor.lake.queries import accuracy_vs_cost
    df = accuracy_vs_cost(lake)
    assert "seconds_per_question" in df.columns and (df["seconds_per_question"] > 0).all()
    assert cost_axis_limits([0.0]) == (0.0, 1.0) and cost_axis_limits(df["dollars_per_question"].to_list())[0] == 0.0


@pytest.mark.parametrize("args,msg", [
    (["--strategies", "conductor,bogus:1"], "unknown strategy 'bogus:1'"),
    (["--strategies", "fixed:0,fixed:0"], "listed twice"),
    (["--strategies", "fixed:7"], "worker 7 is not in the pool"),
])
def test_bad_strategies_fail_before_anything_runs(tmp_path, args, msg):
    q = tmp_path / "q.jsonl"
    write_questions(q)
    r = cli("compare", str(q), "--out", str(tmp_path / "o"), "--pool", str(SIM_POOL), *args, timeout=300)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and msg in r.stderr
    assert not (tmp_path / "o" / "runs").exists()


def test_read_mode_errors_are_one_line(tmp_path):
    r = cli("compare", "--out", str(tmp_path / "o"), "--lake", str(tmp_path / "nolake"), timeout=300)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "no lake" in r.stderr
    (tmp_path / "empty").mkdir()
    r = cli("compare", "--out", str(tmp_path / "o"), "--lake", str(tmp_path / "empty"), "--runs", "x=nope", timeout=300)
    assert r.returncode == 2 and "no answer run 'nope'" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@given(st.lists(st.sampled_from(["conductor", "fixed:0", "fixed:12", "sc:3:5", "moa:0,1,2:0", "moa:4+5:1",
                                 "random", "random:3:4"]), min_size=1, max_size=6))
def test_strategy_lists_split_back_into_their_specs(specs):
    canonical = [s.replace(",", "+") for s in specs]
    assert split_strategies(",".join(specs)) == canonical
    assert split_strategies(" , ".join(specs)) == canonical


def test_a_question_retried_after_a_failure_counts_once(tmp_path):
    """A resumed run keeps a failed attempt as history beside the successful retry (conductor/run/shards.py); the
    comparison scores the retry alone, as resume counts it."""
    from conductor.lake.writer import write_shard
    from tests.lake_records import traj

    lake = str(tmp_path / "lake")
    first = [traj("r1", "q1", 0, kind="answer", infra_cause="rate limited"), traj("r1", "q2", 0, kind="answer")]
    retry = [traj("r1", "q1", 0, kind="answer", correct=False)]
    write_shard(lake, first, "shard-a")
    write_shard(lake, retry, "shard-b")
    assert scan(lake, "trajectories", kind="answer", run_id="r1").collect().height == 3   # the history stays
    row = compare_runs(lake, [("fixed:0", "r1")]).rows[0]
    assert row.n_questions == 2 and row.infra_failures == 0
    assert row.average == pytest.approx(0.5)        # q1's retry (wrong) and q2 (right), not 2 of 3 rows
