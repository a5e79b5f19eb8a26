"""The shard loop every pipeline flow shares: skip committed shards, run the stages as tasks, commit.

Answering, rollouts and evaluation differ only in their RunSpec; this is where
resumability lives: a shard whose trajectories file is in the lake is done.
"""

from __future__ import annotations

from typing import Any, Sequence

from prefect import get_run_logger

from conductor.pipeline import RunSpec
from tasks.lake import shard_done_task, write_shard_task
from tasks.pipeline import execute_shard, generate_shard, plan_shard, score_shard


def pending_shards(questions: Sequence[Any], spec: RunSpec, lake: str, shard_size: int) -> tuple[list, list]:
    """(all shards, shards still to do) as lists of (shard_id, questions)."""
    from conductor.questions import sharded

    shards = list(sharded(questions, shard_size))
    todo = [(sid, sq) for sid, sq in shards if not shard_done_task(lake, spec.kind, spec.run_id, sid)]
    return shards, todo


def run_shards(todo: Sequence[tuple[str, Sequence[Any]]], spec: RunSpec, lake: str, policy: Any, executor: Any,
               on_done: Any = None, scheme: Any = None) -> int:
    """Run and commit each pending shard in order; returns how many trajectories were written."""
    log = get_run_logger()
    written = 0
    for sid, sq in todo:
        trajs = plan_shard(sq, spec, sid)
        trajs = generate_shard(trajs, policy, spec)
        trajs = execute_shard(trajs, spec, executor, policy, on_done)
        trajs = score_shard(trajs, sq, scheme)
        write_shard_task(lake, trajs, sid)
        written += len(trajs)
        log.info("%s shard %s committed: %d trajectories", spec.kind, sid, len(trajs))
    return written
