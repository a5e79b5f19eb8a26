"""Rate-limit deadlines: a provider's Retry-After never freezes a worker silently, limits must be finite.

Each test fails on the code before issue #17: an uncapped pause waited outside the call timeout without a
log line, and ``timeout_s: .inf`` validated.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conductor.execution.executor import Executor
from conductor.execution.ratelimit import RateLimiter
from conductor.execution.retry import RetryPolicy
from conductor.testing.emulator import Emulator
from conductor.trajectory import CallRecord
from conductor.workers.pool import Pool, PoolError, load_pool
from conductor.workers.providers.base import Message, ProviderError
from tests.fixtures_emulator import emu, emulator, worker  # noqa: F401

MANIFEST = """pool_id: p
workers:
  - name: w
    provider: openai
    model: m
    limits:
      max_concurrency: 4
      {field}: {value}
"""


@pytest.mark.parametrize("field", ["timeout_s", "requests_per_minute", "tokens_per_minute"])
@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_non_finite_limits_are_rejected_with_file_line_field(tmp_path: Path, field: str, value: str) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(MANIFEST.format(field=field, value=value), encoding="utf-8")
    with pytest.raises(PoolError) as e:
        load_pool(path)
    assert str(e.value) == f"{path}:8: workers[0](w).limits.{field}: Input should be a finite number"


def test_cli_names_the_non_finite_limit_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(MANIFEST.format(field="timeout_s", value=".inf"), encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "conductor.cli", "pool", "validate", str(path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"error: {path}:8: workers[0](w).limits.timeout_s: "
                                             "Input should be a finite number"]


def _pool(emu: Emulator, **limits) -> Pool:
    return Pool(pool_id="dl", workers=(worker(emu, "w", "openai", limits=limits),))


async def _call(ex: Executor, pool: Pool, text: str) -> CallRecord:
    rec = CallRecord(call_id="0.0", parent_call_id=None, depth=0, step=0, worker_index=0, worker="w",
                     provider="openai", model="w-model", subtask=text, access=[], access_all=False)
    await ex.call(pool.workers[0], [Message("user", text)], rec)
    return rec


def test_retry_after_of_an_hour_is_capped_and_logged(emu: Emulator, caplog: pytest.LogCaptureFixture) -> None:
    emu.configure(retry_after_s=3600.0)
    pool = _pool(emu, max_retries=2)
    ex = Executor(limiter=RateLimiter(max_pause_s=0.2), retry=RetryPolicy(base_s=0.001, max_wait_s=0.2))

    async def main() -> tuple[CallRecord, CallRecord]:
        async with asyncio.timeout(60):            # the old limiter paused this key for an hour
            first = await _call(ex, pool, "x [[fault:429*1]]")
            second = await _call(ex, pool, "later")
        await ex.aclose()
        return first, second

    with caplog.at_level(logging.INFO, logger="conductor.execution.ratelimit"):
        first, second = asyncio.run(main())
    assert first.error is None and first.retries == 1 and second.error is None
    assert emu.stats()["openai:429"] == 1 and emu.stats()["openai:ok"] == 2
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == ["openai/" + emu.base_url + "/v1/w-model: provider asked to retry after 3600 s; "
                      "pausing the key for 0.2 s (max_pause_s)"]
    assert ex.limiter.stats()["openai/" + emu.base_url + "/v1/w-model"]["pauses"] == 1


def test_a_pause_longer_than_the_call_timeout_fails_the_call_at_once(emu: Emulator) -> None:
    emu.configure(retry_after_s=3600.0)
    pool = _pool(emu, max_retries=0, timeout_s=1.0)
    ex = Executor()                                                # default cap: 60 s

    async def main() -> ProviderError:
        async with asyncio.timeout(20):
            with pytest.raises(ProviderError) as first:
                await _call(ex, pool, "x [[fault:429]]")
            assert first.value.kind == "rate_limited"
            with pytest.raises(ProviderError) as second:
                await _call(ex, pool, "later")
        await ex.aclose()
        return second.value

    err = asyncio.run(main())
    assert err.kind == "rate_limited"
    assert "paused by the provider's Retry-After for" in str(err) and "left of the call timeout" in str(err)
    assert emu.stats() == {"openai": 1, "openai:429": 1}          # the second call never reached the provider


def test_time_paused_counts_against_the_call_timeout(emu: Emulator) -> None:
    emu.configure(retry_after_s=0.6)
    pool = _pool(emu, max_retries=0, timeout_s=1.0)
    ex = Executor()                                                # default cap: 60 s

    async def main() -> ProviderError:
        with pytest.raises(ProviderError):
            await _call(ex, pool, "x [[fault:429]]")
        await asyncio.to_thread(emu.configure, latency_s=0.8)   # fits 1.0 s, not what the pause leaves of it
        with pytest.raises(ProviderError) as second:
            await _call(ex, pool, "later")
        await ex.aclose()
        return second.value

    err = asyncio.run(main())
    assert err.kind == "timeout", err


def test_16_retry_backoff_stays_inside_the_call_deadline(tmp_path, monkeypatch):
    from conductor.execution.executor import Executor
    from conductor.execution.ratelimit import RateLimiter
    from conductor.execution.retry import RetryPolicy
    from conductor.testing.emulator import Emulator
    from conductor.trajectory import CallRecord
    from conductor.workers.pool import Pool
    from conductor.workers.providers.base import Message
    from tests.fixtures_emulator import FAKE_KEYS, worker

    for k, v in FAKE_KEYS.items():
        monkeypatch.setenv(k, v)
    with Emulator() as emu:
        emu.configure(retry_after_s=3600.0)
        pool = Pool(pool_id="dl", workers=(worker(emu, "w", "openai", limits={"timeout_s": 1.0, "max_retries": 1}),))
        ex = Executor(limiter=RateLimiter(max_pause_s=0.2), retry=RetryPolicy(base_s=0.001))   # max_wait_s: 30

        async def main() -> float:
            rec = CallRecord(call_id="0.0", parent_call_id=None, depth=0, step=0, worker_index=0, worker="w",
                             provider="openai", model="w-model", subtask="x", access=[], access_all=False)
            start = time.monotonic()
            await ex.call(pool.workers[0], [Message("user", "x [[fault:429*1]]")], rec)
            await ex.aclose()
            return time.monotonic() - start

        assert asyncio.run(main()) < 8     # was 30 s: the back-off honoured Retry-After outside the deadline
