"""The one shard loop of every kind of run (answer, rollout, eval): find what is not done yet, run the
stages as tasks, commit shard by shard.

Resume. Answer runs resume by content (conductor/lake/resume.py, ``pending_shards``): a question is done
when every trajectory id the run gives it (``RunSpec.trajectory_ids``: the question's id and content and the
settings that change answers) is committed intact and not infra-failed. Everything else is regrouped into
shards named by what they hold, so another shard size redoes nothing, an edited question redoes only
itself, and a damaged shard file or an infrastructure failure is redone on the next run. Rollout and eval
runs resume by shard (``unfinished_shards``): a committed shard file is skipped.

Batch mode (``BatchMode``): a provider batch takes minutes to hours whatever its size, so the ready steps
of *all* pending shards must share each batch; the conductor writes every shard's workflows first, the
workflows execute together wave by wave, then each shard is graded and committed as in the ordinary mode.
A killed run resumes: committed shards are skipped, and the batches already created are polled again
(their handles are in the batch store next to the response cache), so nothing is submitted twice.

Fanned out on Dask or Ray (``fan_out_shards``), each shard is one self-contained task (tasks/shard.py)
that builds its own runtime on its worker and runs the same stages.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prefect import get_run_logger

from conductor.run.overlap import Serialized, generation_batch, one_ahead
from conductor.run.pipeline import RunSpec
from tasks.batch import execute_waves_task
from tasks.lake import committed_task, write_shard_task
from tasks.pipeline import execute_shard, generate_shard, plan_shard, score_shard

MAX_CONDUCTOR_FAILURES = 2   # consecutive shards whose conductor endpoint failed before the run stops trying

Shards = Sequence[tuple[str, Sequence[Any]]]


@dataclass
class ShardPlan:
    """What a (re)run has to do."""

    todo: list[tuple[str, list[Any]]]                 # (shard id, questions) still to answer
    done_questions: int = 0                           # already answered in the lake
    retried_questions: int = 0                        # in ``todo`` because they failed on infrastructure
    damaged: list[str] = field(default_factory=list)  # shard files found damaged and moved aside
    current_ids: list[str] = field(default_factory=list)   # trajectory ids of the input as it is now


@dataclass(frozen=True)
class BatchMode:
    """Execute every pending shard's workflows together through the providers' batch APIs."""

    enabled: bool = True       # False: only the workers whose manifest says ``batch: true``
    poll_s: float = 60.0


def pending_shards(questions: Sequence[Any], spec: RunSpec, lake: str, shard_size: int,
                   retry_failed: bool = True) -> ShardPlan:
    """The shards still to do, by content; ``retry_failed=False`` leaves infra-failed questions as they are."""
    from conductor.data.questions import content_sharded

    state = committed_task(lake, spec.kind, spec.run_id)
    ids = {q.id: spec.trajectory_ids(q) for q in questions}
    finished = state.done if retry_failed else state.done | state.failed
    todo = [q for q in questions if not all(t in finished for t in ids[q.id])]
    retried = sum(1 for q in todo if any(t in state.failed for t in ids[q.id]))
    # a retried question's shard is named by its attempt too: the failed attempts stay in the lake as history
    shards = content_sharded(todo, shard_size, key=lambda q: "\x1f".join(ids[q.id]) + state.attempt_key(ids[q.id]))
    return ShardPlan(todo=shards, done_questions=len(questions) - len(todo), retried_questions=retried,
                     damaged=state.damaged, current_ids=[t for q in questions for t in ids[q.id]])


def unfinished_shards(shards: Shards, spec: RunSpec, lake: str) -> list[tuple[str, Sequence[Any]]]:
    """The shards whose file is not committed yet (rollout and eval runs resume by shard)."""
    from conductor.lake.writer import shard_done

    return [(sid, sq) for sid, sq in shards if not shard_done(lake, spec.kind, spec.run_id, sid)]


def batch_mode(batch: bool, poll_s: float, pool: Any) -> BatchMode | None:
    """Batch mode when ``--batch`` is on or a worker says ``batch: true``, else None (shard by shard)."""
    if not batch and not any(getattr(w, "batch", None) for w in pool.workers):
        return None
    return BatchMode(enabled=batch, poll_s=poll_s)


def run_shards(todo: Shards, spec: RunSpec, lake: str, policy: Any, executor: Any, on_done: Any = None,
               scheme: Any = None, *, batch: BatchMode | None = None, record_failures: bool = True) -> int:
    """Run and commit each pending shard in order, the conductor one piece (a shard, or one question for a
    one-prompt-at-a-time policy) ahead of the workers; returns how many trajectories were written.

    When the conductor's endpoint fails, the shard's questions it had not written workflows for yet are
    committed as infra-failed with the rest of the shard (a rerun retries them; ``record_failures=False``:
    the error propagates instead); after ``MAX_CONDUCTOR_FAILURES``
    such shards in a row, or one refused key, the remaining shards are left for the rerun instead of
    waiting on a dead endpoint. With ``batch``, every generated shard executes together, in waves.
    """
    tally = [0]
    if batch is None:   # the conductor writes the next piece while the workers execute this one (overlap.py)
        policy = Serialized(policy)
        executed: dict[str, list[Any]] = {}
        pieces = _generated(todo, spec, lake, policy, on_done, record_failures, generation_batch(policy))
        for sid, sq, trajs, failed, last in one_ahead(pieces):
            if not failed:
                trajs = execute_shard(trajs, spec, executor, policy, on_done)
            executed.setdefault(sid, []).extend(trajs)
            if last:
                _commit(sid, sq, executed.pop(sid), spec, lake, scheme, tally)
        return tally[0]
    planned: dict[str, tuple[Sequence[Any], list[Any]]] = {}
    for sid, sq, trajs, failed, _ in _generated(todo, spec, lake, policy, on_done, record_failures, None):
        if failed:
            _commit(sid, sq, trajs, spec, lake, scheme, tally)
        else:
            planned[sid] = (sq, trajs)
    everything = [t for _, trajs in planned.values() for t in trajs]
    if everything:
        _execute_in_waves(everything, spec, executor, policy, on_done, batch)
    for sid, (sq, trajs) in planned.items():
        _commit(sid, sq, trajs, spec, lake, scheme, tally)
    return tally[0]


def fan_out_shards(todo: Shards, spec: RunSpec, lake: str, conductor: str, cache: str | None,
                   limits: str | None) -> int:
    """Each shard as one self-contained task on the flow's Dask/Ray task runner; returns trajectories written."""
    from tasks.shard import run_shard_task

    futures = [run_shard_task.submit(sq, spec, sid, lake, conductor, cache, limits) for sid, sq in todo]
    return sum(f.result() for f in futures)


