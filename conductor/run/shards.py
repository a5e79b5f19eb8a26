"""The one shard loop of every kind of run (answer, rollout, eval, the benches): find what is not done yet, run
the pipeline's stages shard by shard, commit each shard, and handle a failing conductor the same way for all.

Stages. The loop calls the plain stage functions of conductor/run/pipeline.py through ``Stages``; a Prefect
flow passes the same stages wrapped as tasks (tasks/pipeline.py: ``TASK_STAGES``), so a flow's run shows one
task per stage while the loop itself stays plain, importable without Prefect and testable on its own.

Resume. Answer runs resume by content (conductor/lake/resume.py, ``pending_shards``): a question is done
when every trajectory id the run gives it (``RunSpec.trajectory_ids``: the question's id and content and the
settings that change answers) is committed intact and not infra-failed. Everything else is regrouped into
shards named by what they hold, so another shard size redoes nothing, an edited question redoes only
itself, and a damaged shard file or an infrastructure failure is redone on the next run. Rollout and eval
runs resume by shard (``unfinished_shards``): a committed shard file is skipped.

A failing conductor. When the conductor's endpoint fails (``EndpointError``), the shard's questions it had not
written workflows for yet are committed as infra-failed with the rest of the shard, so a run resumed by
content retries them; after ``MAX_CONDUCTOR_FAILURES`` such shards in a row, or one refused key, the remaining
shards are left for the rerun instead of waiting on a dead endpoint. A run resumed by shard would keep such
rows for good, so it passes ``record_failures=False`` and the error propagates instead.

Pipelining. The conductor writes one piece ahead (a question for a one-prompt-at-a-time conductor, a shard
for a batching one: conductor/run/overlap.py) and ``PIPELINE_DEPTH`` pieces execute at once, on one event loop
shared by the run (conductor/execution/loop.py), so the executor's per-worker limits, cache and clients hold
across them. On a small machine a workflow chains models (reason on the 1.5B, run the program, report on the
0.5B); executed one question at a time, the 1.5B would wait out every report.

Batch mode (``BatchMode``): a provider batch takes minutes to hours whatever its size, so the ready steps
of *all* pending shards must share each batch; the conductor writes every shard's workflows first, the
workflows execute together wave by wave, then each shard is graded and committed as in the ordinary mode.
A killed run resumes: committed shards are skipped, and the batches already created are polled again
(their handles are in the batch store next to the response cache), so nothing is submitted twice.

Fanned out on Dask or Ray (flows/rollout.py), each shard is one self-contained task (tasks/shard.py) that
builds its own runtime on its worker and runs this same loop over its one shard.
"""

from __future__ import annotations

import contextvars
import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from conductor.execution.loop import shared_loop
from conductor.run import pipeline
from conductor.run.overlap import Serialized, generation_batch, interruptible, one_ahead, overlaps_execution

if TYPE_CHECKING:
    from conductor.data.questions import Question
    from conductor.execution.batch.executor import BatchExecutor
    from conductor.execution.executor import Executor
    from conductor.generation import PolicyBackend
    from conductor.grading.reward import RewardScheme
    from conductor.lake.resume import RunState
    from conductor.run.pipeline import RunSpec
    from conductor.trajectory import Trajectory
    from conductor.workers.pool import Pool

MAX_CONDUCTOR_FAILURES = 2   # consecutive shards whose conductor endpoint failed before the run stops trying
# Pieces (a question, or a shard for a batching conductor) executing at once: question k's report step runs
# while question k+1's first step already has its worker (docs/benchmarks.md, "Bulk answering throughput").
PIPELINE_DEPTH = 2

Shards = Sequence[tuple[str, Sequence["Question"]]]
OnDone = Callable[["Trajectory"], None]
OnCommit = Callable[[str, list["Trajectory"]], None]


class Logger(Protocol):
    def info(self, msg: str, *args: Any) -> None: ...
    def warning(self, msg: str, *args: Any) -> None: ...


def _write_shard(lake_root: str, trajectories: list[Trajectory], shard_id: str) -> object:
    from conductor.lake.writer import write_shard

    return write_shard(lake_root, trajectories, shard_id)


