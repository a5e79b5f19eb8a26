"""Lake compaction: fewer, bigger files; the same rows and query results; resume still sees every shard.

Real Parquet files on disk, real subprocesses killed with SIGKILL mid-compaction, the real answer flow.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from conductor.lake.compact import compact
from conductor.lake.queries import lake_stats, sql, standard_report
from conductor.lake.reader import open_lake, scan
from conductor.lake.synthetic import synthetic_trajectories
from conductor.lake.writer import shard_done, write_shard

ROOT = Path(__file__).resolve().parent.parent


def _lake(root: Path, shards: int = 40, per_shard: int = 5, run_id: str = "r1") -> list:
    ts = list(synthetic_trajectories(shards * per_shard, run_id=run_id, kind="answer", seed=3,
                                     prompt_chars=400, completion_tokens=40, response_chars=100))
    for i in range(shards):
        write_shard(str(root), ts[i * per_shard:(i + 1) * per_shard], f"{i:05d}")
    return ts


def _rows(root: Path) -> dict[str, pl.DataFrame]:
    return {"trajectories": scan(str(root), "trajectories").collect().sort("trajectory_id"),
            "calls": scan(str(root), "calls").collect().sort(["trajectory_id", "call_index"])}


def _canonical(df: pl.DataFrame) -> pl.DataFrame:
    """Rows in an order that does not hang on float rounding (a table sorted by a mean may swap near-ties)."""
    return df.sort([c for c, t in df.schema.items() if not t.is_float()], nulls_last=True)


def _files(root: Path, table: str = "trajectories") -> list[str]:
    return sorted(p.name for p in (root / table).rglob("*.parquet"))


def test_compaction_keeps_every_row_and_query_result(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    _lake(root)
    _lake(root, shards=3, run_id="other")                      # another run: untouched by --run-id r1
    rows, report, stats = _rows(root), standard_report(str(root)), lake_stats(str(root))
    n_sql = sql(str(root), "SELECT count(*) AS n, sum(n_calls) AS c FROM trajectories")

    rep = compact(str(root), run_id="r1", target_mb=0.5)
    assert rep.files_before == 80 and rep.files_after < 10 and rep.rows == 200
    assert len(_files(root)) == rep.files_after // 2 + 3
    assert all(n.startswith("compact-") for n in _files(root / "trajectories" / "kind=answer" / "date=2026-11-21"
                                                         / "run_id=r1", ""))
    after = _rows(root)
    for table in rows:                         # the very same rows, value for value
        assert after[table].equals(rows[table]), table
    for name, df in standard_report(str(root)).items():    # aggregates: same up to float summation order
        assert_frame_equal(_canonical(df), _canonical(report[name]), check_exact=False, rel_tol=1e-12)
    assert_frame_equal(lake_stats(str(root)), stats,       # shards are still counted from the shard column;
                       check_exact=False, rel_tol=1e-12)   # dollars summed in another order
    assert sql(str(root), "SELECT count(*) AS n, sum(n_calls) AS c FROM trajectories").equals(n_sql)

    again = compact(str(root), run_id="r1", target_mb=0.5)    # idempotent: nothing left to merge
    assert again.written == 0 and again.files_after == rep.files_after


def test_compacted_shards_are_still_done(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    _lake(root, shards=12)
    compact(str(root), run_id="r1", target_mb=1000)
    assert _files(root)[0].startswith("compact-") and len(_files(root)) == 1
    assert all(shard_done(str(root), "answer", "r1", f"{i:05d}") for i in range(12))
    assert not shard_done(str(root), "answer", "r1", "00012")
    assert not shard_done(str(root), "answer", "r2", "00000")


def test_a_rewritten_shard_replaces_its_rows_in_the_compacted_file(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    ts = _lake(root, shards=6)
    compact(str(root), run_id="r1", target_mb=1000)
    redo = ts[10:15]
    for t in redo:
        t.final_answer = "rewritten"
    write_shard(str(root), redo, "00002")
    df = scan(str(root)).collect()
    assert df.height == 30 and df["trajectory_id"].n_unique() == 30
    assert sorted(df.filter(pl.col("final_answer") == "rewritten")["trajectory_id"]) == sorted(
        t.trajectory_id for t in redo)
    assert scan(str(root), "calls").collect().height == sum(len(t.calls) for t in ts)
    assert shard_done(str(root), "answer", "r1", "00002") and shard_done(str(root), "answer", "r1", "00003")


KILLER = textwrap.dedent('''
    import logging, sys
    from conductor.lake.compact import compact
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    compact(sys.argv[1], run_id="r1", target_mb=float(sys.argv[2]))
''')


def _kill_when(root: Path, ready, target_mb: float = 0.3) -> bool:
    """Run a compaction in a subprocess and SIGKILL it as soon as ``ready(root)``; True if it was killed."""
    p = subprocess.Popen([sys.executable, "-c", KILLER, str(root), str(target_mb)], cwd=str(ROOT),
                         stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while p.poll() is None and time.time() < deadline:
        if ready(root):
            os.kill(p.pid, signal.SIGKILL)
            break
        time.sleep(0.001)
    p.wait(60)
    return p.returncode == -signal.SIGKILL


def _partial_calls(root: Path) -> bool:
    """A compacted calls file exists whose trajectories twin is not there yet (between the two commits)."""
    for c in (root / "calls").rglob("compact-*.parquet"):
        if not (root / "trajectories" / c.relative_to(root / "calls")).exists():
            return True
    return False


def _one_commit(root: Path) -> bool:
    return any((root / "trajectories").rglob("compact-*.parquet"))


def _temp_file(root: Path) -> bool:
    return any((root / "calls").rglob(".compact-*.tmp")) or any((root / "trajectories").rglob(".compact-*.tmp"))


@pytest.mark.parametrize("moment", [_temp_file, _partial_calls, _one_commit])
def test_kill_9_mid_compaction_leaves_each_row_exactly_once(tmp_path: Path, moment) -> None:
    root = tmp_path / "lake"
    _lake(root, shards=60)
    rows = _rows(root)
    killed = _kill_when(root, moment)
    after = _rows(root)                      # readable, every row exactly once, whatever the moment
    for table in rows:
        assert after[table].equals(rows[table]), (table, killed)
    assert open_lake(str(root)).skipped == []
    rep = compact(str(root), run_id="r1", target_mb=0.3)      # the next run finishes the job
    assert _rows(root)["trajectories"].equals(rows["trajectories"])
    assert _rows(root)["calls"].equals(rows["calls"])
    assert not any(n.startswith("shard-") for n in _files(root) + _files(root, "calls"))
    assert compact(str(root), run_id="r1", target_mb=0.3).written == 0
    assert killed and rep.written >= 1


def test_cli_compacts_and_reports(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    _lake(root, shards=8)
    r = subprocess.run([sys.executable, "-m", "conductor.cli", "lake", "compact", "--lake", str(root),
                        "--run-id", "r1"], capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"compacted {root} run r1: 1 partitions: 16 -> 2 files")
    r = subprocess.run([sys.executable, "-m", "conductor.cli", "lake", "compact", "--lake", str(tmp_path / "none")],
                       capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    assert r.returncode == 2 and r.stderr.strip() == f"error: lake {tmp_path / 'none'}: no such directory"


def test_answer_rerun_after_compaction_redoes_nothing(tmp_path: Path) -> None:
    from conductor.run.config import AnswerConfig
    from flows.answer import answer_flow

    rows = [{"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(7)]
    qfile = tmp_path / "q.jsonl"
    qfile.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "out"
    kw = dict(questions=str(qfile), out=str(out), pool=str(ROOT / "data/pools/simulated.yaml"),
              conductor="fixed:0", shard_size=2, show_progress=False)
    s1 = answer_flow(AnswerConfig(**kw))
    lake = out / "lake"
    assert len(_files(lake)) == 4
    compact(str(lake), target_mb=1000)
    compacted = _files(lake) + _files(lake, "calls")
    assert len(compacted) == 2 and all(n.startswith("compact-") for n in compacted)
    s2 = answer_flow(AnswerConfig(**kw))
    assert _files(lake) + _files(lake, "calls") == compacted       # no shard was written again
    assert s2.trajectories == s1.trajectories == 7 and s2.accuracy == s1.accuracy


def test_compaction_on_s3(tmp_path: Path) -> None:
    """The same on a real S3 API (moto server on loopback): objects are PUT whole, so no temp names."""
    from tests.s3_server import moto_s3

    with moto_s3("lake-bucket", "AKIACOMPACTTEST", "compact-secret-value") as (_, _, fs):
        root = "s3://lake-bucket/lake"
        ts = list(synthetic_trajectories(40, run_id="r1", kind="answer", seed=3, prompt_chars=400,
                                         completion_tokens=40, response_chars=100))
        for i in range(8):
            write_shard(root, ts[i * 5:(i + 1) * 5], f"{i:05d}")
        rows = scan(root).collect().sort("trajectory_id")
        rep = compact(root, run_id="r1")
        assert rep.files_before == 16 and rep.files_after == 2
        assert scan(root).collect().sort("trajectory_id").equals(rows)
        assert [p.rsplit("/", 1)[1][:8] for p in fs.find("lake-bucket/lake")] == ["compact-", "compact-"]
        assert all(shard_done(root, "answer", "r1", f"{i:05d}") for i in range(8))
        assert compact(root, run_id="r1").written == 0
