"""Per-(provider, endpoint, model) rate limits: RPM and TPM buckets plus a concurrency cap.

WHY this shape: thousands of concurrent workflow steps share one provider
quota. Waiters queue in arrival order (a FIFO lock); only the head of the queue
watches the buckets and sleeps exactly until its request and tokens fit, then
takes them at that moment. Nothing is promised ahead, so a late wake-up on a
busy machine cannot release a catch-up burst above the bucket's capacity, and
with no polling the achieved rate sits right at the limit. Token use is
reserved as (input estimate + max_tokens), like providers count it, and the
unused part is refunded when the reply arrives.
A 429's Retry-After pauses the whole key, not just the caller that saw it.

The request bucket bursts at most ``burst_s`` seconds of requests (providers
enforce per-minute limits over shorter windows); the token bucket holds one
minute of tokens, so a single large call is possible. For several processes,
``PrefectSlots`` adds a Prefect global concurrency limit as a shared coarse cap.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, AsyncIterator

from conductor.providers.base import ProviderError

if TYPE_CHECKING:
    from conductor.pool import Limits, Worker


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
        return 0.0 if self.level >= n else (n - self.level) / self.rate

    def take(self, n: float, now: float | None = None) -> None:
        self._refill(time.monotonic() if now is None else now)
        self.level -= n

    def refund(self, n: float) -> None:
        self.level = min(self.capacity, self.level + n)

    def drain(self) -> None:
        """After a 429 the provider disagrees with us: spend any burst we thought we had."""
        self.level = min(self.level, 0.0)


@dataclass
class Permit:
    limiter: "KeyLimiter"
    reserved_tokens: int

    def settle(self, used_tokens: int | None) -> None:
        """Refund reserved-but-unused tokens (or charge the overrun) once usage is known."""
        if self.limiter.tpm is not None and used_tokens is not None:
            self.limiter.tpm.refund(self.reserved_tokens - used_tokens)


class KeyLimiter:
    """All limits for one limit key, shared by every caller in this process."""

    def __init__(self, name: str, limits: "Limits", burst_s: float = 1.0):
        self.name = name
        rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
        self.rpm = Bucket(rpm / 60.0, max(1.0, rpm / 60.0 * burst_s)) if rpm else None
        self.tpm = Bucket(tpm / 60.0, tpm) if tpm else None
        self.sem = asyncio.Semaphore(limits.max_concurrency)
        self.gate = asyncio.Lock()
        self.max_concurrency = limits.max_concurrency
        self.blocked_until = 0.0
        self.in_flight = 0
        self.peak_in_flight = 0
        self.waited_s = 0.0

    def check_fits(self, tokens: int) -> None:
        if self.tpm is not None and tokens > self.tpm.capacity:
            raise ProviderError("permanent", f"{self.name}: one call may need {tokens} tokens but "
                                f"tokens_per_minute is {self.tpm.capacity:g}; raise the limit or lower max_tokens")

    def penalize(self, retry_after: float | None) -> None:
        """Honour a Retry-After for every caller of this key."""
        if retry_after:
            self.blocked_until = max(self.blocked_until, time.monotonic() + retry_after)
        if self.rpm is not None:
            self.rpm.drain()

    @asynccontextmanager
    async def slot(self, tokens: int = 0) -> AsyncIterator[Permit]:
        """Hold a concurrency slot plus one request and ``tokens`` tokens taken from the buckets."""
        self.check_fits(tokens)
        async with self.sem:
            async with self.gate:            # FIFO: the head waiter alone watches the buckets
                await self._admit(tokens)
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            try:
                yield Permit(self, tokens)
            finally:
                self.in_flight -= 1

    async def _admit(self, tokens: int) -> None:
        while True:
            now = time.monotonic()
            wait = self.blocked_until - now
            if self.rpm is not None:
                wait = max(wait, self.rpm.wait_time(1, now))
            if self.tpm is not None and tokens:
                wait = max(wait, self.tpm.wait_time(tokens, now))
            if wait <= 0:
                if self.rpm is not None:
                    self.rpm.take(1, now)
                if self.tpm is not None and tokens:
                    self.tpm.take(tokens, now)
                return
            self.waited_s += wait
            await asyncio.sleep(wait)


class RateLimiter:
    """The process-wide table of key limiters (one per ``Worker.limit_key``)."""

    def __init__(self, burst_s: float = 1.0, prefect: "PrefectSlots | None" = None):
        self.burst_s = burst_s
        self.prefect = prefect
        self._keys: dict[tuple[str, str, str], KeyLimiter] = {}

    def for_worker(self, worker: "Worker") -> KeyLimiter:
        key = worker.limit_key
        lim = self._keys.get(key)
        if lim is None:
            lim = self._keys[key] = KeyLimiter("/".join(k for k in key if k), worker.limits, self.burst_s)
        return lim

    @asynccontextmanager
    async def slot(self, worker: "Worker", tokens: int = 0) -> AsyncIterator[Permit]:
        lim = self.for_worker(worker)
        if self.prefect is None:
            async with lim.slot(tokens) as permit:
                yield permit
        else:
            async with self.prefect.slot(worker), lim.slot(tokens) as permit:
                yield permit

    def stats(self) -> dict[str, dict[str, float]]:
        return {k.name: {"peak_in_flight": k.peak_in_flight, "waited_s": round(k.waited_s, 3)}
                for k in self._keys.values()}


class PrefectSlots:
    """A Prefect global concurrency limit per limit key, shared by every process of a run.

    WHY coarse: each acquisition is a round trip to the Prefect API, so it caps
    how many calls are in flight across processes while the in-process buckets
    keep the fine-grained rate. Limits are created on first use with the
    worker's ``max_concurrency`` (times ``processes`` if each process should
    keep its own cap as the share). Prefect is imported only here.
    """

    def __init__(self, prefix: str = "conductor", lease_s: float = 300.0):
        self.prefix = prefix
        self.lease_s = lease_s
        self._ready: set[str] = set()

    def name(self, worker: "Worker") -> str:
        provider, base, model = worker.limit_key
        raw = f"{self.prefix}:{provider}:{model}" + (f"@{base}" if base else "")
        return "".join(c if c.isalnum() or c in ":-_.@" else "_" for c in raw)[:200]

    async def ensure(self, worker: "Worker") -> str:
        name = self.name(worker)
        if name in self._ready:
            return name
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
        from prefect.exceptions import ObjectNotFound

        async with get_client() as client:
            try:
                await client.read_global_concurrency_limit_by_name(name)
            except ObjectNotFound:
                try:
                    await client.create_global_concurrency_limit(
                        GlobalConcurrencyLimitCreate(name=name, limit=worker.limits.max_concurrency))
                except Exception:  # noqa: BLE001 - another process created it first
                    await client.read_global_concurrency_limit_by_name(name)
        self._ready.add(name)
        return name

    @asynccontextmanager
    async def slot(self, worker: "Worker") -> AsyncIterator[None]:
        from prefect.concurrency.asyncio import concurrency

        name = await self.ensure(worker)
        async with concurrency(name, occupy=1, strict=True, lease_duration=self.lease_s):
            yield


def limit_problems(worker: "Worker") -> list[str]:
    """Limits under which this worker can never be called, as one-line messages (empty: fine).

    >>> from conductor.pool import Worker
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