def _committed(lake_root: str, kind: str, run_id: str) -> RunState:
    from conductor.lake.resume import committed

    return committed(lake_root, kind, run_id)


def _execute_waves(trajectories: list[Trajectory], spec: RunSpec, executor: BatchExecutor,
                   policy: PolicyBackend | None = None, on_done: OnDone | None = None) -> list[Trajectory]:
    from conductor.run.batch import execute_waves

    return execute_waves(trajectories, spec, executor, policy, on_done)


def _library_logger() -> Logger:
    return logging.getLogger("conductor.run.shards")


@dataclass(frozen=True)
class Stages:
    """The stages the loop runs, as plain callables with the signatures of conductor/run/pipeline.py.

    ``Stages()`` runs them in this process as they are; tasks/pipeline.py gives the same ones as Prefect
    tasks (and the flow run's logger), which is the only difference between a flow's loop and a bench's."""

    plan: Callable[[Sequence[Question], RunSpec, str], list[Trajectory]] = pipeline.plan
    generate: Callable[[list[Trajectory], PolicyBackend, RunSpec], list[Trajectory]] = pipeline.generate
    execute: Callable[[list[Trajectory], RunSpec, Any, PolicyBackend | None, OnDone | None],
                      list[Trajectory]] = pipeline.execute
    execute_waves: Callable[[list[Trajectory], RunSpec, BatchExecutor, PolicyBackend | None, OnDone | None],
                            list[Trajectory]] = _execute_waves
    score: Callable[[list[Trajectory], Sequence[Question], RewardScheme | None], list[Trajectory]] = pipeline.score
    write: Callable[[str, list[Trajectory], str], object] = _write_shard
    committed: Callable[[str, str, str], RunState] = _committed
    logger: Callable[[], Logger] = _library_logger


PLAIN = Stages()


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


def pending_shards(questions: Sequence[Question], spec: RunSpec, lake: str, shard_size: int,
                   retry_failed: bool = True, stages: Stages = PLAIN) -> ShardPlan:
    """The shards still to do, by content; ``retry_failed=False`` leaves infra-failed questions as they are."""
    from conductor.data.questions import content_sharded

    state = stages.committed(lake, spec.kind, spec.run_id)
    ids = {q.id: spec.trajectory_ids(q) for q in questions}
    finished = state.done if retry_failed else state.done | state.failed
    todo = [q for q in questions if not all(t in finished for t in ids[q.id])]
    retried = sum(1 for q in todo if any(t in state.failed for t in ids[q.id]))
    # a retried question's shard is named by its attempt too: the failed attempts stay in the lake as history
    shards = content_sharded(todo, shard_size, key=lambda q: "\x1f".join(ids[q.id]) + state.attempt_key(ids[q.id]))
    return ShardPlan(todo=shards, done_questions=len(questions) - len(todo), retried_questions=retried,
                     damaged=state.damaged, current_ids=[t for q in questions for t in ids[q.id]])


def unfinished_shards(shards: Shards, spec: RunSpec, lake: str) -> list[tuple[str, Sequence[Question]]]:
    """The shards whose file is not committed yet (rollout and eval runs resume by shard)."""
    from conductor.lake.writer import shard_done

    return [(sid, sq) for sid, sq in shards if not shard_done(lake, spec.kind, spec.run_id, sid)]


def batch_mode(batch: bool, poll_s: float, pool: Pool) -> BatchMode | None:
    """Batch mode when ``--batch`` is on or a worker says ``batch: true``, else None (shard by shard)."""
    if not batch and not any(getattr(w, "batch", None) for w in pool.workers):
        return None
    return BatchMode(enabled=batch, poll_s=poll_s)


def batch_executor(executor: Executor, enabled: bool = True, poll_s: float = 60.0) -> BatchExecutor:
    """A ``BatchExecutor`` over the run's executor (same cache and limits), its store beside the cache."""
    from conductor.execution.batch.executor import BatchExecutor
    from conductor.execution.batch.settings import BatchSettings
    from conductor.execution.batch.store import BatchStore

    if executor.cache is None:
        raise ValueError("batch mode needs a response cache (its batch store lives beside it)")
    store = BatchStore(BatchStore.beside(executor.cache.path))
    return BatchExecutor.wrapping(executor, store, BatchSettings(enabled=enabled, poll_s=poll_s))


