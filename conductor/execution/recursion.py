"""A trajectory end to end: parse the conductor's output, execute, then recursion rounds.

Recursion (the paper's recursive test-time scaling, §3.2 / Fig. 14): after a
round finishes, the conductor is called again on its original prompt, its
previous workflow and the recursion prompt holding the previous final answer.
Three empty lists keep the answer; otherwise the new workflow runs, and its
``"all"`` steps also see the previous round's steps. Rounds stop at the depth
cap, and the total worker calls stay strictly below ``call_factor`` x the first
round's calls (the paper kept recursion under 2x): the room left is passed to
the conductor as the round's step limit, so a longer workflow is the
conductor's own format error, never a silent truncation.

The call tree is rebuildable from the records: round d's worker calls have
``parent_call_id = "d.conductor"``, and that conductor call's parent is the
last call of round d-1.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Literal, TypedDict, Unpack

from conductor.execution.executor import Budget, Executor, QuestionState, RoundResult
from conductor.execution.loop import current_loop
from conductor.trajectory import CallRecord, Round
from conductor.workers.secrets import redact
from conductor.workflow import DEFAULT_MAX_STEPS, Workflow, WorkflowError

if TYPE_CHECKING:
    from conductor.generation import Generation, GenerationParams, PolicyBackend
    from conductor.parser import ParseError
    from conductor.trajectory import Trajectory
    from conductor.workers.pool import SubPool

    # each trajectory's sub-pool: one for all, one per trajectory (in order), or a function of the trajectory
    SubPools = SubPool | Sequence[SubPool] | Callable[[Trajectory], SubPool]

ConductorFn = Callable[[str], Awaitable["Generation"]]


class TrajectoryOptions(TypedDict, total=False):
    """``execute_trajectory``'s settings, passed through unchanged by the batch runners."""

    conductor: ConductorFn | None
    max_depth: int
    max_steps: int
    budget: Budget | None
    call_factor: float
    sequential: bool


def parse_status_of(err: ParseError) -> Literal["parse_error", "invalid"]:
    """'invalid' when the lists were read but break a rule (range, length cap, references), else 'parse_error';
    the parser decides which (``ParseError.status``).

    >>> from conductor.parser import ParseError
    >>> parse_status_of(ParseError("model_id", "entry 0 is 7, outside the pool (0..2)", status="invalid"))
    'invalid'
    >>> parse_status_of(ParseError("subtasks", "no list found", status="parse_error"))
    'parse_error'
    """
    return err.status


def recursion_round_prompt(root_prompt: str, previous_completion: str, previous_answer: str, max_steps: int) -> str:
    """The conductor's prompt for a recursion round: original prompt, its previous workflow, Fig. 14's request."""
    from conductor.prompts import recursion_prompt

    return f"{root_prompt.rstrip()}\n\n{previous_completion.strip()}\n{recursion_prompt(previous_answer, max_steps)}"


def conductor_fn_from_backend(backend: PolicyBackend, params: GenerationParams) -> ConductorFn:
    """Wrap a (synchronous) ``PolicyBackend`` as the async conductor call recursion needs."""
    async def call(prompt: str) -> Generation:
        out = await asyncio.to_thread(backend.generate, [prompt], 1, params)
        return out[0][0]
    return call


@functools.lru_cache(maxsize=1024)
def _parse(text: str, n_workers: int, max_steps: int, allow_empty: bool) -> Workflow | ParseError:
    """Memoised: both results are frozen, and a server answering with a strategy (or a greedy conductor on
    repeated questions) parses the same few texts again and again; the parse was the largest piece of a
    served request's CPU after HTTP (docs/serving.md, "Overhead")."""
    from conductor.parser import parse_workflow

    return parse_workflow(text, n_workers=n_workers, max_steps=max_steps, allow_empty=allow_empty)


def _record_round(rnd: Round, wf: Workflow, res: RoundResult) -> None:
    rnd.steps = [s.to_json() for s in wf.steps]
    rnd.final_answer = res.final_answer


def _fail(traj: Trajectory, cause: str) -> Trajectory:
    traj.infra_failed = True
    traj.infra_cause = redact(cause)
    traj.final_answer = None
    return traj


async def execute_trajectory(traj: Trajectory, subpool: SubPool, executor: Executor, *,
                             conductor: ConductorFn | None = None, max_depth: int = 0,
                             max_steps: int = DEFAULT_MAX_STEPS, budget: Budget | None = None,
                             call_factor: float = 2.0, sequential: bool = False) -> Trajectory:
    """Fill ``traj`` (whose rounds[0] holds prompt + completion): rounds, calls, final answer, infra fields.

    Parse errors are recorded in rounds[0] and nothing runs. Grading is not done here.
    """
    start = time.perf_counter()
    if not traj.rounds:
        raise ValueError(f"trajectory {traj.trajectory_id}: no conductor round to execute")
    del traj.rounds[1:]
    traj.calls.clear()
    traj.infra_failed, traj.infra_cause, traj.final_answer = False, None, None
    root = traj.rounds[0]
    state = QuestionState(budget or executor.budget)
    try:
        return await _execute(traj, root, subpool, executor, state, conductor, max_depth, max_steps,
                              call_factor, sequential)
    finally:
        traj.wall_s = time.perf_counter() - start


