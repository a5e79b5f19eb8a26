"""Retries for one provider call: tenacity back-off with full jitter, Retry-After aware.

WHY here and not in the SDKs: SDK retries are invisible (no count, no shared
Retry-After, no global limits). Each attempt re-acquires its rate-limit slot
and runs under a per-call timeout, so a retried call never bypasses the limits
and a hung connection becomes a classified ``timeout``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from conductor.workers.providers.base import ProviderError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int | None = None    # None: the worker's ``limits.max_retries``
    base_s: float = 0.5               # back-off scale: attempt k waits U(0, base * 2**k), capped
    max_wait_s: float = 30.0
    timeout_s: float | None = None    # None: the worker's ``limits.timeout_s``


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, ProviderError) and exc.retryable


def backoff_s(policy: RetryPolicy, failures: int, retry_after: float | None) -> float:
    """Wait before the next attempt: full jitter U(0, base * 2**(failures-1)), capped, but never under Retry-After.

    >>> backoff_s(RetryPolicy(base_s=0.0), 3, 1.5)
    1.5
    >>> 0 <= backoff_s(RetryPolicy(base_s=1.0, max_wait_s=2.0), 5, None) <= 2.0
    True
    """
    high = min(policy.max_wait_s, policy.base_s * 2 ** max(0, failures - 1))
    return max(min(retry_after or 0.0, policy.max_wait_s), random.uniform(0, high))


def _waiter(policy: RetryPolicy, earlier_failures: int) -> Callable[[RetryCallState], float]:
    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        return backoff_s(policy, earlier_failures + state.attempt_number, getattr(exc, "retry_after", None))
    return wait


def timed_out(who: str, seconds: float) -> ProviderError:
    """The classified error of a call that got no reply within its timeout.

    >>> str(timed_out("worker a", 2.5))
    'worker a: no reply within 2.5 s'
    """
    return ProviderError("timeout", f"{who}: no reply within {seconds:g} s")


async def call_with_retries(attempt: Callable[[], Awaitable[T]], max_retries: int, policy: RetryPolicy,
                            on_retry: Callable[[ProviderError], None] | None = None) -> tuple[T, int]:
    """Run ``attempt`` until it succeeds or fails permanently; return (result, retries used).

    The first attempt runs bare (the common case costs no retry machinery); only
    after a retryable failure does tenacity take over for the remaining attempts.
    """
    try:
        return await attempt(), 0
    except ProviderError as e:
        if not e.retryable or max_retries <= 0:
            e.retries = 0  # type: ignore[attr-defined]
            raise
        if on_retry is not None:
            on_retry(e)
        await asyncio.sleep(backoff_s(policy, 1, e.retry_after))
    retries = 1

    def before_sleep(state: RetryCallState) -> None:
        nonlocal retries
        retries += 1
        exc = state.outcome.exception() if state.outcome else None
        if on_retry is not None and isinstance(exc, ProviderError):
            on_retry(exc)

    try:
        async for tr in AsyncRetrying(stop=stop_after_attempt(max_retries), wait=_waiter(policy, 1),
                                      retry=retry_if_exception(_retryable), reraise=True,
                                      before_sleep=before_sleep):
            with tr:
                result = await attempt()
    except ProviderError as e:
        e.retries = retries  # type: ignore[attr-defined]
        raise
    return result, retries