@dataclass
class ShardLoop:
    """One run's shards through the stages, committed one by one; ``run`` returns how many trajectories it wrote.

    ``lake``: where each shard is committed (None: nowhere; ``on_commit`` sees every committed shard either
    way). ``on_done``: each trajectory as soon as it is executed (progress bars). ``record_failures``: what a
    failing conductor leaves behind (module docstring). ``batch``: execute every shard's workflows together."""

    spec: RunSpec
    policy: PolicyBackend
    executor: Executor
    lake: str | None = None
    stages: Stages = PLAIN
    on_done: OnDone | None = None
    on_commit: OnCommit | None = None
    scheme: RewardScheme | None = None
    batch: BatchMode | None = None
    record_failures: bool = True
    written: int = field(default=0, init=False)

    def run(self, todo: Shards) -> int:
        """Run and commit each shard of ``todo`` in order. Shard by shard, the conductor writes the next piece (a
        shard, or one question for a one-prompt-at-a-time policy) while the workers execute this one
        (conductor/run/overlap.py); with ``batch``, every generated shard executes together, in waves."""
        _tell_the_pool(self.spec.pool, [q for _, sq in todo for q in sq])
        start = self.written
        if self.batch is None:
            self._overlapped(todo)
        else:
            self._batched(todo, self.batch)
        return self.written - start

    def _overlapped(self, todo: Shards) -> None:
        """Generate one piece ahead and execute ``PIPELINE_DEPTH`` pieces at once, on one shared event loop (so
        one executor's limits hold across them); shards commit in order, each when its last piece is done. A
        policy that does not overlap execution (``overlaps_execution``) writes each piece after the last is done."""
        policy = Serialized(self.policy)    # the executing stage may call it too (recursion rounds)
        overlap = overlaps_execution(self.policy)
        pieces = self._generated(todo, policy, generation_batch(policy))
        executed: dict[str, list[Trajectory]] = {}
        running: deque[tuple[str, Sequence[Question], Future[list[Trajectory]], bool]] = deque()

        def finish_oldest() -> None:
            sid, sq, done, last = running.popleft()
            rows: list[Trajectory] = interruptible(done)
            executed.setdefault(sid, []).extend(rows)
            if last:
                self._commit(sid, sq, executed.pop(sid))

        with shared_loop(self.executor.aclose) as loop, ThreadPoolExecutor(PIPELINE_DEPTH, "execute") as threads:
            try:
                for sid, sq, trajs, failed, last in one_ahead(pieces) if overlap else pieces:
                    if len(running) >= PIPELINE_DEPTH:
                        finish_oldest()
                    stage = (lambda t=trajs: t) if failed else partial(
                        self.stages.execute, trajs, self.spec, self.executor, policy, self.on_done)
                    running.append((sid, sq, threads.submit(contextvars.copy_context().run, stage), last))
                    if not overlap:
                        finish_oldest()
            except Exception:   # a conductor error raised while earlier pieces execute still lets their shards commit
                while running:
                    finish_oldest()
                raise
            except BaseException:   # Ctrl-C or SIGTERM: stop the executions now; nothing more commits
                loop.cancel()
                raise
            while running:
                finish_oldest()

    def _batched(self, todo: Shards, mode: BatchMode) -> None:
        planned: dict[str, tuple[Sequence[Question], list[Trajectory]]] = {}
        for sid, sq, trajs, failed, _ in self._generated(todo, self.policy, None):
            if failed:
                self._commit(sid, sq, trajs)
            else:
                planned[sid] = (sq, trajs)
        everything = [t for _, trajs in planned.values() for t in trajs]
        if everything:
            bex = batch_executor(self.executor, mode.enabled, mode.poll_s)
            try:
                self.stages.execute_waves(everything, self.spec, bex, self.policy, self.on_done)
                self.stages.logger().info("batch mode: %s", ", ".join(
                    f"{k}={v}" for k, v in sorted(bex.batch_stats.items())) or "no batches")
            finally:
                bex.store.close()
        for sid, (sq, trajs) in planned.items():
            self._commit(sid, sq, trajs)

    def _generated(self, todo: Shards, policy: PolicyBackend,
                   piece: int | None) -> Iterator[tuple[str, Sequence[Question], list[Trajectory], bool, bool]]:
        """Plan each shard and generate it ``piece`` questions at a time (None: whole): (shard id, its questions,
        the piece's trajectories, whether the conductor failed on them, whether the shard is complete with it).
        When the conductor fails, the rest of the shard comes as one piece marked infra-failed; after
        ``MAX_CONDUCTOR_FAILURES`` failures in a row, or one refused key, the run stops generating. A replay miss
        (``cache_miss``: a partial recording) fails its shard only and never stops the run."""
        from conductor.policy.openai_backend import EndpointError

        failures = 0
        for n, (sid, sq) in enumerate(todo):
            trajs = self.stages.plan(sq, self.spec, sid)
            size = max(1, (piece or len(sq)) * self.spec.samples)
            for start in range(0, len(trajs), size):
                part, last = trajs[start:start + size], start + size >= len(trajs)
                try:
                    yield sid, sq, self.stages.generate(part, policy, self.spec), False, last
                    failures = 0
                except EndpointError as e:
                    if not self.record_failures:
                        raise
                    yield sid, sq, self._failed(sid, trajs[start:], e), True, True
                    failures += e.kind != "cache_miss"   # a replay miss is this shard's: the next may be recorded
                    if failures >= MAX_CONDUCTOR_FAILURES or e.kind == "auth":
                        self.stages.logger().warning("%s: stopping; %d shards left for a rerun", e.kind,
                                                     len(todo) - n - 1)
                        return
                    break

    def _failed(self, sid: str, rest: list[Trajectory], error: Exception) -> list[Trajectory]:
        """``rest`` marked infra-failed by the conductor (a rerun retries them), each reported done."""
        mark_failed(rest, f"conductor: {error}", self.on_done)
        self.stages.logger().warning("%s shard %s: conductor failed, %d trajectories recorded as infra-failed: %s",
                                     self.spec.kind, sid, len(rest), error)
        return rest

    def _commit(self, sid: str, sq: Sequence[Question], trajs: list[Trajectory]) -> None:
        trajs = self.stages.score(trajs, sq, self.scheme)
        if self.lake is not None:
            self.stages.write(self.lake, trajs, sid)
            self.stages.logger().info("%s shard %s committed: %d trajectories", self.spec.kind, sid, len(trajs))
        self.written += len(trajs)
        if self.on_commit is not None:
            self.on_commit(sid, trajs)


