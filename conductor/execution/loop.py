"""One event loop for the executions of a pipelined run, on a thread of its own.

WHY: an overlapped run executes question k's workflow while question k+1's already runs (conductor/run/shards.py),
so that one worker's server is never idle while another reads: on a small machine a workflow is a chain of
different models (reason on the 1.5B, run the program, report on the 0.5B) and, executed one question at a
time, the 1.5B waits out every report. The executions must share ONE executor (its per-worker concurrency
limits, in-flight coalescing and SDK clients), and an executor is bound to one event loop at a time; so each
execution's coroutine is submitted to this loop from the thread that runs its (synchronous) stage, and the
loop lives until the run ends. ``run_on_shared_loop`` is what ``run_batch`` uses when such a loop is current.

Closing follows ``asyncio.run``: the executor's clients are closed on the loop, then open async generators are
finalised (``LoopBoundClose`` relies on that: conductor/workers/providers/shared.py), then the loop is closed.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

_CURRENT: contextvars.ContextVar[SharedLoop | None] = contextvars.ContextVar("conductor_shared_loop", default=None)


class SharedLoop:
    """An asyncio loop running on a daemon thread; ``run`` blocks the calling thread until a coroutine is done.

    >>> async def double(x):
    ...     await asyncio.sleep(0)
    ...     return 2 * x
    >>> with shared_loop() as loop:
    ...     loop.run(double(21)), current_loop() is loop
    (42, True)
    >>> current_loop() is None
    True
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="conductor-executor-loop", daemon=True)
        self._thread.start()
        self._running: set[Future[Any]] = set()
        self._lock = threading.Lock()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for it; ``CancelledError`` if ``cancel`` stops it."""
        done = asyncio.run_coroutine_threadsafe(coro, self.loop)
        with self._lock:
            self._running.add(done)
        try:
            return done.result()
        finally:
            with self._lock:
                self._running.discard(done)

    def cancel(self) -> None:
        """Cancel every coroutine ``run`` is waiting for (Ctrl-C or SIGTERM: stop now, as ``asyncio.run`` would)."""
        with self._lock:
            for done in self._running:
                done.cancel()

    def close(self, last: Callable[[], Awaitable[None]] | None = None) -> None:
        """Run ``last`` (e.g. the executor's ``aclose``) on the loop, stop it, finalise its async generators and
        close it, as ``asyncio.run`` would."""
        try:
            if last is not None:
                self.run(_awaited(last))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
            try:
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            finally:
                self.loop.close()


async def _awaited(fn: Callable[[], Awaitable[None]]) -> None:
    await fn()


@contextmanager
def shared_loop(last: Callable[[], Awaitable[None]] | None = None) -> Iterator[SharedLoop]:
    """A ``SharedLoop`` current for this context (and the contexts copied from it) until the block ends."""
    loop = SharedLoop()
    token = _CURRENT.set(loop)
    try:
        yield loop
    finally:
        _CURRENT.reset(token)
        loop.close(last)


def current_loop() -> SharedLoop | None:
    return _CURRENT.get()
