"""Per-(provider, endpoint, model) rate limits: RPM and TPM buckets plus a concurrency cap.

WHY this shape: thousands of concurrent workflow steps share one provider
quota. Waiters queue in arrival order (a FIFO lock); only the head of the queue
watches the buckets and sleeps exactly until its request and tokens fit, then
takes them at that moment. Nothing is promised ahead, so a late wake-up on a
busy machine cannot release a catch-up burst above the bucket's capacity, and
with no polling the achieved rate sits right at the limit. Token use is
reserved as (input estimate + max_tokens), like providers count it, and the
unused part is refunded when the reply arrives.

A 429's Retry-After pauses the whole key, not just the caller that saw it; the
pause is capped (``max_pause_s``: one ``Retry-After: 3600`` must not freeze a
worker for an hour), logged, and counted against the waiting call's timeout.

The request bucket bursts at most ``burst_s`` seconds of requests (providers
enforce per-minute limits over shorter windows); the token bucket holds one
minute of tokens, so a single large call is possible. Processes that share a
quota pass a ``SharedLimits`` store (``conductor.execution.shared_limits``: SQLite for one
machine, Prefect global concurrency limits for many): the buckets, pauses and
concurrency slots then live in that store instead of in this process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from conductor.workers.providers.base import ProviderError

if TYPE_CHECKING:
    from conductor.workers.pool import Limits, Worker

log = logging.getLogger("conductor.execution.ratelimit")

DEFAULT_MAX_PAUSE_S = 60.0


class Bucket:
    """A token bucket read at the moment of admission: ``wait_time`` says how long until n fit.

    Tokens are taken when a caller actually proceeds, never promised ahead, so a
    process that wakes up late (a busy machine) cannot catch up in a burst above
    the capacity. ``refund`` may push the level below zero (a call that used more
    tokens than it reserved): later callers then wait that debt out.

    >>> b = Bucket(rate=10.0, capacity=2.0)
    >>> b.take(1, now=0.0); b.take(1, now=0.0); round(b.wait_time(1, now=0.0), 3)
    0.1
    >>> b.wait_time(1, now=0.1)
    0.0
    """

    def __init__(self, rate: float, capacity: float):
        self.rate = rate
        self.capacity = capacity
        self.level = capacity
        self.t: float | None = None

    def _refill(self, now: float) -> None:
        if self.t is not None and now > self.t:
            self.level = min(self.capacity, self.level + (now - self.t) * self.rate)
        self.t = now if self.t is None else max(self.t, now)

    def wait_time(self, n: float, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        self._refill(now)
        # a shortfall below float resolution would ask for a wait too small to move the clock: never ending
        return 0.0 if self.level >= n - 1e-9 else (n - self.level) / self.rate

    def take(self, n: float, now: float | None = None) -> None:
        self._refill(time.monotonic() if now is None else now)
        self.level -= n

    def refund(self, n: float) -> None:
        self.level = min(self.capacity, self.level + n)

    def drain(self) -> None:
        """After a 429 the provider disagrees with us: spend any burst we thought we had."""
        self.level = min(self.level, 0.0)


def bucket_shapes(limits: Limits, burst_s: float) -> dict[str, tuple[float, float]]:
    """(rate per second, capacity) of the request and token buckets a worker's limits imply.

    >>> from conductor.workers.pool import Limits
    >>> bucket_shapes(Limits(requests_per_minute=1500, tokens_per_minute=60000), 1.0)
    {'rpm': (25.0, 25.0), 'tpm': (1000.0, 60000.0)}
    """
    out = {}
    rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
    if rpm:
        out["rpm"] = (rpm / 60.0, max(1.0, rpm / 60.0 * burst_s))
    if tpm:
        out["tpm"] = (tpm / 60.0, float(tpm))
    return out


class SharedKey(Protocol):
    """One limit key's buckets, pause and concurrency slots in a store shared by several processes."""

    async def acquire(self, tokens: int, pause_budget_s: float | None) -> tuple[Any, float]:
        """Wait until a slot, one request and ``tokens`` fit, take them; return (lease, seconds paused).

        A shared Retry-After pause longer than ``pause_budget_s`` (what is left of the call's
        timeout) raises a ``rate_limited`` ProviderError at once instead of being waited out."""

    async def release(self, lease: Any, unused_tokens: int) -> None:
        """Free the slot; give back reserved tokens the call did not use (negative: charge an overrun)."""

    async def pause(self, seconds: float) -> None:
        """Pause the key for every process (a provider's Retry-After) and spend its request burst."""


class SharedLimits(Protocol):
    """A store of limits shared by processes (see ``conductor.execution.shared_limits``)."""

    spec: str

    def key(self, name: str, limits: Limits, burst_s: float) -> SharedKey: ...


