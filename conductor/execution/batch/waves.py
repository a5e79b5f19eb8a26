"""The wave scheduler: ready calls of every question collected into one batch per provider, then fed back.

Each trajectory is a *participant*. A batchable call parks here instead of calling the provider; when every
live participant is parked (no call in flight, no conductor thinking, no step about to start) the parked
calls are the ready steps of all questions: that is a wave, submitted as one batch per provider group.
Results wake their callers, whose next steps park in turn and form the next wave. Requests are named by
their cache key (the custom id), so identical calls share one request, and a rerun finds the batch an
earlier process created (``BatchStore``) and polls it instead of paying again.

Reconciliation by custom id: successes wake their callers; expired, cancelled, errored (retryable) and
missing requests go into a later batch up to ``resubmits`` times, then take the synchronous straggler lane
(``SYNC``: the caller makes the ordinary rate-limited call at list price) or fail the call; permanent errors
fail the call at once, as in a synchronous run.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conductor.execution.batch.adapters.base import (
    BatchAdapter,
    BatchCompletion,
    BatchRequest,
    Outcome,
    Poll,
    group_key,
)
from conductor.execution.batch.store import BatchStore, OpenBatch, StoredResult
from conductor.execution.retry import RetryPolicy, backoff_s
from conductor.workers.providers.base import ProviderError
from conductor.workers.secrets import redacting_logger

if TYPE_CHECKING:
    from conductor.execution.batch.settings import BatchSettings
    from conductor.workers.pool import Worker

log = redacting_logger("conductor.execution.batch")
SYNC = object()    # "make this call synchronously": the straggler lane
_FINAL_KIND = {"expired": "timeout", "cancelled": "server", "missing": "server"}
_UNSUPPORTED = frozenset({404, 405, 501})   # the endpoint has no batch API: its calls take the synchronous lane

AdapterFor = Callable[[str, "Worker"], BatchAdapter]


@dataclass(eq=False)
class Participant:
    """One trajectory: calls in flight that are not parked, and calls parked here."""

    busy: int = 0
    parked: int = 0


@dataclass(eq=False)
class _Waiter:
    req: BatchRequest
    future: asyncio.Future[Any]
    part: Participant
    parked: bool = False


class WaveScheduler:
    """Bound to one event loop (futures and tasks cannot cross loops)."""

    def __init__(self, store: BatchStore, settings: BatchSettings, adapter_for: AdapterFor, retry: RetryPolicy,
                 expected: int | None = None):
        self.loop = asyncio.get_running_loop()
        self.store, self.settings, self.retry = store, settings, retry
        self._adapter_for = adapter_for
        self.expected = expected           # trajectories in the run (None: unknown, judge by parked calls alone)
        self.finished = 0
        self.parts: dict[int, tuple[Any, Participant]] = {}
        self.waiting: dict[str, list[_Waiter]] = {}
        self.pending: dict[str, dict[str, BatchRequest]] = {}     # group -> custom id -> request (next wave)
        self.tracked: set[str] = set()     # ids pending, being submitted, or in a batch polled here
        self.polled: dict[str, asyncio.Task[None]] = {}
        self.stats: Counter[str] = Counter()
        self.version = 0
        self._kick = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._spawn(self._wave_loop())
        self._spawn(self._adopt_open())

    # ------------------------------------------------------ participants
    def participant(self, owner: Any) -> Participant:
        entry = self.parts.get(id(owner))
        if entry is None:                   # the owner is kept alive so its id is never reused in this run
            entry = self.parts[id(owner)] = (owner, Participant())
        return entry[1]

    def finish(self) -> None:
        """A trajectory is done (it will make no more calls)."""
        self.finished += 1
        self.bump()

    def bump(self) -> None:
        self.version += 1
        self._kick.set()

    def quiet(self) -> bool:
        """Every live participant is parked: nothing else can add a call to this wave."""
        parked = 0
        for _, p in self.parts.values():
            if p.busy > 0:
                return False
            parked += p.parked > 0
        if parked == 0:
            return False
        return self.expected is None or parked >= self.expected - self.finished

    # ------------------------------------------------------------ calls
    async def request(self, req: BatchRequest, part: Participant) -> BatchCompletion | object:
        """The reply to ``req`` from a batch (this run's, or one an earlier run created), or ``SYNC``."""
        key = req.custom_id
        w = _Waiter(req, self.loop.create_future(), part)
        self.waiting.setdefault(key, []).append(w)
        try:
            if key not in self.tracked:
                self.tracked.add(key)       # claimed: no other caller looks it up or submits it meanwhile
                try:
                    res, open_batch = await self.store.run(self.store.lookup, key)
                except BaseException:
                    self.tracked.discard(key)
                    raise
                if res is not None:
                    self.tracked.discard(key)
                    self.stats["stored_results"] += 1
                    self._resolve(key, _completion(res))
                elif open_batch is not None:
                    self._poll_open(open_batch)
                else:
                    self._enqueue(req)
            if not w.future.done():
                self._park(w)
            return await w.future
        finally:
            if w.parked:                    # cancelled while parked: leave the counts as if it never came
                self._unpark(w)
            lst = self.waiting.get(key)
            if lst is not None and w in lst:
                lst.remove(w)
                if not lst:
                    del self.waiting[key]

    def _enqueue(self, req: BatchRequest) -> None:
        self.pending.setdefault(group_key(req.worker), {})[req.custom_id] = req
        self.bump()

    def _park(self, w: _Waiter) -> None:
        w.parked = True
        w.part.busy -= 1
        w.part.parked += 1
        self.bump()

    def _unpark(self, w: _Waiter) -> None:
        w.parked = False
        w.part.parked -= 1
        w.part.busy += 1
        self.bump()

    def _resolve(self, key: str, value: Any) -> None:
        """Wake every caller of ``key`` with a completion, ``SYNC`` or a ProviderError (counts move at once)."""
        for w in self.waiting.pop(key, []):
            if w.parked:
                self._unpark(w)
            if not w.future.done():
                if isinstance(value, BaseException):
                    w.future.set_exception(value)
                else:
                    w.future.set_result(value)
        self.bump()

    def _to_sync(self, key: str) -> None:
        self.tracked.discard(key)
        if key in self.waiting:
            self.stats["sync_stragglers"] += 1
        self._resolve(key, SYNC)

    # ------------------------------------------------------------ waves
    async def _wave_loop(self) -> None:
        while True:
            await self._kick.wait()
            self._kick.clear()
            if not self.pending or not self.quiet():
                continue
            version = self.version
            for _ in range(self.settings.settle_ticks):   # a step whose inputs just arrived starts within a few turns
                await asyncio.sleep(0)
            if version != self.version or not self.pending or not self.quiet():
                continue
            await self._submit_wave()

    async def _submit_wave(self) -> None:
        wave, self.pending = self.pending, {}
        n = sum(len(g) for g in wave.values())
        self.stats["waves"] += 1
        if n < self.settings.sync_below:
            log.info("wave of %d calls is below sync_below=%d: calling them synchronously", n, self.settings.sync_below)
            for reqs in wave.values():
                for key in reqs:
                    self._to_sync(key)
            return
        log.info("wave %d: %d calls in %d provider groups", self.stats["waves"], n, len(wave))
        await asyncio.gather(*(self._submit_group(g, list(reqs.values())) for g, reqs in wave.items()))

    async def _submit_group(self, group: str, reqs: list[BatchRequest]) -> None:
        size = self.settings.max_requests
        for i in range(0, len(reqs), size):
            chunk = reqs[i:i + size]
            adapter = self._adapter_for(group, chunk[0].worker)
            batch_id = await self._create(adapter, chunk)
            if batch_id is None:
                continue
            ids = tuple(r.custom_id for r in chunk)
            await self.store.run(self.store.record_batch, batch_id, adapter.name, group,
                                 chunk[0].worker.model_dump_json(), ids, self.stats["waves"])
            self.stats["batches"] += 1
            self.stats["batched_requests"] += len(chunk)
            self.polled[batch_id] = self._spawn(self._poll(batch_id, adapter, ids, self.settings.poll_s))

    async def _create(self, adapter: BatchAdapter, chunk: Sequence[BatchRequest]) -> str | None:
        for attempt in range(1, self.settings.submit_attempts + 1):
            try:
                return await adapter.submit(chunk)
            except ProviderError as e:
                err = e
                if e.retryable and attempt < self.settings.submit_attempts:
                    await asyncio.sleep(backoff_s(self.retry, attempt, e.retry_after))
                    continue
                break
        to_sync = self.settings.sync_stragglers and (err.retryable or err.status in _UNSUPPORTED)
        log.warning("could not create a %s batch of %d calls (%s: %s); %s", adapter.name, len(chunk), err.kind, err,
                    "calling them synchronously" if to_sync else "failing them")
        for r in chunk:
            self.tracked.discard(r.custom_id)
            if to_sync:
                self._to_sync(r.custom_id)
            else:
                self._resolve(r.custom_id, err)
        return None

    # ---------------------------------------------------------- polling
    def _poll_open(self, ob: OpenBatch) -> None:
        """Poll a batch an earlier process created (its handle came from the store)."""
        if ob.batch_id in self.polled:
            return
        from conductor.workers.pool import Worker

        try:
            adapter = self._adapter_for(ob.group_key, Worker.model_validate_json(ob.worker_json))
        except (ValueError, ProviderError) as e:
            log.warning("cannot poll batch %s from an earlier run: %s", ob.batch_id, e)
            for key in ob.custom_ids:
                if key in self.waiting:     # its callers go through a new batch
                    self._enqueue(self.waiting[key][0].req)
            return
        self.tracked.update(ob.custom_ids)
        self.stats["resumed_batches"] += 1
        log.info("resuming batch %s (%d requests) created by an earlier run", ob.batch_id, len(ob.custom_ids))
        self.polled[ob.batch_id] = self._spawn(self._poll(ob.batch_id, adapter, ob.custom_ids, 0.0))

    async def _adopt_open(self) -> None:
        for ob in await self.store.run(self.store.open_batches):
            self._poll_open(ob)

    async def _poll(self, batch_id: str, adapter: BatchAdapter, ids: tuple[str, ...], first_wait: float) -> None:
        wait, failures = first_wait, 0
        try:
            while True:
                await asyncio.sleep(wait)
                wait = self.settings.poll_s
                try:
                    p = await adapter.poll(batch_id, ids)
                except ProviderError as e:
                    if e.status == 404:         # the provider no longer knows it (deleted, purged): requests lost
                        log.warning("batch %s: the provider no longer has it; its requests go into a new batch",
                                    batch_id)
                        p = Poll(True, "not_found")
                        break
                    if not e.retryable:         # e.g. a refused key: callers fail, the handle stays for a rerun
                        log.warning("batch %s: polling failed (%s: %s)", batch_id, e.kind, e)
                        for key in ids:
                            self.tracked.discard(key)
                            self._resolve(key, e)
                        return
                    failures += 1
                    self.stats["poll_errors"] += 1
                    wait = backoff_s(self.retry, failures, e.retry_after)
                    continue
                self.stats["polls"] += 1
                if p.ended:
                    break
            await self._collect(batch_id, p, ids)
        finally:
            self.polled.pop(batch_id, None)

    async def _collect(self, batch_id: str, p: Poll, ids: tuple[str, ...]) -> None:
        """Record every member's outcome, then wake, resubmit, send to the straggler lane, or fail each one."""
        members = set(ids)
        outcomes = {k: p.outcomes.get(k) or Outcome.failed("missing", f"batch {batch_id} returned no result")
                    for k in ids}
        results = [StoredResult(k, batch_id, o.completion.text, o.completion.input_tokens, o.completion.output_tokens,
                                o.completion.cached_input_tokens, o.completion.finish_reason)
                   for k, o in outcomes.items() if o.completion is not None and k in members]
        await self.store.run(self.store.record_results, batch_id, p.status,
                             {k: ("ok" if o.completion is not None else str(o.kind)) for k, o in outcomes.items()},
                             results)
        failed = [k for k, o in outcomes.items() if o.completion is None]
        attempts = await self.store.run(self.store.attempts_of, failed) if failed else {}
        self.stats["collected_batches"] += 1
        self.stats["failed_requests"] += len(failed)
        log.info("batch %s %s: %d of %d requests answered", batch_id, p.status, len(ids) - len(failed), len(ids))
        for key, o in outcomes.items():
            self.tracked.discard(key)
            if o.completion is not None:
                self._resolve(key, o.completion)
            elif key in self.waiting:
                self._retry_or_fail(key, o, attempts.get(key, 1))

    def _retry_or_fail(self, key: str, o: Outcome, attempts: int) -> None:
        if o.retryable and attempts <= self.settings.resubmits:
            self.stats["resubmitted"] += 1
            self.tracked.add(key)
            self._enqueue(self.waiting[key][0].req)
        elif o.retryable and self.settings.sync_stragglers:
            self._to_sync(key)
        else:
            kind = _FINAL_KIND.get(str(o.kind), str(o.kind))
            self._resolve(key, ProviderError(kind, f"batch request {o.kind} after {attempts} batch(es): {o.message}"))  # type: ignore[arg-type]

    # ------------------------------------------------------------ tasks
    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:   # a bug here must not strand parked callers
            log.error("batch scheduler task failed: %r", task.exception())
            for key in list(self.waiting):
                self.tracked.discard(key)
                self._resolve(key, ProviderError("server", f"batch scheduler failed: {task.exception()!r}"))

    async def aclose(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _completion(r: StoredResult) -> BatchCompletion:
    return BatchCompletion(r.text, r.input_tokens, r.output_tokens, r.finish_reason, cached_input_tokens=r.cached_input_tokens)

