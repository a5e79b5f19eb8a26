"""``BatchExecutor``: the executor whose batchable worker calls go through the wave scheduler.

Everything around the provider call is the synchronous executor's own code (``Executor.call``): cache
lookup and store, budgets, redaction, the ``CallRecord`` fields. Only two things differ: the provider call
of a batchable worker parks in the ``WaveScheduler`` (``_call_provider``), and a reply that came from a
batch is priced at the batch prices (``_fill``), also when a later run finds it in the cache, so a resumed
run reports the same cost as an uninterrupted one. Non-batchable workers (local, embedded, python,
simulated, conductor) call synchronously while the batches wait.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import TYPE_CHECKING, Any

from conductor.execution.batch.adapters.base import BatchAdapter, BatchCompletion, BatchRequest, adapter_class
from conductor.execution.batch.settings import BatchSettings
from conductor.execution.batch.store import BatchStore
from conductor.execution.batch.waves import SYNC, Participant, WaveScheduler
from conductor.execution.cache import cache_key
from conductor.execution.executor import Executor, QuestionState
from conductor.workers.cost import call_cost
from conductor.workers.providers.base import Completion, Message

if TYPE_CHECKING:
    from conductor.trajectory import CallRecord
    from conductor.workers.pool import Worker

_CURRENT: contextvars.ContextVar[tuple[CallRecord, Participant] | None] = contextvars.ContextVar(
    "conductor_batch_call", default=None)


class BatchExecutor(Executor):
    # a call waiting on an identical one would be neither parked nor done, so a wave would wait for it forever;
    # identical requests in one wave are cheap anyway (half price, and the cache serves every later one)
    coalesce_identical_calls = False

    def __init__(self, *, store: BatchStore, settings: BatchSettings | None = None, **kw: Any):
        super().__init__(**kw)
        self.store = store
        self.settings = settings or BatchSettings()
        self._lane: WaveScheduler | None = None
        self._expected: int | None = None
        self._batch_billed: dict[int, int] = {}      # id(CallRecord) -> cached input tokens, for batch replies
        self._adapters: dict[str, BatchAdapter] = {}

    @classmethod
    def wrapping(cls, base: Executor, store: BatchStore, settings: BatchSettings | None = None) -> BatchExecutor:
        """A batch executor sharing ``base``'s cache, limits, retry policy and budget."""
        ex = cls(store=store, settings=settings, cache=base.cache, limiter=base._limiter_template, retry=base.retry,
                 budget=base.budget)
        return ex

    # ------------------------------------------------------------ lane
    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not None and loop is not self._loop:
            self._lane = None
            self._adapters.clear()
        super()._bind_loop()

    @property
    def lane(self) -> WaveScheduler:
        self._bind_loop()
        if self._lane is None:
            self._lane = WaveScheduler(self.store, self.settings, self._adapter_for, self.retry, self._expected)
        return self._lane

    def expect(self, n: int | None) -> None:
        """The next run executes ``n`` trajectories (each ends with ``trajectory_done``): waves wait for all."""
        self._expected = n
        if self._lane is not None:
            self._lane.expected = n

    def trajectory_done(self) -> None:
        """Called in the run's event loop when a trajectory ends (even one that made no call)."""
        self.lane.finish()

    def _adapter_for(self, group: str, worker: Worker) -> BatchAdapter:
        if group not in self._adapters:
            self._adapters[group] = adapter_class(worker.provider)(self.provider(worker))
        return self._adapters[group]

    @property
    def batch_stats(self) -> dict[str, int]:
        return dict(self._lane.stats) if self._lane is not None else {}

    async def aclose(self) -> None:
        if self._lane is not None:
            await self._lane.aclose()
            self._lane = None
        self._adapters.clear()
        await super().aclose()

    # ------------------------------------------------------------ calls
    async def call(self, worker: Worker, messages: list[Message], rec: CallRecord, *,
                   sample_index: int = 0, state: QuestionState | None = None) -> Completion:
        """``Executor.call``, with the call counted as busy for its trajectory while it is not parked."""
        state = state or QuestionState(self.budget)
        lane = self.lane
        part = lane.participant(state)
        part.busy += 1
        lane.bump()
        token = _CURRENT.set((rec, part))
        try:
            if self.settings.batches(worker) and self.cache is not None:
                # a reply an earlier batch produced is billed at batch prices, also when read from the cache
                stored = await self.store.run(self.store.result, cache_key(worker, messages, sample_index))
                if stored is not None:
                    self._batch_billed[id(rec)] = stored.cached_input_tokens
            return await super().call(worker, messages, rec, sample_index=sample_index, state=state)
        finally:
            _CURRENT.reset(token)
            self._batch_billed.pop(id(rec), None)
            part.busy -= 1
            lane.bump()

    async def _call_provider(self, worker: Worker, messages: list[Message], sample_index: int,
                             state: QuestionState, who: str) -> tuple[Completion, int]:
        current = _CURRENT.get()
        if current is None or not self.settings.batches(worker):
            return await super()._call_provider(worker, messages, sample_index, state, who)
        rec, part = current
        req = BatchRequest(cache_key(worker, messages, sample_index), worker, messages, self.provider(worker))
        out = await self.lane.request(req, part)
        if out is SYNC:
            self._batch_billed.pop(id(rec), None)
            return await super()._call_provider(worker, messages, sample_index, state, who)
        assert isinstance(out, BatchCompletion)
        self._batch_billed[id(rec)] = out.cached_input_tokens
        return out, 0

    def _fill(self, rec: CallRecord, worker: Worker, c: Completion, start: float, cache_hit: bool) -> None:  # type: ignore[override]
        Executor._fill(rec, worker, c, start, cache_hit)
        cached = self._batch_billed.get(id(rec))
        if cached is not None:
            rec.cost_usd = call_cost(worker, c.input_tokens, c.output_tokens, cached_input_tokens=cached, batch=True)
