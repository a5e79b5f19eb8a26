"""Lake writes and reads on real Parquet files: round trip, idempotent reruns, schema evolution,
corrupt files skipped by name, incompatible schemas refused."""

from __future__ import annotations

import dataclasses
import logging
import os

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conductor.lake import LakeSchemaError, load_trajectories, open_lake, scan, shard_done, write_shard
from conductor.lake.schema import (
    CALLS_SCHEMA,
    SCHEMA_VERSION,
    TRAJECTORIES_SCHEMA,
    file_schema,
    trajectory_row,
)
from conductor.lake.writer import _drop_keys
from conductor.trajectory import Round, Trajectory
from lake_records import small_lake_records, traj


def _files(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def test_schema_covers_every_dataclass_field():
    cols = set(TRAJECTORIES_SCHEMA.names)
    for f in dataclasses.fields(Trajectory):
        if f.name not in ("rounds", "calls"):
            assert f.name in cols
    for f in dataclasses.fields(Round):
        if f.name != "depth":
            assert f.name in cols or f"root_{f.name}" in cols
    assert {"n_calls", "tokens", "cost_usd", "n_steps", "recursion_depth", "parse_status",
            "completion_token_ids", "completion_logprobs", "recursion_rounds"} <= cols
    assert {"trajectory_id", "call_index", "worker", "domain", "kind", "run_id"} <= set(CALLS_SCHEMA.names)
    meta = file_schema("trajectories").metadata
    assert meta[b"conductor.schema_version"] == str(SCHEMA_VERSION).encode()
    assert "kind" not in file_schema("calls").names   # partition keys live in the path


def test_round_trip_rebuilds_records_exactly(tmp_path):
    records = small_lake_records()
    write_shard(tmp_path, records[:6], "00000")
    write_shard(tmp_path, records[6:], "00000")   # another run: its own partition, same shard name
    assert _files(tmp_path) == [
        "calls/kind=eval/date=2026-11-21/run_id=r2/shard-00000.parquet",
        "calls/kind=rollout/date=2026-11-20/run_id=r1/shard-00000.parquet",
        "trajectories/kind=eval/date=2026-11-21/run_id=r2/shard-00000.parquet",
        "trajectories/kind=rollout/date=2026-11-20/run_id=r1/shard-00000.parquet",
    ]
    back = load_trajectories(str(tmp_path), "r1")
    assert back == records[:6]   # token ids, log-probs, steps, calls, recursion rounds: all of it
    assert back[0].rounds[0].completion_token_ids == [11, 12, 13]
    assert back[4].rounds[1].kept_previous is True and back[4].round_rewards == [1.0, 1.0]
    assert load_trajectories(str(tmp_path), "r2", kind="eval") == records[6:]
    assert load_trajectories(str(tmp_path), "r2", kind="rollout") == []
    df = scan(str(tmp_path)).collect()
    assert df.height == 8 and df["schema_version"].unique().to_list() == [SCHEMA_VERSION]
    row = df.filter(pl.col("trajectory_id") == records[0].trajectory_id).row(0, named=True)
    assert (row["n_calls"], row["tokens"], row["n_steps"], row["cost_usd"]) == (2, 220, 2, pytest.approx(0.04))
    assert row["steps"][1] == {"worker": 1, "subtask": "do part 1", "access": [], "access_all": True}


def test_rerunning_a_shard_replaces_it(tmp_path):
    records = small_lake_records()[:6]
    write_shard(tmp_path, records, "s1")
    write_shard(tmp_path, records, "s1")
    assert scan(str(tmp_path)).collect().height == 6
    assert scan(str(tmp_path), "calls").collect().height == sum(len(t.calls) for t in records)
    write_shard(tmp_path, records[:2], "s1")          # a rerun that produced fewer rows wins entirely
    assert scan(str(tmp_path)).collect().height == 2
    write_shard(tmp_path, records[2:], "s2")
    assert scan(str(tmp_path)).collect().height == 6
    moved = [dataclasses.replace(t, date="2026-11-22") for t in records[:2]]   # rerun on another day
    write_shard(tmp_path, moved, "s1")
    df = scan(str(tmp_path)).collect()
    assert df.height == 6 and df.filter(pl.col("shard") == "s1")["date"].unique().to_list() == ["2026-11-22"]
    assert not [f for f in _files(tmp_path) if "date=2026-11-20" in f and "shard-s1" in f]


def test_shard_done_tracks_the_commit_marker(tmp_path):
    assert not shard_done(tmp_path, "rollout", "r1", "00003")
    write_shard(tmp_path, small_lake_records()[:2], "00003")
    assert shard_done(tmp_path, "rollout", "r1", "00003")
    assert not shard_done(tmp_path, "rollout", "r1", "00004")
    assert not shard_done(tmp_path, "eval", "r1", "00003")


def test_bad_input_fails_with_one_line_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"run_id 'a/b' is not a plain name"):
        write_shard(tmp_path, [traj("a/b", "q", 0)], "0")
    with pytest.raises(ValueError, match=r"shard_id '\.\./x'"):
        write_shard(tmp_path, [traj("r", "q", 0)], "../x")
    bad = traj("r", "q", 0)
    bad.reward = "high"  # type: ignore[assignment]
    with pytest.raises(ValueError, match=rf"trajectory {bad.trajectory_id}: column reward"):
        write_shard(tmp_path, [bad], "0")
    with pytest.raises(ValueError, match="no trajectories"):
        write_shard(tmp_path, [], "0")
    assert _files(tmp_path) == []   # nothing half-written


