"""Rate limits: bucket arithmetic (property-tested) and limits holding against the emulator."""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conductor.execution.executor import Executor
from conductor.execution.ratelimit import Bucket, KeyLimiter, RateLimiter
from conductor.execution.recursion import run_batch
from conductor.execution.retry import RetryPolicy
from conductor.testing.emulator import Emulator
from conductor.workers.pool import Limits, Pool
from conductor.workers.providers.base import ProviderError
from tests.fixtures_emulator import emu, emulator, lists, make_traj, worker  # noqa: F401


@given(rate=st.floats(0.5, 1000), cap=st.floats(1, 100),
       gaps=st.lists(st.floats(0, 2), min_size=1, max_size=200),
       late=st.lists(st.floats(0, 3), min_size=200, max_size=200))
def test_bucket_never_admits_more_than_rate_times_time_plus_burst(rate: float, cap: float, gaps: list[float],
                                                                   late: list[float]) -> None:
    """Even when the admitting process wakes up late (``late``), no window sees more than rate*span + capacity."""
    b = Bucket(rate, cap)
    now = 0.0
    starts = []
    for g, extra in zip(gaps, late):
        now += g
        while (w := b.wait_time(1, now)) > 0:
            now += w + extra          # a sleep that overshoots
        b.take(1, now)
        starts.append(now)
    for i in range(len(starts)):
        for j in range(i, min(len(starts), i + 50)):
            assert (j - i + 1) <= rate * (starts[j] - starts[i]) + cap + 1e-6


def test_bucket_waiters_are_served_at_the_rate() -> None:
    b = Bucket(rate=100.0, capacity=1.0)
    now, starts = 0.0, []
    for _ in range(5):
        now += b.wait_time(1, now)
        b.take(1, now)
        starts.append(now)
    assert starts == pytest.approx([0.0, 0.01, 0.02, 0.03, 0.04])
    b.refund(3)       # refunds never exceed the capacity
    assert b.level <= 1.0


def test_impossible_token_limit_is_a_clear_error() -> None:
    lim = KeyLimiter("openai/m", Limits(tokens_per_minute=1000))
    with pytest.raises(ProviderError, match="tokens_per_minute is 1000"):
        lim.check_fits(5000)


def _pool(emu: Emulator, **limits) -> Pool:
    return Pool(pool_id="rl", workers=(worker(emu, "w", "openai", limits=limits),))


def test_rpm_limit_holds_without_a_single_429(emu: Emulator) -> None:
    # the emulator enforces the same 1200/min (20/s) with 2 s of burst and answers 429 beyond it
    emu.configure(rpm=1200, latency_s=0.005)
    pool = _pool(emu, requests_per_minute=1200, max_concurrency=64)
    trajs = [make_traj(lists([0, 0], ["a", "b"], [[], []]), question=f"q{i}", qid=f"q{i}") for i in range(30)]
    limiter = RateLimiter(burst_s=1.0)
    t0 = time.perf_counter()
    out = run_batch(trajs, pool.full(), Executor(limiter=limiter))
    elapsed = time.perf_counter() - t0
    assert all(not t.infra_failed for t in out)
    stats = emu.stats()
    assert stats["openai:ok"] == 60 and stats.get("openai:429", 0) == 0
    assert elapsed >= (60 - 20) / 20 * 0.9   # 20 burst, then 20/s


def test_retry_after_pauses_the_whole_key(emu: Emulator) -> None:
    emu.configure(retry_after_s=1.0)
    pool = _pool(emu, max_concurrency=8)
    ex = Executor(retry=RetryPolicy(base_s=0.001))

    async def main():
        first = asyncio.create_task(ex.run_workflow("q", _wf("x [[fault:429*1]]"), pool.full()))
        while not (await asyncio.to_thread(emu.stats)).get("openai:429"):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)                  # the client has read the 429: the key is paused ~1 s
        t0 = time.perf_counter()
        await ex.run_workflow("q", _wf("later"), pool.full())
        waited = time.perf_counter() - t0
        res = await first
        await ex.aclose()
        return waited, res

    waited, res = asyncio.run(main())
    assert res.failure is None and res.calls[0].retries == 1
    assert waited >= 0.5


def _wf(subtask: str):
    from conductor.workflow import Step, Workflow
    return Workflow((Step(0, subtask, ()),))


def test_concurrency_cap_holds(emu: Emulator) -> None:
    emu.configure(latency_s=0.05)
    pool = _pool(emu, max_concurrency=3, tokens_per_minute=600_000)
    trajs = [make_traj(lists([0, 0, 0], ["a", "b", "c"], [[], [], []]), question=f"q{i}", qid=f"q{i}") for i in range(6)]
    limiter = RateLimiter()
    out = run_batch(trajs, pool.full(), Executor(limiter=limiter))
    assert all(not t.infra_failed for t in out)
    assert emu.max_in_flight() == 3
    assert next(iter(limiter.stats().values()))["peak_in_flight"] == 3


def test_tokens_are_reserved_then_refunded() -> None:
    lim = KeyLimiter("k", Limits(tokens_per_minute=6000))      # 100 tokens/s, one minute of capacity

    async def main() -> tuple[float, float]:
        async with lim.slot(6000) as p:        # reserve the whole minute...
            p.settle(100)                      # ...use 100: 5900 come back
        t0 = time.perf_counter()
        async with lim.slot(5000) as p:
            p.settle(6000)                     # overrun: the bucket goes into debt
        fast = time.perf_counter() - t0
        t0 = time.perf_counter()
        async with lim.slot(50):
            pass
        return fast, time.perf_counter() - t0

    fast, slow = asyncio.run(main())
    assert fast < 0.1 and slow >= 0.4        # debt of ~(100+6000-5900+50)/100 s had to be repaid
