"""Overlap the conductor's next shard with the workers' current one.

WHY: a shard's two stages use different machines, or on one small machine different servers: the conductor
writes workflows (its own llama.cpp server or vLLM on the GPU), then the workers execute them (worker
servers, provider APIs). Run one after the other, each stage leaves the other's hardware idle. ``one_ahead``
produces the next item of a generator on a background thread while the caller works on the current one, so
shard k+1's workflows are written while shard k's execute. Results are unchanged: generating a shard never
depends on an earlier shard's execution. ``Serialized`` keeps a policy to one call at a time when the
executing stage also calls it (recursion rounds), since in-process engines are not thread-safe.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar, cast

T = TypeVar("T")
_END = object()


def one_ahead(items: Iterator[T]) -> Iterator[T]:
    """Yield ``items`` in order, computing the next one on a background thread while the caller holds this one.

    The background thread runs in a copy of the caller's context (Prefect's flow run context included). An
    exception raised while producing an item is raised to the caller in its place. If the caller stops early,
    an item already being produced is left to finish on its own; no further one is started.

    >>> import threading
    >>> started = threading.Event()
    >>> def shards():
    ...     yield 0
    ...     started.set()          # shard 1 is under way
    ...     yield 1
    >>> [started.wait(5) for _ in one_ahead(shards())]   # holding 0, the caller sees 1 start (a plain loop: False)
    [True, True]
    >>> list(one_ahead(iter([])))
    []
    """
    context = contextvars.copy_context()
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="one-ahead")

    def advance() -> object:
        return context.run(next, items, _END)

    try:
        pending = pool.submit(advance)
        while True:
            item = interruptible(pending)
            if item is _END:
                return
            pending = pool.submit(advance)
            yield cast(T, item)    # not _END, so one of ``items``
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def interruptible(done: Future[T]) -> T:
    """``done.result()``, waking every half second: a signal the OS hands to another thread (Ctrl-C, SIGTERM)
    runs its Python handler only when the main thread next executes, which a plain ``result()`` never lets it.

    >>> pool = ThreadPoolExecutor(1)
    >>> interruptible(pool.submit(sum, [1, 2]))
    3
    """
    while not done.done():
        wait([done], timeout=0.5)
    return done.result()


class Serialized:
    """A policy that serves one ``generate`` at a time; every other attribute is the wrapped policy's."""

    def __init__(self, inner: Any):
        self.inner = inner
        self._lock = threading.Lock()

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return self.inner.generate(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def generation_batch(policy: Any) -> int | None:
    """How many questions ``policy`` is given per generation call in an overlapped run; None: a whole shard.

    A policy says so with a ``generation_batch`` attribute (wrappers are looked through via ``.inner``). A
    batching engine (vLLM) wants whole shards; a server that generates one prompt at a time (the embedded
    llama.cpp conductor) gains nothing from a batch, and a smaller piece lets the workers start sooner.

    >>> class Endpoint:
    ...     generation_batch = 1
    >>> class Wrapper:
    ...     def __init__(self, inner): self.inner = inner
    >>> generation_batch(Wrapper(Serialized(Endpoint()))), generation_batch(Wrapper(object()))
    (1, None)
    """
    value = _looked_through(policy, "generation_batch")
    return value if isinstance(value, int) else None


def overlaps_execution(policy: Any) -> bool:
    """Whether ``policy`` writes the next piece while the workers execute this one (the default), or only between
    executions: a menu's decision is a few tokens on every core, and beside workers on the same cores its spinning
    threads and theirs would slow each other several-fold (conductor/local/layout.py, the serial layout). A policy
    says so with an ``overlaps_execution`` attribute, looked for as ``generation_batch`` is.

    >>> class Menu:
    ...     overlaps_execution = False
    >>> overlaps_execution(Serialized(Menu())), overlaps_execution(object())
    (False, True)
    """
    value = _looked_through(policy, "overlaps_execution")
    return value if isinstance(value, bool) else True


def _looked_through(policy: Any, name: str) -> object:
    """The first ``name`` attribute along ``policy``'s ``.inner`` chain (wrappers), or None."""
    seen = 0
    while policy is not None and seen < 16:
        value = getattr(policy, name, None)
        if value is not None:
            return value
        policy, seen = getattr(policy, "inner", None), seen + 1
    return None