async def _execute(traj: Trajectory, root: Round, subpool: SubPool, executor: Executor, state: QuestionState,
                   conductor: ConductorFn | None, max_depth: int, max_steps: int, call_factor: float,
                   sequential: bool) -> Trajectory:
    from conductor.parser import ParseError

    wf = _parse(root.completion, len(subpool), max_steps, allow_empty=False)
    if isinstance(wf, ParseError):
        root.parse_status = parse_status_of(wf)
        root.parse_error = wf.message
        return traj
    root.parse_status = "ok"
    root.parse_error = None
    try:
        res = await executor.run_workflow(traj.question, wf, subpool, sample_index=traj.sample_index,
                                          depth=0, state=state, sequential=sequential)
    except WorkflowError as e:
        root.parse_status, root.parse_error = "invalid", f"{e.field}: {e.reason}"
        return traj
    traj.calls.extend(res.calls)
    _record_round(root, wf, res)
    if res.failure is not None:
        return _fail(traj, res.infra_cause or "unknown")
    traj.final_answer = res.final_answer

    root_calls = len(res.calls)
    cap = math.ceil(call_factor * root_calls) - 1          # total worker calls must stay strictly below
    prev_round, prev_wf, prev_res = root, wf, res
    for depth in range(1, max_depth + 1):
        if conductor is None:
            break
        used = sum(1 for c in traj.calls if c.depth >= 0 and c.worker_index >= 0)
        room = min(max_steps, cap - used)
        if room < 1:
            break
        previous_answer = prev_res.final_answer or ""
        prompt = recursion_round_prompt(root.prompt, prev_round.completion, previous_answer, room)
        parent = prev_res.calls[-1].call_id if prev_res.calls else None
        crec = CallRecord(call_id=f"{depth}.conductor", parent_call_id=parent, depth=depth, step=-1,
                          worker_index=-1, worker="conductor", provider="conductor",
                          model=traj.checkpoint_id or "conductor", subtask="recursion")
        t0 = time.perf_counter()
        try:
            gen = await conductor(prompt)
        except Exception as e:  # noqa: BLE001 - the conductor's backend failing is infrastructure
            crec.error, crec.error_kind = redact(f"{type(e).__name__}: {e}"), "server"
            crec.latency_s = time.perf_counter() - t0
            traj.calls.append(crec)
            return _fail(traj, f"conductor: recursion round {depth} failed: {type(e).__name__}: {e}")
        crec.latency_s = time.perf_counter() - t0
        crec.response = gen.text
        crec.finish_reason = gen.finish_reason
        crec.output_tokens = len(gen.token_ids or [])
        crec.input_tokens = len(gen.prompt_token_ids or [])
        traj.calls.append(crec)
        rnd = Round(depth=depth, prompt=prompt, completion=gen.text, completion_token_ids=gen.token_ids,
                    completion_logprobs=gen.logprobs)
        traj.rounds.append(rnd)
        new = _parse(gen.text, len(subpool), room, allow_empty=True)
        if isinstance(new, ParseError):
            rnd.parse_status, rnd.parse_error = parse_status_of(new), new.message
            rnd.final_answer = previous_answer
            break
        rnd.parse_status = "ok"
        if new.is_empty:
            rnd.kept_previous = True
            rnd.final_answer = previous_answer
            break
        res = await executor.run_workflow(traj.question, new, subpool, sample_index=traj.sample_index,
                                          depth=depth, parent_call_id=crec.call_id,
                                          previous_round=prev_res.as_previous_round(prev_wf),
                                          state=state, sequential=sequential)
        traj.calls.extend(res.calls)
        _record_round(rnd, new, res)
        if res.failure is not None:
            return _fail(traj, res.infra_cause or "unknown")
        traj.final_answer = res.final_answer
        prev_round, prev_wf, prev_res = rnd, new, res
    return traj


async def execute_batch(trajs: Sequence[Trajectory], subpools: SubPools, executor: Executor, *,
                        max_in_flight: int = 1024, progress: bool = False,
                        on_done: Callable[[Trajectory], None] | None = None,
                        **kw: Unpack[TrajectoryOptions]) -> list[Trajectory]:
    """Many trajectories concurrently in this event loop, sharing the executor's limits and cache.

    One trajectory's failure (infra or bad input) never stops the others.
    """
    def pool_for(i: int, t: Trajectory) -> SubPool:
        if callable(subpools):
            return subpools(t)
        if isinstance(subpools, Sequence):
            return subpools[i]
        return subpools

    gate = asyncio.Semaphore(max_in_flight)
    bar = None
    if progress:
        from rich.progress import Progress

        bar = Progress(transient=True)
        bar.start()
        task = bar.add_task("executing workflows", total=len(trajs))

    async def one(i: int, t: Trajectory) -> Trajectory:
        async with gate:
            try:
                await execute_trajectory(t, pool_for(i, t), executor, **kw)
            except Exception as e:  # noqa: BLE001 - bad input for one row must not sink the batch
                _fail(t, f"executor: {type(e).__name__}: {e}")
        if bar is not None:
            bar.advance(task)
        if on_done is not None:
            on_done(t)
        return t

    try:
        if len(trajs) == 1:     # a served request: no task and no gather for the one trajectory
            return [await one(0, trajs[0])]
        return list(await asyncio.gather(*(one(i, t) for i, t in enumerate(trajs))))
    finally:
        if bar is not None:
            bar.stop()


def run_batch(trajs: Sequence[Trajectory], subpools: SubPools, executor: Executor, *, max_in_flight: int = 1024,
              progress: bool = False, on_done: Callable[[Trajectory], None] | None = None,
              **kw: Unpack[TrajectoryOptions]) -> list[Trajectory]:
    """Synchronous wrapper: one event loop for the whole batch, SDK clients closed at the end; or, inside a
    pipelined run (conductor/execution/loop.py), the run's shared loop, whose end closes the clients."""
    batch = execute_batch(trajs, subpools, executor, max_in_flight=max_in_flight, progress=progress,
                          on_done=on_done, **kw)
    shared = current_loop()
    if shared is not None:
        return shared.run(batch)

    async def main() -> list[Trajectory]:
        try:
            return await batch
        finally:
            await executor.aclose()
    return asyncio.run(main())