@dataclass
class Permit:
    limiter: KeyLimiter
    reserved_tokens: int
    lease: Any = None
    paused_s: float = 0.0      # spent waiting out Retry-After pauses: counts against the call's timeout
    unused_tokens: int = 0

    def settle(self, used_tokens: int | None) -> None:
        """Refund reserved-but-unused tokens (or charge the overrun) once usage is known."""
        if used_tokens is None:
            return
        if self.limiter.shared is not None:
            self.unused_tokens = self.reserved_tokens - used_tokens     # returned with the lease
        elif self.limiter.tpm is not None:
            self.limiter.tpm.refund(self.reserved_tokens - used_tokens)


def check_pause(name: str, left: float, budget_s: float | None) -> None:
    """Raise ``rate_limited`` when a pause of ``left`` seconds outlasts what is left of the call's timeout."""
    if budget_s is not None and left > budget_s:
        raise ProviderError("rate_limited", f"{name}: paused by the provider's Retry-After for {left:.1f} s more, "
                            f"beyond the {max(0.0, budget_s):.1f} s left of the call timeout", retry_after=left)


class KeyLimiter:
    """All limits for one limit key, shared by every caller in this process (and beyond, with ``shared``)."""

    def __init__(self, name: str, limits: Limits, burst_s: float = 1.0, *,
                 shared: SharedKey | None = None, max_pause_s: float = DEFAULT_MAX_PAUSE_S):
        self.name = name
        shapes = bucket_shapes(limits, burst_s)
        self.rpm = Bucket(*shapes["rpm"]) if "rpm" in shapes else None
        self.tpm = Bucket(*shapes["tpm"]) if "tpm" in shapes else None
        self.tpm_capacity = limits.tokens_per_minute
        self.shared = shared
        self.unmetered = self.rpm is None and self.tpm is None and shared is None
        self.max_pause_s = max_pause_s
        self.sem = asyncio.Semaphore(limits.max_concurrency)
        self.gate = asyncio.Lock()
        self.max_concurrency = limits.max_concurrency
        self.blocked_until = 0.0
        self.in_flight = 0
        self.peak_in_flight = 0
        self.waited_s = 0.0
        self.pauses = 0
        self.paused_s = 0.0

    def check_fits(self, tokens: int) -> None:
        if self.tpm_capacity is not None and tokens > self.tpm_capacity:
            raise ProviderError("permanent", f"{self.name}: one call may need {tokens} tokens but "
                                f"tokens_per_minute is {self.tpm_capacity:g}; raise the limit or lower max_tokens")

    def pause_for(self, retry_after: float | None) -> float:
        """Seconds this key pauses for a provider's Retry-After: capped at ``max_pause_s``, always logged."""
        if not retry_after or retry_after <= 0:
            return 0.0
        seconds = min(retry_after, self.max_pause_s)
        if retry_after > self.max_pause_s:
            log.warning("%s: provider asked to retry after %g s; pausing the key for %g s (max_pause_s)",
                        self.name, retry_after, seconds)
        else:
            log.info("%s: provider asked to retry after %g s; pausing the key", self.name, retry_after)
        self.pauses += 1
        self.paused_s += seconds
        return seconds

    async def penalize(self, retry_after: float | None) -> None:
        """Honour a (capped) Retry-After for every caller of this key (every process, with a shared store)."""
        seconds = self.pause_for(retry_after)
        if self.shared is not None:
            await self.shared.pause(seconds)
            return
        if seconds:
            self.blocked_until = max(self.blocked_until, time.monotonic() + seconds)
        if self.rpm is not None:
            self.rpm.drain()

    def slot(self, tokens: int = 0, timeout_s: float | None = None) -> Slot:
        """``async with key.slot(tokens, timeout_s) as permit``: a concurrency slot plus one request and ``tokens``
        tokens taken from the buckets, held for the block.

        ``timeout_s``: the call's timeout. Time spent waiting out a Retry-After pause counts
        against it (``Permit.paused_s``); a pause lasting beyond it fails the call at once as
        ``rate_limited``. Queueing for the buckets does not count: that is the limit working.
        """
        return Slot(self, tokens, timeout_s)

    async def _admit(self, tokens: int, timeout_s: float | None) -> tuple[Any, float]:
        paused = 0.0
        while True:
            now = time.monotonic()
            left = self.blocked_until - now
            if left > 0:
                check_pause(self.name, left, None if timeout_s is None else timeout_s - paused)
                self.waited_s += left
                paused += left
                await asyncio.sleep(left)
                continue
            if self.shared is not None:
                t0 = time.monotonic()
                lease, shared_paused = await self.shared.acquire(
                    tokens, None if timeout_s is None else timeout_s - paused)
                self.waited_s += time.monotonic() - t0
                return lease, paused + shared_paused
            wait = 0.0
            if self.rpm is not None:
                wait = max(wait, self.rpm.wait_time(1, now))
            if self.tpm is not None and tokens:
                wait = max(wait, self.tpm.wait_time(tokens, now))
            if wait <= 0:
                if self.rpm is not None:
                    self.rpm.take(1, now)
                if self.tpm is not None and tokens:
                    self.tpm.take(tokens, now)
                return None, paused
            self.waited_s += wait
            await asyncio.sleep(wait)


