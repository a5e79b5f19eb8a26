"""Run a workflow over a sub-pool: worker calls as a dependency graph, every call recorded.

Semantics are the paper's (each worker sees the question, the earlier steps its
access list names, then its subtask; the last step's output is the answer), but
steps run as soon as the steps they see are done: a step with access ``[]``
never waits, so independent attempts run in parallel. Each step's messages
depend only on the responses it sees, so results equal sequential execution
(``sequential=True`` runs strictly in order, for comparison).

Failure taxonomy:
- provider/infrastructure failures left after retries (rate limits, 5xx,
  timeouts, malformed bodies, auth, missing keys, cache misses in replay mode,
  budgets) end the round with ``failure`` set: the trajectory is
  ``infra_failed`` with the cause and is never rewarded 0;
- empty or truncated replies are the workflow's own outcome: recorded
  (``finish_reason``) and passed on like any reply;
- the question's dollar budget (``max_cost``) is the conductor's own limit, not a
  failure: a step that would start once the budget is spent is not run (its call
  record says so, ``error_kind="budget"``), nor is any step that sees it, and the
  round's answer is the output of the last step that ran (``RoundResult.budget_stop``).
- a gate step (``provider: agree``) that accepts the answers it was shown replies with finish reason
  ``SETTLED``: every later step that sees it is left out (no call, no call record) and the gate's reply is
  the round's answer. That is how a cascade escalates only when its cheap answers disagree.

Replay: a cache in ``replay`` mode never calls a language model; workers that are programs or recordings
(``OFFLINE_PROVIDERS``: the python sandbox, the vote and agree tools, the replay provider) still run, so a menu
recorded once replays whole, even an entry composed later from the recorded calls. A cache hit's
``latency_s`` and cost are those of the recorded call when the cache kept its seconds (a replay stands in for
the call it replays; ``Price.per_second`` prices local compute by them).
Steps not yet started when a failure happens are not started; calls already in
flight finish and are cached, so a rerun does not pay for them again.

Identical calls in flight together are made once (with a cache): a call whose cache key
is already being fetched waits for that reply instead of asking the provider again, and
is recorded as a cache hit. GRPO groups and bulk runs at temperature 0 issue the same
call many times at once, before any of them has reached the cache.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from dataclasses import replace as dc_replace
from typing import TYPE_CHECKING, Protocol

from conductor.execution.cache import ResponseCache, cache_key, messages_hash
from conductor.execution.ratelimit import RateLimiter
from conductor.execution.retry import RetryPolicy, call_with_retries, timed_out
from conductor.execution.upstream import awaiting_upstream
from conductor.trajectory import CallRecord
from conductor.workers.cost import call_cost
from conductor.workers.faults import plan_faults
from conductor.workers.providers.base import (
    SETTLED,
    Completion,
    Message,
    Provider,
    ProviderError,
    TextSink,
    make_provider,
    stream_completion,
)
from conductor.workers.providers.shared import estimate_tokens
from conductor.workers.secrets import redact, redacting_logger
from conductor.workflow import ALL, Workflow

if TYPE_CHECKING:
    from conductor.workers.pool import SubPool, Worker

log = redacting_logger("conductor.execution.executor")

# Workers whose replies come from a program or a recording, never from a language model: a replay cache runs them.
OFFLINE_PROVIDERS = frozenset({"python", "vote", "agree", "replay"})


class AnswerSinks(Protocol):
    """Who waits for a workflow's answer as it is produced (``conductor serve`` with ``stream: true``)."""

    def sink_for(self, sample_index: int, depth: int) -> TextSink | None:
        """The sink for the last step of the round at ``depth`` of sample ``sample_index``, or None when that
        round's answer may still be replaced (a later recursion round) and must not be streamed."""
        ...


#: Set around a request's workflows (a context variable, so it reaches the executor through ``execute_batch``
#: and only the tasks of that request): the last step's reply is then streamed to its sink, unless the worker
#: has seeded faults (they rewrite the whole reply after it arrives). Records are the same either way.
ANSWER_STREAM: ContextVar[AnswerSinks | None] = ContextVar("conductor_answer_stream", default=None)
# the sink of the step being called (a context variable, so executors that override ``call`` need not know it)
_STEP_SINK: ContextVar[TextSink | None] = ContextVar("conductor_step_sink", default=None)