def run_shard(questions: Sequence[Question], spec: RunSpec, policy: PolicyBackend, executor: Executor, shard: str = "",
              scheme: RewardScheme | None = None, on_done: OnDone | None = None) -> list[Trajectory]:
    """One shard through the loop, returned instead of committed (benches and tests that keep rows in memory).

    A conductor endpoint that fails leaves the rest of the shard infra-failed, as in every run."""
    rows: list[Trajectory] = []
    ShardLoop(spec, policy, executor, on_done=on_done, scheme=scheme,
              on_commit=lambda _sid, trajs: rows.extend(trajs)).run([(shard, questions)])
    return rows


def mark_failed(trajs: list[Trajectory], cause: str, on_done: OnDone | None = None) -> None:
    """Record ``trajs`` as failed on infrastructure: no answer, no reward, ``cause`` kept for the rerun."""
    for t in trajs:
        t.infra_failed, t.infra_cause, t.final_answer, t.reward = True, cause, None, None
        if on_done is not None:
            on_done(t)


def _tell_the_pool(pool: Pool, questions: Sequence[Question]) -> None:
    """Workers that answer from a question's gold (the simulated pool) are told the run's questions before it
    starts; the stages themselves never ask what kind of worker they call."""
    from conductor.workers.providers.simulated import know_questions

    know_questions(pool, questions)
