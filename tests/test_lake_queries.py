"""The data teams' standard questions, ad-hoc SQL, the CLI and the report, on a small hand-made lake
whose answers are counted by hand (see tests/lake_records.py)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conductor.lake import queries as q
from conductor.lake import write_shard
from conductor.lake.report import render_report
from conductor.lake.schema import file_schema, trajectory_row
from conductor.lake.writer import _drop_keys
from lake_records import small_lake_records, traj

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("lake")
    recs = small_lake_records()
    write_shard(root, recs[:3], "00000")   # run r1 over two shards
    write_shard(root, recs[3:6], "00001")
    write_shard(root, recs[6:], "00000")   # run r2
    return str(root)


def _rows(df: pl.DataFrame, key: str) -> dict:
    return {r[key]: r for r in df.iter_rows(named=True)}


def test_accuracy_and_reward_by_dataset_checkpoint_pool(lake):
    by = _rows(q.accuracy_by(lake, "dataset"), "dataset")
    assert (by["gsm8k"]["n"], by["gsm8k"]["n_graded"]) == (6, 5)
    assert by["gsm8k"]["accuracy"] == pytest.approx(3 / 5)
    assert by["gsm8k"]["mean_reward"] == pytest.approx(4 / 6)
    assert by["gsm8k"]["parse_ok_rate"] == pytest.approx(5 / 6)
    assert (by["mmlu"]["n"], by["mmlu"]["accuracy"], by["mmlu"]["n_infra_failed"]) == (2, 1.0, 1)
    ck = _rows(q.accuracy_by(lake, "checkpoint_id"), "checkpoint_id")
    assert ck["ckpt-1"]["accuracy"] == pytest.approx(3 / 4) and ck["ckpt-2"]["accuracy"] == pytest.approx(0.5)
    assert set(q.accuracy_by(lake, "pool_id")["pool_id"]) == {"pool-a@v1", "pool-b@v1"}
    only_r2 = q.accuracy_by(lake, "dataset", run_id="r2")   # partition filter
    assert only_r2.rows() == [("gsm8k", 2, 2, 0.5, 0.75, 1.0, 0, 0.01)]


def test_accuracy_by_worker_used_and_final(lake):
    used = _rows(q.accuracy_by(lake, "worker"), "worker")
    assert (used["w-a"]["n"], used["w-a"]["accuracy"]) == (3, pytest.approx(2 / 3))
    assert (used["w-b"]["n"], used["w-b"]["n_graded"], used["w-b"]["accuracy"]) == (4, 3, 1.0)
    assert used["w-c"]["accuracy"] == 0.5
    final = _rows(q.accuracy_by(lake, "final_worker"), "final_worker")
    assert (final["w-a"]["n"], final["w-a"]["accuracy"]) == (1, 0.0)
    assert (final["w-b"]["n"], final["w-b"]["accuracy"]) == (4, 1.0)


def test_calls_tokens_dollars_per_question(lake):
    df = q.cost_per_question(lake, run_id="r1")
    assert df["question_id"].to_list() == ["gsm8k/1", "mmlu/3", "gsm8k/2"]   # most expensive first
    g1 = df.row(0, named=True)
    assert (g1["n_samples"], g1["mean_calls"], g1["mean_tokens"]) == (2, 2.0, 220.0)
    assert g1["mean_cost_usd"] == pytest.approx(0.04) and g1["total_cost_usd"] == pytest.approx(0.08)
    assert df.row(2, named=True)["mean_calls"] == 0.5
    summary = _rows(q.cost_summary(lake, "run_id"), "run_id")
    assert summary["r1"]["n_questions"] == 3 and summary["r1"]["total_dollars"] == pytest.approx(0.13)


def test_worker_usage_shares_by_domain_and_step(lake):
    dom = q.worker_usage(lake, "domain")
    math = {r["worker"]: r["share"] for r in dom.filter(pl.col("domain") == "math").iter_rows(named=True)}
    assert math == pytest.approx({"w-a": 3 / 7, "w-b": 2 / 7, "w-c": 2 / 7})
    assert dom.filter(pl.col("domain") == "knowledge").rows() == [("knowledge", "w-b", 2, 1.0)]
    step = q.worker_usage(lake, "step")
    s0 = {r["worker"]: r["n_calls"] for r in step.filter(pl.col("step") == 0).iter_rows(named=True)}
    assert s0 == {"w-a": 3, "w-b": 2, "w-c": 2}
    assert step.filter(pl.col("step") == 1).rows() == [(1, "w-b", 2, 1.0)]


def test_workflow_length_distribution(lake):
    df = q.workflow_length(lake)
    assert df.filter(pl.col("domain") == "math").select("n_steps", "n", "share").rows() == \
        [(1, 3, pytest.approx(0.6)), (2, 2, pytest.approx(0.4))]
    assert df.filter(pl.col("domain") == "knowledge").select("n_steps", "n").rows() == [(1, 2)]


def test_failure_taxonomy(lake):
    df = q.failure_taxonomy(lake)
    got = {(r["source"], r["cls"]): (r["n"], r["share"]) for r in df.iter_rows(named=True)}
    assert got == {("parse_error", "model_id"): (1, pytest.approx(1 / 8)),
                   ("infra", "rate_limited"): (1, pytest.approx(1 / 8)),
                   ("call", "rate_limited"): (1, pytest.approx(1 / 9))}


def test_accuracy_vs_cost(lake):
    df = q.accuracy_vs_cost(lake)
    r = {(x["run_id"], x["dataset"]): x for x in df.iter_rows(named=True)}
    assert r[("r1", "gsm8k")]["accuracy"] == pytest.approx(2 / 3)
    assert r[("r1", "gsm8k")]["dollars_per_question"] == pytest.approx(0.0225)
    assert r[("r2", "gsm8k")]["dollars_per_question"] == pytest.approx(0.01)


@pytest.mark.parametrize("engine", ["duckdb", "polars"])
def test_sql_over_both_views(lake, engine):
    got = q.sql(lake, "SELECT dataset, COUNT(*) AS n FROM trajectories GROUP BY dataset ORDER BY dataset",
                engine=engine)
    assert got.rows() == [("gsm8k", 6), ("mmlu", 2)]
    joined = q.sql(lake, "SELECT c.worker, SUM(CAST(t.correct AS INT)) AS right_answers FROM calls c "
                         "JOIN trajectories t ON c.trajectory_id = t.trajectory_id "
                         "WHERE t.run_id = 'r1' GROUP BY c.worker ORDER BY c.worker", engine=engine)
    assert joined.rows() == [("w-a", 2), ("w-b", 3)]


def test_sql_on_an_empty_lake_has_the_columns(tmp_path):
    assert q.sql(str(tmp_path), "SELECT count(*) AS n, max(cost_usd) AS c FROM trajectories").rows() == [(0, None)]
    assert q.accuracy_by(str(tmp_path), "dataset").height == 0


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "conductor", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)


def test_query_cli_prints_table_csv_and_json(lake):
    sql = "SELECT run_id, COUNT(*) AS n FROM trajectories GROUP BY run_id ORDER BY run_id"
    r = _cli("query", sql, "--lake", lake, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [{"run_id": "r1", "n": 6}, {"run_id": "r2", "n": 2}]
    r = _cli("query", "SELECT nope FROM trajectories", "--lake", lake)
    assert r.returncode == 2 and r.stderr.startswith("error: query failed") and len(r.stderr.splitlines()) == 1
    # the other formats and commands in-process (same typer app, no interpreter start-up each time)
    from typer.testing import CliRunner

    from conductor.cli import app

    run = CliRunner().invoke
    r = run(app, ["query", sql, "--lake", lake, "-f", "csv"])
    assert r.exit_code == 0 and r.stdout.splitlines() == ["run_id,n", "r1,6", "r2,2"]
    # nested columns (list of structs, list of strings) come out as JSON text, equal to the JSON format's values
    nested = "SELECT trajectory_id, steps, subpool FROM trajectories ORDER BY trajectory_id"
    as_csv = list(csv.DictReader(io.StringIO(run(app, ["query", nested, "--lake", lake, "-f", "csv"]).stdout)))
    as_json = json.loads(run(app, ["query", nested, "--lake", lake, "-f", "json"]).stdout)
    assert len(as_csv) == len(as_json) == 8 and any(r["steps"] for r in as_json)
    assert [{k: json.loads(v) if k != "trajectory_id" else v for k, v in r.items()} for r in as_csv] == as_json
    r = run(app, ["query", sql, "--lake", lake, "--engine", "polars"])
    assert r.exit_code == 0 and "r1" in r.stdout and "│" in r.stdout
    r = run(app, ["lake", "stats", "--lake", lake, "-f", "csv"])
    assert r.exit_code == 0 and "rollout,2026-11-20,r1,6,3,2" in r.stdout
    r = run(app, ["query", sql, "--lake", lake, "-f", "xml"])
    assert r.exit_code == 2 and "--format must be one of" in r.stderr
    r = run(app, ["query", sql, "--lake", lake + "/missing"])
    assert r.exit_code == 2 and "no such directory" in r.stderr


def test_cli_refuses_an_incompatible_file_in_one_line(tmp_path):
    write_shard(tmp_path, small_lake_records()[:2], "0")
    row = _drop_keys(trajectory_row(traj("r9", "q", 0)))
    schema = pa.schema([pa.field("n_calls", pa.string()) if f.name == "n_calls" else f
                        for f in file_schema("trajectories")])
    row["n_calls"] = "one"
    d = tmp_path / "trajectories/kind=rollout/date=2026-11-20/run_id=r9"
    d.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([row], schema=schema), d / "shard-0.parquet")
    r = _cli("query", "SELECT count(*) FROM trajectories", "--lake", str(tmp_path))
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1
    assert "run_id=r9/shard-0.parquet" in r.stderr and "column n_calls" in r.stderr


def _nontrivial_png(path: Path) -> None:
    assert path.exists() and path.stat().st_size > 10_000
    img = mpimg.imread(path)
    assert img.shape[0] > 200 and img.shape[1] > 300
    colours = np.unique((img[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 20   # bars, text and lines, not a blank canvas


def test_report_renders_markdown_and_plots(lake, tmp_path):
    rep = render_report(lake, tmp_path / "rep", run_id="r1")
    assert set(rep.plots) == {"accuracy_vs_cost", "workflow_length", "worker_usage", "failure_taxonomy"}
    for p in rep.plots.values():
        _nontrivial_png(p)
    md = rep.markdown.read_text()
    assert "scope: run_id=r1" in md and "| gsm8k" in md and "![worker usage](worker_usage.png)" in md
    assert "r2" not in rep.tables["accuracy_vs_cost"]["run_id"].to_list()


def test_report_cli(lake, tmp_path):
    from typer.testing import CliRunner

    from conductor.cli import app

    r = CliRunner().invoke(app, ["report", "--lake", lake, "--out", str(tmp_path / "out"), "--kind", "eval"])
    assert r.exit_code == 0, r.stderr
    paths = [Path(p) for p in r.stdout.split()]
    assert paths[0].name == "report.md" and len(paths) == 5
    for p in paths[1:]:
        _nontrivial_png(p)