def _write_raw(root, table: str, part: str, name: str, tbl: pa.Table) -> str:
    d = root / table / part
    d.mkdir(parents=True, exist_ok=True)
    pq.write_table(tbl, d / name)
    return str(d / name)


def test_older_files_without_newer_fields_stay_readable(tmp_path):
    """A v0 file lacks a top-level column and a field inside the nested rounds struct."""
    t = traj("old", "gsm8k/9", 0, workers=["w-a"], recursion=True)
    row = _drop_keys(trajectory_row(t))
    current = file_schema("trajectories")
    dropped = {"round_rewards", "n_cache_hits", "root_kept_previous"}
    rr = current.field("recursion_rounds").type.value_type
    old_round = pa.struct([f for f in rr if f.name != "kept_previous"])
    fields = [f for f in current if f.name not in dropped]
    fields = [pa.field(f.name, pa.list_(old_round)) if f.name == "recursion_rounds" else f for f in fields]
    old_schema = pa.schema(fields).with_metadata({b"conductor.schema_version": b"0"})
    for r in row["recursion_rounds"]:
        del r["kept_previous"]
    _write_raw(tmp_path, "trajectories", "kind=rollout/date=2026-01-01/run_id=old", "shard-0.parquet",
               pa.Table.from_pylist([{k: v for k, v in row.items() if k not in dropped}], schema=old_schema))
    write_shard(tmp_path, [traj("new", "gsm8k/9", 0, recursion=True)], "0")   # a current file next to it

    df = scan(str(tmp_path)).collect()
    assert df.height == 2 and df.columns == TRAJECTORIES_SCHEMA.names
    old = df.filter(pl.col("run_id") == "old").row(0, named=True)
    assert old["round_rewards"] is None and old["n_cache_hits"] is None
    assert old["recursion_rounds"][0]["kept_previous"] is None and old["recursion_rounds"][0]["final_answer"] == "42"
    back = load_trajectories(str(tmp_path), "old")[0]
    assert back.rounds[1].kept_previous is False and back.round_rewards is None   # dataclass defaults
    assert back.rounds[0].completion_logprobs == [-0.5, -0.25, -0.125]
    from conductor.lake.queries import sql
    got = sql(str(tmp_path), "select run_id, round_rewards, n_cache_hits from trajectories order by run_id")
    assert got.rows() == [("new", [1.0, 1.0], 1), ("old", None, None)]


def test_corrupt_file_is_named_and_skipped(tmp_path, caplog):
    write_shard(tmp_path, small_lake_records()[:6], "good")
    good = tmp_path / "trajectories/kind=rollout/date=2026-11-20/run_id=r1/shard-good.parquet"
    (good.parent / "shard-garbage.parquet").write_bytes(b"this is not parquet at all" * 100)
    data = good.read_bytes()
    (good.parent / "shard-truncated.parquet").write_bytes(data[: len(data) // 2])
    with caplog.at_level(logging.WARNING, logger="conductor.lake"):
        lk = open_lake(str(tmp_path))
        df = lk.scan().collect()
    assert df.height == 6
    assert sorted(os.path.basename(s) for s in lk.skipped) == ["shard-garbage.parquet", "shard-truncated.parquet"]
    assert "shard-garbage.parquet" in caplog.text and "shard-truncated.parquet" in caplog.text
    from conductor.lake.queries import accuracy_by, sql
    assert accuracy_by(str(tmp_path), "dataset")["n"].sum() == 6
    assert sql(str(tmp_path), "select count(*) from trajectories").item() == 6


def test_incompatible_schema_is_refused_naming_file_and_column(tmp_path):
    write_shard(tmp_path, small_lake_records()[:2], "0")
    row = _drop_keys(trajectory_row(traj("r9", "q", 0)))
    schema = pa.schema([pa.field("reward", pa.string()) if f.name == "reward" else f
                        for f in file_schema("trajectories")])
    row["reward"] = "1.0"
    path = _write_raw(tmp_path, "trajectories", "kind=rollout/date=2026-11-20/run_id=r9", "shard-0.parquet",
                      pa.Table.from_pylist([row], schema=schema))
    with pytest.raises(LakeSchemaError) as e:
        scan(str(tmp_path)).collect()
    msg = str(e.value)
    assert path in msg and "column reward: file has string, schema expects double" in msg and "\n" not in msg
    assert scan(str(tmp_path), run_id="r1").collect().height == 2   # other partitions are still readable


def test_every_column_is_documented():
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "schema.md").read_text()
    assert f"(version {SCHEMA_VERSION})" in doc
    for schema in (TRAJECTORIES_SCHEMA, CALLS_SCHEMA):
        missing = [n for n in schema.names if f"`{n}`" not in doc]
        assert not missing, f"columns missing from docs/schema.md: {missing}"


def test_files_from_a_newer_writer_read_without_their_new_columns(tmp_path):
    row = _drop_keys(trajectory_row(traj("new", "gsm8k/9", 0)))
    row["future_score"] = 0.25
    schema = file_schema("trajectories").append(pa.field("future_score", pa.float64()))
    schema = schema.with_metadata({b"conductor.schema_version": str(SCHEMA_VERSION + 1).encode()})
    _write_raw(tmp_path, "trajectories", "kind=rollout/date=2026-11-20/run_id=new", "shard-0.parquet",
               pa.Table.from_pylist([row], schema=schema))
    df = scan(str(tmp_path)).collect()
    assert df.height == 1 and "future_score" not in df.columns and df["n_steps"].item() == 1
