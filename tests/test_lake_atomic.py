"""A writer SIGKILLed in the middle of a big shard leaves no visible partial file (real subprocess, real kill)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conductor.lake import open_lake, shard_done, write_shard
from lake_records import small_lake_records

ROOT = Path(__file__).resolve().parent.parent
PART = "kind=rollout/date=2026-11-20/run_id=r1"

# ~200 trajectories with 400 KB high-entropy prompts: a ~40 MB file that takes a while to write.
WRITER = """
import os, sys
sys.path.insert(0, {tests!r})
from lake_records import traj
from conductor.lake import write_shard
big = []
for i in range(200):
    t = traj("r1", f"gsm8k/big{{i}}", 0, workers=["w-a"])
    t.rounds[0].prompt = os.urandom(200_000).hex()
    big.append(t)
print("writing", flush=True)
write_shard({lake!r}, big, "s0")
print("done", flush=True)
"""


def _visible(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.parquet"))


def _kill_mid_write(lake: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", WRITER.format(tests=str(ROOT / "tests"), lake=str(lake))],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    traj_dir = lake / "trajectories" / PART
    deadline = time.monotonic() + 60
    killed_at = None
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            temps = list(traj_dir.glob(".shard-s0.parquet.*.tmp")) if traj_dir.exists() else []
            if temps and temps[0].stat().st_size > 2_000_000:
                os.kill(proc.pid, signal.SIGKILL)
                killed_at = temps[0].stat().st_size
                break
            time.sleep(0.002)
    finally:
        if proc.poll() is None and killed_at is None:
            proc.kill()
        out, err = proc.communicate(timeout=30)
    assert killed_at is not None, f"writer finished or never started before the kill: {out!r} {err[-500:]!r}"
    assert proc.returncode == -signal.SIGKILL
    assert b"done" not in out


@pytest.mark.parametrize("previous", [False, True], ids=["fresh-shard", "replacing-a-committed-shard"])
def test_sigkill_mid_file_leaves_no_visible_partial_file(tmp_path, previous, caplog):
    lake = tmp_path / "lake"
    before: list[str] = []
    if previous:
        write_shard(lake, small_lake_records()[:6], "s0")
        before = _visible(lake)
    _kill_mid_write(lake)

    leftovers = list((lake / "trajectories" / PART).glob(".*.tmp"))
    assert leftovers, "the killed writer's temp file should exist (hidden), proving the kill was mid-file"
    # The kill hit the trajectories file (the commit marker); the calls file before it was complete.
    assert [v for v in _visible(lake) if v.startswith("trajectories/")] == \
        [v for v in before if v.startswith("trajectories/")]
    for v in _visible(lake):
        pq.read_table(lake / v)                          # every visible file is whole
    with caplog.at_level(logging.INFO, logger="conductor.lake"):
        lk = open_lake(str(lake))
        assert lk.skipped == []                         # nothing corrupt is visible to readers
        assert lk.scan().collect().height == (6 if previous else 0)   # the committed shard is intact
        # the new calls file belongs to no committed trajectories file, so readers ignore it
        assert lk.scan("calls").collect().height == 0
    assert "shard-s0.parquet" in caplog.text
    assert shard_done(lake, "rollout", "r1", "s0") is previous

    # a rerun of the shard commits cleanly next to the leftover temp file
    write_shard(lake, small_lake_records()[:2], "s0")
    assert open_lake(str(lake)).scan().collect().height == 2
    assert open_lake(str(lake)).scan("calls").collect().height == 4
    assert shard_done(lake, "rollout", "r1", "s0")
