"""A self-contained shard task: everything it needs arrives as plain data, so it can run on any
task runner (threads, a Dask cluster, Ray) and builds or reuses its own runtime there."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from conductor.run.pipeline import RunSpec


@task(name="rollout-shard", cache_policy=NONE, retries=1, retry_delay_seconds=5)
def run_shard_task(questions: Sequence[Any], spec: RunSpec, shard_id: str, lake: str, conductor: str,
                   cache_path: str | None = None, limits: str | None = None) -> int:
    """Run one shard end to end and commit it; a committed shard is skipped (idempotent reruns)."""
    from dataclasses import replace

    from conductor.lake.writer import shard_done, write_shard
    from conductor.run import pipeline
    from conductor.run.runtime import shared_live

    if shard_done(lake, spec.kind, spec.run_id, shard_id):
        return 0
    live = shared_live(spec.pool, conductor)
    spec = replace(spec, pool=live.pool)
    trajs = pipeline.run_shard(questions, spec, live.policy, live.executor(cache_path, limits=limits), shard=shard_id)
    write_shard(lake, trajs, shard_id)
    return len(trajs)
