"""`conductor answer --dask`: bulk answering with its shards on a real Dask cluster (a ``distributed.LocalCluster``
of 2 worker processes, 1 thread each, on loopback), through prefect-dask's ``DaskTaskRunner``, over the simulated
pool; every shard committed exactly once, the same answers as the in-process run, a rerun writes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SIM_POOL = str(ROOT / "data/pools/simulated.yaml")


def _answer(questions: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "conductor", "answer", str(questions), "--out", str(out), "--pool",
                           SIM_POOL, "--conductor", "fixed:0", "--shard-size", "2", *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _files(out: Path) -> dict[str, tuple[int, int]]:
    """Each committed shard file with its inode and modification time (a rewrite changes them)."""
    return {str(p.relative_to(out)): (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in (out / "lake" / "trajectories").rglob("*.parquet")}


@pytest.fixture(scope="module")
def cluster():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as c, Client(c) as client:
        yield c.scheduler_address, client


def test_answer_on_a_dask_cluster_commits_each_shard_once(tmp_path: Path, cluster) -> None:
    address, client = cluster
    qs = tmp_path / "q.jsonl"
    qs.write_text("".join(json.dumps({"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                          for i in range(7)), encoding="utf-8")
    out = tmp_path / "dask"
    r = _answer(qs, out, "--dask", address)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "error" not in r.stderr.lower() and "Traceback" not in r.stderr

    from conductor.lake.reader import scan

    df = scan(str(out / "lake")).collect()
    assert df.height == 7 and df["trajectory_id"].n_unique() == 7      # each question once
    assert df["shard"].n_unique() == 4 and len(_files(out)) == 4       # 7 questions in shards of 2
    # the shards ran on the cluster's worker processes: each that took one built its own runtime there
    built = client.run(lambda: len(__import__("conductor.run.runtime", fromlist=["_SHARED"])._SHARED))
    assert len(built) == 2 and sum(built.values()) >= 1, built

    # the same answers as the same command without --dask (same run id, same trajectory ids)
    here = tmp_path / "here"
    assert _answer(qs, here).returncode == 0
    dask_answers = (out / "answers.jsonl").read_text().splitlines()
    assert dask_answers == (here / "answers.jsonl").read_text().splitlines() and len(dask_answers) == 7

    # a rerun on the cluster finds every shard committed: nothing is rewritten
    before = _files(out)
    again = _answer(qs, out, "--dask", address)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _files(out) == before
    assert scan(str(out / "lake")).collect().height == 7


def test_a_shard_task_run_twice_commits_once(tmp_path: Path) -> None:
    """What a retried or duplicated task does (the cluster may run a task again after a worker is lost): a
    shard whose file is committed is not run or written again."""
    from conductor.data.questions import Question
    from conductor.run.config import AnswerConfig
    from conductor.run.pipeline import RunSpec
    from conductor.run.preflight import prepare_answer
    from conductor.run.shards import pending_shards
    from tasks.shard import answer_shard_task

    qs = tmp_path / "q.jsonl"
    qs.write_text("".join(json.dumps({"id": f"q{i}", "question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                          for i in range(3)), encoding="utf-8")
    inp = prepare_answer(AnswerConfig(questions=str(qs), out=str(tmp_path / "out"), pool=SIM_POOL,
                                      conductor="fixed:0", shard_size=3, show_progress=False))
    spec = RunSpec.of(inp.config, inp.pool, inp.checkpoint, inp.settings_key)
    [(sid, sq)] = pending_shards(inp.questions, spec, str(inp.config.lake), 3).todo
    assert all(isinstance(q, Question) for q in sq)
    run = answer_shard_task     # a task run of its own (Prefect's ephemeral API), as on a worker
    assert run(sq, spec, sid, str(inp.config.lake), inp.config.conductor, inp.config.cache) == 3
    files = _files(tmp_path / "out")
    assert run(sq, spec, sid, str(inp.config.lake), inp.config.conductor, inp.config.cache) == 0
    assert _files(tmp_path / "out") == files and len(files) == 1


@pytest.mark.parametrize(("extra", "says"), [
    (["--dask", "local:0"], "--dask 'local:0': local:N needs a number of workers >= 1"),
    (["--dask", "local:2", "--batch"], "--batch sends every shard's calls through shared provider batches"),
    (["--dask", "127.0.0.1:1"], "--dask 127.0.0.1:1: cannot reach the scheduler"),
])
def test_bad_dask_options_are_one_line_before_anything_starts(tmp_path: Path, extra: list[str], says: str) -> None:
    qs = tmp_path / "q.jsonl"
    qs.write_text(json.dumps({"id": "q0", "question": "What is 1 + 1?", "answer": "2"}) + "\n", encoding="utf-8")
    r = _answer(qs, tmp_path / "out", *extra)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr
    assert r.stderr.startswith("error: ") and says in r.stderr
    assert not (tmp_path / "out").exists()
