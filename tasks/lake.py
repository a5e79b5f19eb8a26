"""Prefect tasks over the trajectory lake: commit a shard, find what a run has already committed."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NONE

from conductor.lake.resume import RunState, committed
from conductor.lake.writer import write_shard
from conductor.trajectory import Trajectory


@task(name="write-shard", cache_policy=NONE, retries=2, retry_delay_seconds=2)
def write_shard_task(lake_root: str, trajectories: list[Trajectory], shard_id: str) -> list[str]:
    return write_shard(lake_root, trajectories, shard_id)


@task(name="committed", cache_policy=NONE)
def committed_task(lake_root: str, kind: str, run_id: str) -> RunState:
    """The run's trajectory ids committed intact (damaged shards are moved aside and so redone)."""
    return committed(lake_root, kind, run_id)
