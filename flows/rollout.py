"""Rollouts for GRPO: for each training question a sub-pool, a group of G conductor samples, executed,
scored and committed to the lake with token ids and log-probs. Resumable per shard; shards can fan out on a
Dask cluster (prefect-dask): ``on_dask(rollout_flow, address)(...)``.

    conductor rollout gsm8k_train:8 --lake runs/lake --pool data/pools/simulated.yaml --run-id r1 \\
        --conductor transformers:~/.cache/conductor/models/smollm2-135m-instruct --group-size 4
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from prefect import flow, get_run_logger

from conductor.run.config import RolloutConfig
from conductor.run.pipeline import RunSpec
from conductor.run.shards import ShardLoop, Shards, unfinished_shards
from conductor.run.summary import RunSummary, run_summary
from flows.fanout import on_dask, runs_remotely
from tasks.pipeline import TASK_STAGES

__all__ = ["fan_out_shards", "on_dask", "rollout_flow", "window"]

if TYPE_CHECKING:
    from conductor.execution.shared_limits import LimitsSpec
    from conductor.policy.spec import ConductorSpec

Q = TypeVar("Q")


@flow(name="conductor-rollout", persist_result=False)
def rollout_flow(config: RolloutConfig) -> RunSummary:
    """Write one rollout run (GRPO groups; conductor/run/config.py: ``RolloutConfig``) to the lake; returns
    counts and mean reward.

    ``limits``: the store the shard processes share provider limits through (``sqlite:PATH``, ``prefect``;
    conductor/execution/shared_limits.py); fanned out on Dask/Ray it defaults to ``limits.sqlite`` next to the cache."""
    from conductor.data.questions import sharded
    from conductor.data.questionset import load_questions
    from conductor.run.runtime import checkpoint_of
    from conductor.workers.pool import load_pool
    from conductor.workers.secrets import redact_prefect_logs

    redact_prefect_logs()   # keys never reach Prefect's console or its log store
    log = get_run_logger()
    c = config
    qs = window(load_questions(c.questions), c.offset, c.limit)
    manifest = load_pool(c.pool)
    spec = RunSpec.of(c, manifest, c.checkpoint_id or checkpoint_of(c.conductor))
    shards = list(sharded(qs, c.shard_size))
    log.info("%s run %s: %d questions x %d samples in %d shards", c.kind, c.run_id, len(qs), c.group_size, len(shards))
    todo = unfinished_shards(shards, spec, c.lake)
    limits: LimitsSpec | str | None = c.limits
    if todo and runs_remotely():  # fan out: each Dask/Ray worker builds its own runtime from the plain specs
        from conductor.execution.shared_limits import default_spec

        limits = limits or default_spec(c.cache, fans_out=True)   # one quota for every worker process
        log.info("%s run %s: provider limits shared through %s", c.kind, c.run_id, limits)
        written = fan_out_shards(todo, spec, c.lake, c.conductor, c.cache, limits)
    elif todo:            # in-process: one loaded policy, shards in order
        from dataclasses import replace

        from conductor.run.runtime import shared_live

        live = shared_live(manifest, c.conductor)
        written = ShardLoop(replace(spec, pool=live.pool), live.policy, live.executor(c.cache, limits=limits),
                            lake=c.lake, stages=TASK_STAGES, record_failures=False).run(todo)
    else:
        written = 0
    summary = run_summary(c.lake, c.run_id, c.kind)[0].with_outputs(written_now=written)
    log.info("%s run %s: %d trajectories (%d new), mean reward %s, accuracy %s", c.kind, c.run_id,
             summary.trajectories, written, summary.mean_reward, summary.accuracy)
    return summary


def fan_out_shards(todo: Shards, spec: RunSpec, lake: str, conductor: ConductorSpec, cache: str | None,
                   limits: LimitsSpec | str | None) -> int:
    """Each shard as one self-contained task on the flow's Dask/Ray task runner (tasks/shard.py: the same shard
    loop, on the worker's own runtime); returns trajectories written."""
    from tasks.shard import run_shard_task

    futures = [run_shard_task.submit(sq, spec, sid, lake, conductor, cache, limits) for sid, sq in todo]
    return sum(f.result() for f in futures)


def window(qs: list[Q], offset: int, limit: int | None) -> list[Q]:
    """``limit`` questions from ``offset`` on, wrapping around (iteration i of a training mix); all without either.

    >>> window([1, 2, 3], 2, 2)
    [3, 1]
    >>> window([1, 2, 3], 0, None)
    [1, 2, 3]
    """
    if not (offset or limit is not None):
        return qs
    n = limit if limit is not None else len(qs)
    return [qs[(offset + j) % len(qs)] for j in range(min(n, len(qs)))] if qs else []