@dataclass(frozen=True)
class Budget:
    """Per-question limits over all rounds of one trajectory (None = unlimited)."""

    max_calls: int | None = None
    max_dollars: float | None = None
    max_seconds: float | None = None


class BudgetStop(ProviderError):
    """The question's dollar budget is spent: the workflow stops at its last affordable step."""

    def __init__(self, message: str):
        super().__init__("budget", message)


@dataclass
class QuestionState:
    """What one trajectory has used so far; shared by its rounds."""

    budget: Budget = field(default_factory=Budget)
    started: float = field(default_factory=time.monotonic)
    calls: int = 0          # worker calls started (cache hits included: replays must behave identically)
    dollars: float = 0.0    # nominal cost so far

    def remaining_s(self) -> float | None:
        if self.budget.max_seconds is None:
            return None
        return self.budget.max_seconds - (time.monotonic() - self.started)

    def admit(self, who: str) -> None:
        """Count a call about to start, or raise a ``budget`` ProviderError."""
        b = self.budget
        if b.max_calls is not None and self.calls >= b.max_calls:
            raise ProviderError("budget", f"{who}: question budget of {b.max_calls} calls used up")
        if b.max_dollars is not None and self.dollars >= b.max_dollars:
            raise BudgetStop(f"{who}: not run, the question's budget of ${b.max_dollars:g} is spent (${self.dollars:.4f})")
        left = self.remaining_s()
        if left is not None and left <= 0:
            raise ProviderError("budget", f"{who}: question budget of {b.max_seconds:g} s used up")
        self.calls += 1


@dataclass
class RoundResult:
    """One executed workflow: its calls (in step order), responses and answer, or its failure."""

    calls: list[CallRecord]
    responses: dict[int, str]
    final_answer: str | None
    failure: ProviderError | None = None
    budget_stop: str | None = None     # why steps were left out under the dollar budget (the answer is the last that ran)

    @property
    def infra_cause(self) -> str | None:
        if self.failure is None:
            return None
        return redact(f"{self.failure.kind}: {self.failure}")

    def as_previous_round(self, workflow: Workflow) -> list[tuple[int, str, str]]:
        """(worker, subtask, response) per step: what a recursion round's "all" steps see."""
        return [(s.worker, s.subtask, self.responses.get(i, "")) for i, s in enumerate(workflow.steps)]


class SlotStillBusy(ProviderError):
    """A local worker's timeout, not retried: a llama.cpp server with one slot goes on generating the reply it
    was asked for after the client gives up, so a retry queues behind that abandoned reply and times out in
    turn (found on a loaded machine: one step retried 6 times over 65 minutes). The step fails at once; a
    resumed run asks again when the server is free."""

    def __init__(self, cause: ProviderError):
        super().__init__("timeout", f"{cause} (not retried: the local server is still generating the abandoned reply)",
                         status=cause.status)

    @property
    def retryable(self) -> bool:
        return False


