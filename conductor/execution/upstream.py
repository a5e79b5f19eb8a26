"""Time a request spends waiting on models (its workers' replies, the conductor's generation), as gateways
measure themselves: a server's own time is its total time minus this.

A server sets one ``UpstreamClock`` per request (``UPSTREAM``, a context variable, so the tasks a request spawns
share it) and the places that await a model wrap the wait in ``awaiting_upstream()``. Calls that overlap (parallel
steps of one workflow) count once: the clock measures the wall time during which at least one is in flight.
Outside a server nothing is set and the wrapper costs one context-variable lookup.

>>> import asyncio
>>> async def two_parallel_calls() -> UpstreamClock:
...     clock = UpstreamClock()
...     UPSTREAM.set(clock)
...     async def call() -> None:
...         with awaiting_upstream():
...             await asyncio.sleep(0.05)
...     await asyncio.gather(call(), call())
...     return clock
>>> c = asyncio.run(two_parallel_calls())
>>> 0.04 < c.waited_s < 0.09 and c.in_flight == 0
True
"""

from __future__ import annotations

import time
from contextvars import ContextVar


class UpstreamClock:
    """Wall time during which at least one model call of one request was being awaited."""

    __slots__ = ("in_flight", "since", "waited_s")

    def __init__(self) -> None:
        self.in_flight = 0
        self.since = 0.0
        self.waited_s = 0.0

    def enter(self) -> None:
        if self.in_flight == 0:
            self.since = time.perf_counter()
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.waited_s += time.perf_counter() - self.since

    def waited(self) -> float:
        """Seconds waited so far, counting a wait still in progress up to now."""
        return self.waited_s + (time.perf_counter() - self.since if self.in_flight else 0.0)


UPSTREAM: ContextVar[UpstreamClock | None] = ContextVar("conductor_upstream_clock", default=None)


class awaiting_upstream:  # noqa: N801 - used as a function: ``with awaiting_upstream():``
    """Count the enclosed wait (one model call) on the current request's clock, if any.

    A class with ``__slots__`` rather than a ``@contextmanager`` generator: every worker call enters one, and the
    generator's machinery cost more than the clock itself."""

    __slots__ = ("clock",)

    def __enter__(self) -> None:
        self.clock = UPSTREAM.get()
        if self.clock is not None:
            self.clock.enter()

    def __exit__(self, *exc: object) -> None:
        if self.clock is not None:
            self.clock.leave()