class Slot:
    """What ``KeyLimiter.slot`` returns: an async context manager whose ``__aenter__`` waits for the slot and the
    buckets and returns the ``Permit``; ``__aexit__`` gives the slot (and a shared lease) back, whatever happened.

    WHY a class and not an ``@asynccontextmanager`` generator: every worker call enters one, and the generator's
    machinery cost about 2 us a call more (docs/serving.md, "Seventh look")."""

    __slots__ = ("key", "tokens", "timeout_s", "permit")

    def __init__(self, key: KeyLimiter, tokens: int, timeout_s: float | None):
        self.key, self.tokens, self.timeout_s = key, tokens, timeout_s
        self.permit: Permit | None = None

    async def __aenter__(self) -> Permit:
        key = self.key
        key.check_fits(self.tokens)
        await key.sem.acquire()
        try:
            if key.unmetered and not key.gate.locked() and key.blocked_until <= time.monotonic():
                lease, paused = None, 0.0    # no bucket, no store, no pause: nothing for the gate to watch
            else:
                async with key.gate:         # FIFO: the head waiter alone watches the buckets
                    lease, paused = await key._admit(self.tokens, self.timeout_s)
        except BaseException:
            key.sem.release()
            raise
        key.in_flight += 1
        key.peak_in_flight = max(key.peak_in_flight, key.in_flight)
        self.permit = Permit(key, self.tokens, lease, paused)
        return self.permit

    async def __aexit__(self, *exc: object) -> None:
        key, permit = self.key, self.permit
        try:
            key.in_flight -= 1
            if key.shared is not None and permit is not None:   # same task: Prefect's slot exits where it entered
                await key.shared.release(permit.lease, permit.unused_tokens)
        finally:
            key.sem.release()


class RateLimiter:
    """The process-wide table of key limiters (one per ``Worker.limit_key``).

    ``shared``: a store that several processes use for the same quotas (None: this
    process alone). ``max_pause_s``: the longest a Retry-After pauses a key.
    """

    def __init__(self, burst_s: float = 1.0, shared: SharedLimits | None = None,
                 max_pause_s: float = DEFAULT_MAX_PAUSE_S):
        self.burst_s = burst_s
        self.shared = shared
        self.max_pause_s = max_pause_s
        self._keys: dict[tuple[str, str, str], KeyLimiter] = {}

    def fresh(self) -> RateLimiter:
        """The same configuration with new per-loop state (semaphores cannot cross event loops)."""
        return RateLimiter(self.burst_s, self.shared, self.max_pause_s)

    def for_worker(self, worker: Worker) -> KeyLimiter:
        key = worker.limit_key
        lim = self._keys.get(key)
        if lim is None:
            name = "/".join(k for k in key if k)
            shared = self.shared.key(name, worker.limits, self.burst_s) if self.shared is not None else None
            lim = self._keys[key] = KeyLimiter(name, worker.limits, self.burst_s, shared=shared,
                                               max_pause_s=self.max_pause_s)
        return lim

    def slot(self, worker: Worker, tokens: int = 0, timeout_s: float | None = None) -> Slot:
        return self.for_worker(worker).slot(tokens, timeout_s)

    def stats(self) -> dict[str, dict[str, float]]:
        return {k.name: {"peak_in_flight": k.peak_in_flight, "waited_s": round(k.waited_s, 3),
                         "pauses": k.pauses, "paused_s": round(k.paused_s, 3)}
                for k in self._keys.values()}


def limit_problems(worker: Worker) -> list[str]:
    """Limits under which this worker can never be called, as one-line messages (empty: fine).

    >>> from conductor.workers.pool import Worker
    >>> limit_problems(Worker(name="w", provider="openai", model="m", limits={"tokens_per_minute": 1000}))
    ['worker w: max_tokens 4096 alone exceeds tokens_per_minute 1000: no call can ever be admitted']
    """
    s, lim = worker.sampling, worker.limits
    out = []
    need = s.max_tokens + (s.thinking_budget or 0)
    if lim.tokens_per_minute is not None and need > lim.tokens_per_minute:
        out.append(f"worker {worker.name}: max_tokens {need} alone exceeds tokens_per_minute "
                   f"{lim.tokens_per_minute:g}: no call can ever be admitted")
    if lim.requests_per_minute is not None and lim.requests_per_minute < 1 / 60:
        out.append(f"worker {worker.name}: requests_per_minute {lim.requests_per_minute:g} admits no call per hour")
    return out