class Executor:
    """Shared by every workflow of a batch: providers, rate limits, cache, retry policy, budgets.

    Bound to one event loop at a time; used from a new loop (a new ``asyncio.run``)
    it rebuilds its SDK clients and limiters, since those cannot cross loops.
    """

    #: make identical concurrent calls once (needs a cache: the key is the cache key)
    coalesce_identical_calls = True

    def __init__(self, *, cache: ResponseCache | None = None, limiter: RateLimiter | None = None,
                 retry: RetryPolicy | None = None, budget: Budget | None = None, shared_samples: bool = False):
        self.cache = cache
        # True: every sample of a question reads (and writes) the call of sample 0, so a GRPO group replays one
        # recording of each worker call (a recording holds one reply per call); False: samples stay independent
        self.shared_samples = shared_samples
        self._limiter_template = limiter or RateLimiter()
        self.limiter = self._limiter_template
        self.retry = retry or RetryPolicy()
        self.budget = budget or Budget()
        self._providers: dict[int, tuple[Worker, Provider]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._in_flight: dict[str, asyncio.Future[Completion]] = {}
        self._misses_logged: set[str] = set()      # workers whose replay miss was logged (``_log_failure``)
        self.stats: dict[str, int] = {"calls": 0, "cache_hits": 0, "coalesced": 0, "retries": 0, "failures": 0}

    # ------------------------------------------------------------ plumbing
    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return
        if self._loop is not None:   # a previous asyncio.run: its clients, semaphores and futures are dead
            self._providers.clear()
            self._in_flight.clear()
            self.limiter = self._limiter_template.fresh()
        self._loop = loop

    def provider(self, worker: Worker) -> Provider:
        entry = self._providers.get(id(worker))
        if entry is None:
            entry = self._providers[id(worker)] = (worker, make_provider(worker))
        return entry[1]

    async def aclose(self) -> None:
        """Close the SDK clients of this loop (the cache stays open; close it yourself)."""
        providers, self._providers = self._providers, {}
        for _, p in providers.values():
            close = getattr(p, "aclose", None)
            if close is not None:
                try:
                    await close()
                except Exception:  # noqa: BLE001 - closing must not mask results
                    pass

    # ----------------------------------------------------------- one call
    async def call(self, worker: Worker, messages: list[Message], rec: CallRecord, *,
                   sample_index: int = 0, state: QuestionState | None = None) -> Completion:
        """One worker call with cache, budget, limits, retries and timeout; fills ``rec``."""
        self._bind_loop()
        state = state or QuestionState(self.budget)
        who = f"worker {worker.name}"
        start = time.perf_counter()
        rec.messages_hash = messages_hash(messages)
        faults = plan_faults(worker, messages)   # the manifest's seeded faults, applied around the real reply
        try:
            if faults is not None:
                await faults.before(rec)
            c = await self._reply(worker, messages, rec, sample_index, state, who, start)
            return c if faults is None else faults.after(c, rec)
        except ProviderError as e:
            if not isinstance(e, BudgetStop):   # a spent dollar budget is the workflow's outcome, not a failure
                self.stats["failures"] += 1
                self._log_failure(who, e)
            rec.retries = getattr(e, "retries", rec.retries)
            rec.error = redact(str(e))
            rec.error_kind = e.kind
            rec.latency_s = time.perf_counter() - start
            raise

    def _log_failure(self, who: str, e: ProviderError) -> None:
        """A warning per failed call, but one per worker for replay misses: replaying a partial recording misses
        every call of every question not recorded yet, and each miss is an infrastructure failure in its record
        (and in the run's summary) already."""
        first = e.kind != "cache_miss" or who not in self._misses_logged
        note = " (further misses of this worker are not logged)" if e.kind == "cache_miss" and first else ""
        if e.kind == "cache_miss":
            self._misses_logged.add(who)
        log.log(logging.WARNING if first else logging.DEBUG, "call failed for %s (%s): %s%s", who, e.kind, e, note)

    async def _reply(self, worker: Worker, messages: list[Message], rec: CallRecord, sample_index: int,
                     state: QuestionState, who: str, start: float) -> Completion:
        """The real reply: cached, shared with an identical call in flight, or fetched."""
        if self.cache is None:
            return await self._fetch(worker, messages, rec, sample_index, state, who, start, "")
        key = cache_key(worker, messages, 0 if self.shared_samples else sample_index)
        if not self.coalesce_identical_calls:
            return await self._fetch(worker, messages, rec, sample_index, state, who, start, key)
        shared = await self._reply_in_flight(key)
        if shared is not None:
            self.stats["coalesced"] += 1
            return self._reuse(shared, worker, rec, state, who, start)
        return await self._lead(key, self._fetch(worker, messages, rec, sample_index, state, who, start, key))

    async def _reply_in_flight(self, key: str) -> Completion | None:
        """The reply of an identical call already in flight, once it arrives; None if there is none (any more).

        When that call fails, its failure is its own (its question's budget, its retries): this call then
        looks again and, if no other identical call is in flight, is made by its caller.
        """
        while (pending := self._in_flight.get(key)) is not None:
            try:
                with awaiting_upstream():
                    return await asyncio.shield(pending)
            except (ProviderError, asyncio.CancelledError):
                task = asyncio.current_task()
                own_cancel = not pending.done() or (task is not None and task.cancelling() > 0)
                if own_cancel or not (pending.cancelled() or isinstance(pending.exception(), ProviderError)):
                    raise                       # this call itself was cancelled, not the one it waited for
        return None

    async def _lead(self, key: str, fetch: Awaitable[Completion]) -> Completion:
        """Run ``fetch`` as the one call for ``key`` that identical calls arriving meanwhile wait for."""
        pending: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        self._in_flight[key] = pending
        try:
            c = await fetch
        except ProviderError as e:
            pending.set_exception(e)
            pending.exception()                 # retrieved: no "never retrieved" warning when nobody waited
            raise
        except BaseException:
            pending.cancel()
            raise
        else:
            pending.set_result(c)
            return c
        finally:
            self._in_flight.pop(key, None)

    def _reuse(self, c: Completion, worker: Worker, rec: CallRecord, state: QuestionState, who: str,
               start: float) -> Completion:
        """Record a reply that cost no provider call (a cache hit, or an identical call's reply)."""
        state.admit(who)
        self._fill(rec, worker, c, start, cache_hit=True)
        state.dollars += rec.cost_usd
        self.stats["cache_hits"] += 1
        return c

    async def _fetch(self, worker: Worker, messages: list[Message], rec: CallRecord, sample_index: int,
                     state: QuestionState, who: str, start: float, key: str) -> Completion:
        """The reply from the cache (``key``, if there is a cache) or from the provider, stored after."""
        if self.cache is not None:
            hit = await self.cache.get(key)
            if hit is not None:
                return self._reuse(hit, worker, rec, state, who, start)
            if self.cache.mode == "replay" and worker.provider not in OFFLINE_PROVIDERS:
                raise self.cache.miss_error(worker)
        state.admit(who)
        completion, retries = await self._call_provider(worker, messages, sample_index, state, who)
        clean = redact(completion.text)    # a reply must never carry a key into records or later prompts
        if clean != completion.text:
            completion = Completion(clean, completion.input_tokens, completion.output_tokens, completion.finish_reason)
        rec.retries = retries
        self.stats["calls"] += 1
        self.stats["retries"] += retries
        self._fill(rec, worker, completion, start, cache_hit=False)
        state.dollars += rec.cost_usd
        if self.cache is not None:
            await self.cache.put(key, worker, dc_replace(completion, latency_s=rec.latency_s))
        return completion

    async def _call_provider(self, worker: Worker, messages: list[Message], sample_index: int,
                             state: QuestionState, who: str) -> tuple[Completion, int]:
        provider = self.provider(worker)
        sink = _STEP_SINK.get()     # set by run_workflow for the step whose reply is the streamed answer
        s = worker.sampling
        tokens = (sum(estimate_tokens(m.content) for m in messages) + s.max_tokens
                  + (s.thinking_budget or 0)) if worker.limits.tokens_per_minute else 0
        timeout = self.retry.timeout_s or worker.limits.timeout_s
        key_limiter = self.limiter.for_worker(worker)

        async def attempt() -> Completion:
            left = state.remaining_s()
            if left is not None and left <= 0:
                raise ProviderError("budget", f"{who}: question budget of {state.budget.max_seconds:g} s used up")
            budget = timeout if left is None else min(timeout, left)
            async with key_limiter.slot(tokens, budget) as permit:   # Retry-After pauses count against it
                if sink is not None:
                    sink.start()               # a retry's reply starts over
                reply = (provider.complete(messages, sample_index=sample_index) if sink is None
                         else stream_completion(provider, messages, sink, sample_index=sample_index))
                seconds = budget - permit.paused_s
                try:
                    with awaiting_upstream():     # the server's overhead is its time minus this (execution/upstream.py)
                        async with asyncio.timeout(seconds):    # retry.with_timeout, inlined: one frame less a call
                            c = await reply
                except TimeoutError:
                    permit.settle(0)
                    if worker.provider == "local":
                        raise SlotStillBusy(timed_out(who, seconds)) from None
                    raise timed_out(who, seconds) from None
                except ProviderError as e:
                    permit.settle(0)
                    if e.kind == "rate_limited":
                        await key_limiter.penalize(e.retry_after)
                    if e.kind == "timeout" and worker.provider == "local":
                        raise SlotStillBusy(e) from None
                    raise
                permit.settle(c.input_tokens + c.output_tokens)
                return c

        def on_retry(e: ProviderError) -> None:
            log.info("retrying %s after %s: %s", who, e.kind, e)

        max_retries = self.retry.max_retries if self.retry.max_retries is not None else worker.limits.max_retries
        # the back-off between attempts is bounded by the call's own deadline: a Retry-After the limiter has
        # already waited out (capped and logged) must not add a 30 s sleep to a call with timeout_s: 10
        policy = self.retry if self.retry.max_wait_s <= timeout else dc_replace(self.retry, max_wait_s=timeout)
        return await call_with_retries(attempt, max_retries, policy, on_retry)

    @staticmethod
    def _fill(rec: CallRecord, worker: Worker, c: Completion, start: float, cache_hit: bool) -> None:
        rec.response = c.text
        rec.finish_reason = c.finish_reason
        rec.input_tokens = c.input_tokens
        rec.output_tokens = c.output_tokens
        rec.cache_hit = cache_hit
        rec.latency_s = c.latency_s if cache_hit and c.latency_s is not None else time.perf_counter() - start
        rec.cost_usd = call_cost(worker, c.input_tokens, c.output_tokens, seconds=rec.latency_s)

    # ------------------------------------------------------- one workflow
    async def run_workflow(self, question: str, workflow: Workflow, subpool: SubPool, *,
                           sample_index: int = 0, depth: int = 0, parent_call_id: str | None = None,
                           previous_round: Sequence[tuple[int, str, str]] | None = None,
                           state: QuestionState | None = None, sequential: bool = False) -> RoundResult:
        """Execute every step; raises WorkflowError (before any call) if a step names no worker."""
        from conductor.prompts import worker_messages

        self._bind_loop()
        workflow.validate(n_workers=len(subpool), max_steps=max(len(workflow), 1), allow_empty=True)
        state = state or QuestionState(self.budget)
        n = len(workflow)
        deps = workflow.dependencies()
        records: list[CallRecord | None] = [None] * n
        responses: dict[int, str] = {}
        done = [asyncio.Event() for _ in range(n)]
        failure: list[ProviderError] = []
        stopped: dict[int, str] = {}      # steps left out under the dollar budget -> why
        settled: set[int] = set()         # gate steps that accepted their answers, and the steps left out after them
        prev = list(previous_round) if previous_round else None
        answer = ANSWER_STREAM.get()       # the last step's reply is the round's answer: streamed if asked

        async def run_step(i: int) -> None:
            try:
                for d in deps[i]:
                    await done[d].wait()
                if failure:
                    return
                if any(d in settled for d in deps[i]):
                    settled.add(i)         # a gate before it accepted the answers: this step is not needed
                    return
                step = workflow.steps[i]
                worker = subpool.worker(step.worker)
                rec = records[i] = CallRecord(
                    call_id=f"{depth}.{i}", parent_call_id=parent_call_id, depth=depth, step=i,
                    worker_index=step.worker, worker=worker.name, provider=worker.provider, model=worker.model,
                    subtask=step.subtask, access=list(deps[i]), access_all=step.access == ALL)
                if any(d in stopped for d in deps[i]):
                    rec.error, rec.error_kind = "not run: a step it sees was left out under the dollar budget", "budget"
                    stopped[i] = rec.error
                    return
                msgs = worker_messages(question, workflow, i, {j: responses[j] for j in deps[i]}, prev)
                sink = (answer.sink_for(sample_index, depth)
                        if answer is not None and i == n - 1 and worker.faults is None else None)
                streaming = _STEP_SINK.set(sink)
                try:
                    c = await self.call(worker, msgs, rec, sample_index=sample_index, state=state)
                except BudgetStop as e:
                    stopped[i] = str(e)
                    return
                except ProviderError as e:
                    failure.append(e)
                    return
                finally:
                    _STEP_SINK.reset(streaming)
                responses[i] = c.text
                if c.finish_reason == SETTLED:
                    settled.add(i)
            finally:
                done[i].set()

        if sequential:
            for i in range(n):
                await run_step(i)
        else:
            await asyncio.gather(*(run_step(i) for i in range(n)))
        calls = [r for r in records if r is not None]
        if failure:
            return RoundResult(calls, responses, None, failure[0])
        if stopped:   # the answer is the output of the last step that ran, if any did
            final = responses[max(responses)] if responses else None
            return RoundResult(calls, responses, final, budget_stop=redact(stopped[min(stopped)]))
        final = responses.get(n - 1) if n else None
        if final is None and settled:   # the last step was left out after a gate: the gate's reply is the answer
            final = responses[max(i for i in settled if i in responses)]
        return RoundResult(calls, responses, final)
