"""The lake on S3 for real: moto's S3 server on 127.0.0.1, s3fs, polars' and DuckDB's readers.

Nothing is patched: the endpoint and credentials reach every client through the
AWS_* environment (or storage_options), exactly as in production.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conductor.lake import load_trajectories, open_lake, shard_done, write_shard
from conductor.lake import queries as q
from lake_records import small_lake_records

ROOT = Path(__file__).resolve().parent.parent
SECRET = "s3cr3t-never-in-the-lake"


@pytest.fixture(scope="module")
def s3():
    from s3_server import moto_s3

    with moto_s3("lake-bucket", "lake-test-key", SECRET) as (endpoint, env, fs):
        yield {"endpoint": endpoint, "env": env, "fs": fs}


def _keys(fs, prefix: str) -> list[str]:
    fs.invalidate_cache()
    return sorted(p.split("/", 1)[1] for p in fs.find(prefix))


def test_writes_reads_and_reruns_on_s3(s3):
    url = "s3://lake-bucket/lake"
    recs = small_lake_records()
    write_shard(url, recs[:6], "00000")
    write_shard(url, recs[:6], "00000")                 # rerun: replaces, no duplicates
    write_shard(url, recs[6:], "00000")
    assert _keys(s3["fs"], "lake-bucket/lake") == [
        "lake/calls/kind=eval/date=2026-11-21/run_id=r2/shard-00000.parquet",
        "lake/calls/kind=rollout/date=2026-11-20/run_id=r1/shard-00000.parquet",
        "lake/trajectories/kind=eval/date=2026-11-21/run_id=r2/shard-00000.parquet",
        "lake/trajectories/kind=rollout/date=2026-11-20/run_id=r1/shard-00000.parquet",
    ]
    assert shard_done(url, "rollout", "r1", "00000") and not shard_done(url, "rollout", "r1", "00001")
    assert load_trajectories(url, "r1") == recs[:6]
    by = {r["dataset"]: r for r in q.accuracy_by(url, "dataset").iter_rows(named=True)}
    assert by["gsm8k"]["n"] == 6 and by["gsm8k"]["accuracy"] == pytest.approx(0.6)
    assert q.worker_usage(url, "domain", run_id="r2").rows() == [("math", "w-c", 2, 1.0)]
    for engine in ("duckdb", "polars"):
        got = q.sql(url, "SELECT kind, count(*) AS n FROM trajectories GROUP BY kind ORDER BY kind", engine=engine)
        assert got.rows() == [("eval", 2), ("rollout", 6)]
    for key in _keys(s3["fs"], "lake-bucket/lake"):    # credentials never reach the lake
        assert SECRET.encode() not in s3["fs"].cat(f"lake-bucket/{key}")


def test_corrupt_object_is_skipped_by_name(s3, caplog):
    url = "s3://lake-bucket/corrupt"
    write_shard(url, small_lake_records()[:6], "0")
    bad = "lake-bucket/corrupt/trajectories/kind=rollout/date=2026-11-20/run_id=r1/shard-1.parquet"
    s3["fs"].pipe(bad, b"PAR1 but then nothing sensible")
    with caplog.at_level(logging.WARNING, logger="conductor.lake"):
        lk = open_lake(url)
        assert lk.scan().collect().height == 6
    assert lk.skipped == [f"s3://{bad}"] and "shard-1.parquet" in caplog.text


def test_explicit_storage_options_without_endpoint_env(s3, monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    opts = {"endpoint_url": s3["endpoint"], "key": "lake-test-key", "secret": SECRET}
    url = "s3://lake-bucket/opts"
    write_shard(url, small_lake_records()[6:], "0", storage_options=opts)
    lk = open_lake(url, storage_options=opts)
    assert lk.scan("calls").collect().height == 2
    assert q.sql(lk, "SELECT count(*) FROM trajectories").item() == 2


def test_query_cli_against_s3_from_the_environment(s3):
    url = "s3://lake-bucket/cli"
    write_shard(url, small_lake_records()[:6], "0")
    env = {**os.environ, **s3["env"], "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "conductor", "query", "SELECT count(*) AS n FROM calls",
                        "--lake", url, "-f", "csv"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["n", "7"]
