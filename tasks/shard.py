"""A self-contained shard task: everything it needs arrives as plain data, so it can run on any
task runner (threads, a Dask cluster, Ray) and builds or reuses its own runtime there."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from prefect import task
from prefect.cache_policies import NONE

from conductor.run.pipeline import RunSpec

if TYPE_CHECKING:
    from conductor.data.questions import Question
    from conductor.execution.shared_limits import LimitsSpec
    from conductor.policy.spec import ConductorSpec


@task(name="rollout-shard", cache_policy=NONE, retries=1, retry_delay_seconds=5)
def run_shard_task(questions: Sequence[Question], spec: RunSpec, shard_id: str, lake: str, conductor: ConductorSpec,
                   cache_path: str | None = None, limits: LimitsSpec | str | None = None) -> int:
    """Run one shard end to end through the shard loop and commit it; a committed shard is skipped (idempotent
    reruns). Rollout and eval runs resume by shard, so a failing conductor raises (the task retries) rather than
    committing infra-failed rows the rerun would keep."""
    from dataclasses import replace

    from prefect import get_run_logger

    from conductor.run.runtime import shared_live
    from conductor.run.shards import ShardLoop, Stages, unfinished_shards

    todo = unfinished_shards([(shard_id, questions)], spec, lake)
    if not todo:
        return 0
    live = shared_live(spec.pool, conductor)
    loop = ShardLoop(replace(spec, pool=live.pool), live.policy, live.executor(cache_path, limits=limits), lake=lake,
                     stages=Stages(logger=get_run_logger), record_failures=False)
    return loop.run(todo)


@task(name="answer-shard", cache_policy=NONE, retries=1, retry_delay_seconds=5)
def answer_shard_task(questions: Sequence[Question], spec: RunSpec, shard_id: str, lake: str, conductor: ConductorSpec,
                      cache_path: str | None = None, replay: bool = False,
                      limits: LimitsSpec | str | None = None) -> int:
    """One shard of `conductor answer --dask` on the worker's own runtime, committed as in the in-process run: a
    shard is named by its questions' content and settings (conductor/run/shards.py: ``pending_shards``), so a
    committed one is skipped here (a task retried or run twice by the cluster commits it once) and a failing
    conductor leaves infra-failed rows that the next run retries. Returns trajectories written."""
    from dataclasses import replace

    from prefect import get_run_logger

    from conductor.run.runtime import shared_live
    from conductor.run.shards import ShardLoop, Stages, unfinished_shards

    todo = unfinished_shards([(shard_id, questions)], spec, lake)
    if not todo:
        return 0
    live = shared_live(spec.pool, conductor)
    executor = live.executor(cache_path, replay=replay, limits=limits)
    loop = ShardLoop(replace(spec, pool=live.pool), live.cached_policy(executor), executor, lake=lake,
                     stages=Stages(logger=get_run_logger))
    return loop.run(todo)