def _generated(todo: Shards, spec: RunSpec, lake: str, policy: Any, on_done: Any, record_failures: bool,
               piece: int | None) -> Iterator[tuple[str, Sequence[Any], list[Any], bool, bool]]:
    """Plan each shard and generate it ``piece`` questions at a time (None: whole): (shard id, its questions,
    the piece's trajectories, whether the conductor failed on them, whether the shard is complete with it).
    When the conductor fails, the rest of the shard comes as one piece marked infra-failed (a rerun retries
    it); after ``MAX_CONDUCTOR_FAILURES`` failures in a row, or one refused key, the run stops generating."""
    from conductor.policy.openai_backend import EndpointError

    failures = 0
    for n, (sid, sq) in enumerate(todo):
        trajs = plan_shard(sq, spec, sid)
        size = max(1, (piece or len(sq)) * spec.samples)
        for start in range(0, len(trajs), size):
            part, last = trajs[start:start + size], start + size >= len(trajs)
            try:
                yield sid, sq, generate_shard(part, policy, spec), False, last
                failures = 0
            except EndpointError as e:
                if not record_failures:
                    raise
                rest = trajs[start:]
                _mark_failed(rest, f"conductor: {e}", on_done)
                get_run_logger().warning("%s shard %s: conductor failed, %d trajectories recorded as infra-failed: %s",
                                         spec.kind, sid, len(rest), e)
                yield sid, sq, rest, True, True
                failures += 1
                if failures >= MAX_CONDUCTOR_FAILURES or e.kind == "auth":
                    get_run_logger().warning("%s: stopping; %d shards left for a rerun", e.kind, len(todo) - n - 1)
                    return
                break


def _commit(sid: str, sq: Sequence[Any], trajs: list[Any], spec: RunSpec, lake: str, scheme: Any,
            tally: list[int]) -> None:
    trajs = score_shard(trajs, sq, scheme)
    write_shard_task(lake, trajs, sid)
    tally[0] += len(trajs)
    get_run_logger().info("%s shard %s committed: %d trajectories", spec.kind, sid, len(trajs))


def batch_executor(executor: Any, enabled: bool = True, poll_s: float = 60.0) -> Any:
    """A ``BatchExecutor`` over the run's executor (same cache and limits), its store beside the cache."""
    from conductor.execution.batch.executor import BatchExecutor
    from conductor.execution.batch.settings import BatchSettings
    from conductor.execution.batch.store import BatchStore

    if executor.cache is None:
        raise ValueError("batch mode needs a response cache (its batch store lives beside it)")
    store = BatchStore(BatchStore.beside(executor.cache.path))
    return BatchExecutor.wrapping(executor, store, BatchSettings(enabled=enabled, poll_s=poll_s))


def _execute_in_waves(trajs: list[Any], spec: RunSpec, executor: Any, policy: Any, on_done: Any,
                      mode: BatchMode) -> None:
    bex = batch_executor(executor, mode.enabled, mode.poll_s)
    try:
        execute_waves_task(trajs, spec, bex, policy, on_done)
        get_run_logger().info("batch mode: %s", ", ".join(f"{k}={v}" for k, v in sorted(bex.batch_stats.items()))
                              or "no batches")
    finally:
        bex.store.close()


def _mark_failed(trajs: list[Any], cause: str, on_done: Any) -> None:
    for t in trajs:
        t.infra_failed, t.infra_cause, t.final_answer, t.reward = True, cause, None, None
        if on_done is not None:
            on_done(t)
