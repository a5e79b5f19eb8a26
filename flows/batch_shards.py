"""The shard loop in batch mode: every pending shard's workflows execute together, wave by wave.

WHY not shard by shard: a provider batch takes minutes to hours whatever its size, so the ready steps of
*all* questions of the run must share each batch; shards stay the unit of commit. The conductor writes
every shard's workflows first, the waves run, then each shard is graded and committed as in ``run_shards``.
A killed run resumes: committed shards are skipped, and the batches already created are polled again
(their handles are in the batch store next to the response cache), so nothing is submitted twice.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

from prefect import get_run_logger

from conductor.pipeline import RunSpec
from flows.shards import MAX_CONDUCTOR_FAILURES, generate_or_record
from tasks.batch import execute_waves_task
from tasks.lake import write_shard_task
from tasks.pipeline import score_shard


def batch_executor(executor: Any, enabled: bool = True, poll_s: float = 60.0) -> Any:
    """A ``BatchExecutor`` over the run's executor (same cache and limits), its store beside the cache."""
    from conductor.batch.executor import BatchExecutor
    from conductor.batch.settings import BatchSettings
    from conductor.batch.store import BatchStore

    if executor.cache is None:
        raise ValueError("batch mode needs a response cache (its batch store lives beside it)")
    store = BatchStore(BatchStore.beside(executor.cache.path))
    return BatchExecutor.wrapping(executor, store, BatchSettings(enabled=enabled, poll_s=poll_s))


def run_shards_batched(todo: Sequence[tuple[str, Sequence[Any]]], spec: RunSpec, lake: str, policy: Any,
                       executor: Any, on_done: Any = None, scheme: Any = None, *, enabled: bool = True,
                       poll_s: float = 60.0) -> int:
    """Plan and generate every pending shard, execute them all in waves, then grade and commit each shard.

    A shard whose conductor call fails is committed as infra-failed (a rerun retries it), as in ``run_shards``;
    after ``MAX_CONDUCTOR_FAILURES`` such shards in a row, or a refused key, no more shards are generated."""
    log = get_run_logger()
    planned, written, failures = [], 0, 0
    for sid, sq in todo:
        trajs, error = generate_or_record(sid, sq, spec, lake, policy, on_done)
        if error is not None:
            written += len(trajs)
            failures += 1
            if failures >= MAX_CONDUCTOR_FAILURES or error.kind == "auth":
                break
            continue
        failures = 0
        planned.append((sid, sq, trajs))
    everything = [t for _, _, trajs in planned for t in trajs]
    if not everything:
        return written
    bex = batch_executor(executor, enabled, poll_s)
    try:
        execute_waves_task(everything, spec, bex, policy, on_done)
        log.info("batch mode: %s", ", ".join(f"{k}={v}" for k, v in sorted(bex.batch_stats.items())) or "no batches")
    finally:
        bex.store.close()
    for sid, sq, trajs in planned:
        score_shard(trajs, sq, scheme)
        write_shard_task(lake, trajs, sid)
        written += len(trajs)
        log.info("%s shard %s committed: %d trajectories", spec.kind, sid, len(trajs))
    return written


def batch_shard_runner(batch: bool, poll_s: float, pool: Any) -> Any:
    """The shard loop for this run: ``run_shards_batched`` when ``--batch`` is on or a worker says ``batch: true``,
    else None (the ordinary ``run_shards``)."""
    if not batch and not any(getattr(w, "batch", None) for w in pool.workers):
        return None
    return functools.partial(run_shards_batched, enabled=batch, poll_s=poll_s)
