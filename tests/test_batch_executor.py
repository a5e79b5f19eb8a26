"""Batch mode end to end: the wave scheduler over the real SDKs' batch APIs (emulated), against a synchronous run.

The same trajectories run synchronously and in batch mode; answers, every call's messages, tokens and
finish reason, the cache entries and the record fields must agree; batched calls cost half. Failures,
expiry, the straggler lane, resume from the batch store and the price tiers are checked on their own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from pathlib import Path

import pytest

from conductor.execution.batch.executor import BatchExecutor
from conductor.execution.batch.settings import BatchSettings
from conductor.execution.batch.store import BatchStore
from conductor.execution.cache import ResponseCache
from conductor.execution.executor import Executor
from conductor.execution.recursion import execute_batch, run_batch
from conductor.execution.retry import RetryPolicy
from conductor.testing.emulator import Emulator
from conductor.trajectory import Trajectory
from conductor.workers.pool import Pool
from tests.fixtures_emulator import emu as _emu  # noqa: F401 - pytest fixtures, used by name
from tests.fixtures_emulator import emulator, lists, make_traj, worker  # noqa: F401

FAST = RetryPolicy(base_s=0.005, max_wait_s=0.2)
PRICE = {"input_per_mtok": 2.0, "output_per_mtok": 8.0}
WORKFLOWS = [
    lists([0, 1, 2], ["Solve it.", "Solve it independently.", "Compare both and answer."], [[], [], ["all"]]),
    lists([2, 3, 0], ["Plan.", "Work it out.", "Check and answer."], [[], [0], ["all"]]),
    lists([1], ["Answer directly."], [[]]),
    lists([3, 1], ["Draft.", "Improve the draft."], [[], [0]]),
    lists([0, 0], ["Solve.", "Re-check the solution above."], [[], ["all"]]),
]


@pytest.fixture()
def emu(_emu: Emulator) -> Emulator:
    _emu.configure(batch_delay_s=0.1, batch_window_s=None, batch_error_p=0.0, cached_input_fraction=0.0)
    return _emu


def pool(emu: Emulator) -> Pool:
    """Three batchable providers and one OpenAI-compatible server without a batch API (it calls synchronously)."""
    return Pool(pool_id="emu", workers=(
        worker(emu, "gpt", "openai", price=PRICE), worker(emu, "claude", "anthropic", price=PRICE),
        worker(emu, "gemini", "google", price=PRICE), worker(emu, "vllm", "openai_compatible", price=PRICE)))


def trajs(questions: list[str] | None = None) -> list[Trajectory]:
    qs = questions or [f"Question {i}: what is {i} + {i}?" for i in range(len(WORKFLOWS))]
    return [make_traj(WORKFLOWS[i % len(WORKFLOWS)], question=q, qid=f"q{i}") for i, q in enumerate(qs)]


def run_batched(ts: list[Trajectory], p: Pool, tmp: Path, settings: BatchSettings | None = None,
                cache: str = "cache.sqlite") -> tuple[list[Trajectory], BatchExecutor]:
    ex = BatchExecutor(store=BatchStore(tmp / "batches.sqlite"), settings=settings or BatchSettings(poll_s=0.02),
                       cache=ResponseCache(tmp / cache), retry=FAST)
    ex.expect(len(ts))

    async def main() -> list[Trajectory]:
        try:
            return await execute_batch(ts, p.full(), ex, on_done=lambda t: ex.trajectory_done())
        finally:
            ex.stats_at_close = ex.batch_stats  # type: ignore[attr-defined]
            await ex.aclose()

    out = asyncio.run(main())
    ex.cache.close()
    ex.store.close()
    return out, ex


def cache_rows(path: Path) -> set[tuple]:
    with sqlite3.connect(path) as c:
        return set(c.execute("SELECT key, provider, model, text, input_tokens, output_tokens, finish_reason FROM responses"))


def test_batch_run_equals_the_synchronous_run_at_half_the_price(emu: Emulator, tmp_path: Path) -> None:
    p = pool(emu)
    sync_cache = ResponseCache(tmp_path / "sync.sqlite")
    sync = run_batch(trajs(), p.full(), Executor(cache=sync_cache, retry=FAST))
    sync_cache.close()
    emu.reset()
    batched, ex = run_batched(trajs(), p, tmp_path)

    for s, b in zip(sync, batched):
        assert not s.infra_failed and not b.infra_failed, (s.infra_cause, b.infra_cause)
        assert b.final_answer == s.final_answer and b.rounds[0].final_answer == s.rounds[0].final_answer
        assert len(b.calls) == len(s.calls)
        for cs, cb in zip(s.calls, b.calls):
            assert set(dataclasses.asdict(cb)) == set(dataclasses.asdict(cs))        # same record shape
            same = ("call_id", "worker", "provider", "model", "access", "messages_hash", "response", "finish_reason",
                    "input_tokens", "output_tokens", "cache_hit", "error")
            assert [getattr(cb, f) for f in same] == [getattr(cs, f) for f in same]
            expected = cs.cost_usd / 2 if cs.provider != "openai_compatible" else cs.cost_usd
            assert cb.cost_usd == pytest.approx(expected)
    assert cache_rows(tmp_path / "cache.sqlite") == cache_rows(tmp_path / "sync.sqlite")   # same cache entries

    created = emu.batches()
    counts = emu.stats()
    assert counts.get("openai_compatible", 0) == 0 and counts["openai"] == sum(   # only vLLM went synchronously
        1 for t in batched for c in t.calls if c.provider == "openai_compatible")
    assert counts.get("anthropic", 0) == 0 and counts.get("gemini", 0) == 0
    # wave 1 = every batched step that needs no batched reply (synchronous steps run before it), one batch per provider
    first_steps = {c.messages_hash for t in batched for c in t.calls if c.provider != "openai_compatible"
                   and all(t.calls[j].provider == "openai_compatible" for j in c.access)}
    first_wave = created[:3]
    assert sorted(b["route"] for b in first_wave) == ["anthropic", "gemini", "openai"]
    assert sum(len(b["custom_ids"]) for b in first_wave) == len(first_steps)
    stats = ex.stats_at_close  # type: ignore[attr-defined]
    assert stats["batched_requests"] == sum(len(b["custom_ids"]) for b in created)
    assert stats.get("sync_stragglers", 0) == 0 and stats.get("resubmitted", 0) == 0


def test_a_rerun_submits_nothing_and_costs_the_same(emu: Emulator, tmp_path: Path) -> None:
    p = pool(emu)
    first, _ = run_batched(trajs(), p, tmp_path)
    n_batches = len(emu.batches())
    again, _ = run_batched(trajs(), p, tmp_path)
    assert len(emu.batches()) == n_batches                      # answered from the cache: no new batch
    for a, b in zip(first, again):
        assert b.final_answer == a.final_answer
        assert [c.cost_usd for c in b.calls] == pytest.approx([c.cost_usd for c in a.calls])   # still batch prices
        assert all(c.cache_hit for c in b.calls)


def test_a_resumed_run_polls_the_batches_it_finds_instead_of_submitting_again(emu: Emulator, tmp_path: Path) -> None:
    """A run stopped while polling (its batches created, handles stored) is finished by the next run."""
    emu.configure(batch_delay_s=1.0)
    p = pool(emu)
    ts = trajs()
    ex = BatchExecutor(store=BatchStore(tmp_path / "batches.sqlite"), settings=BatchSettings(poll_s=0.02),
                       cache=ResponseCache(tmp_path / "cache.sqlite"), retry=FAST)
    ex.expect(len(ts))

    async def stopped_while_polling() -> None:
        task = asyncio.ensure_future(execute_batch(ts, p.full(), ex, on_done=lambda t: ex.trajectory_done()))
        while not emu.batches():
            await asyncio.sleep(0.01)
        while len(ex.store.batches()) < len(emu.batches()) or ex.lane.stats["batches"] < 3:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ex.aclose()

    asyncio.run(stopped_while_polling())
    ex.cache.close()
    ex.store.close()
    first_wave = {cid for b in emu.batches() for cid in b["custom_ids"]}
    assert first_wave and all(b["status"] == "in_progress" for b in emu.batches())

    resumed, ex2 = run_batched(trajs(), p, tmp_path)
    assert all(not t.infra_failed and t.final_answer for t in resumed)
    submitted = [cid for b in emu.batches() for cid in b["custom_ids"]]
    assert len(submitted) == len(set(submitted))                # no request was ever submitted twice
    assert ex2.stats_at_close["resumed_batches"] == 3           # type: ignore[attr-defined]


def test_failed_and_expired_requests_are_resubmitted_then_called_synchronously(emu: Emulator, tmp_path: Path) -> None:
    p = pool(emu)
    qs = ["Question 0: flaky [[batchfault:error*1]]", "Question 1: never runs in a batch [[batchfault:expire]]",
          "Question 2: fine"]
    ts = [make_traj(lists([1], ["Answer."], [[]]), question=q, qid=f"q{i}") for i, q in enumerate(qs)]
    out, ex = run_batched(ts, p, tmp_path, BatchSettings(poll_s=0.02, resubmits=1))
    assert all(not t.infra_failed and t.final_answer.startswith("reply from claude-model") for t in out)
    subs = BatchStore(tmp_path / "batches.sqlite").submissions()
    stats = ex.stats_at_close  # type: ignore[attr-defined]
    assert sorted(subs.values()) == [1, 2, 2]                   # the fine one once; the other two resubmitted once
    assert stats["resubmitted"] == 2 and stats["sync_stragglers"] == 1
    assert emu.stats()["anthropic"] == 1                        # the expired one, synchronously, at list price
    def list_price(c):  # noqa: ANN001, ANN202
        return (c.input_tokens * 2.0 + c.output_tokens * 8.0) / 1e6

    [flaky, stuck, fine] = [t.calls[0] for t in out]
    assert flaky.cost_usd == pytest.approx(list_price(flaky) / 2) and fine.cost_usd == pytest.approx(list_price(fine) / 2)
    assert stuck.cost_usd == pytest.approx(list_price(stuck))


def test_without_the_straggler_lane_an_expired_request_is_an_infra_failure(emu: Emulator, tmp_path: Path) -> None:
    p = pool(emu)
    ts = [make_traj(lists([2], ["Answer."], [[]]), question="stuck [[batchfault:expire]]"),
          make_traj(lists([2], ["Answer."], [[]]), question="fine", qid="q1")]
    out, _ = run_batched(ts, p, tmp_path, BatchSettings(poll_s=0.02, resubmits=0, sync_stragglers=False))
    assert out[0].infra_failed and "expired" in (out[0].infra_cause or "") and out[0].final_answer is None
    assert not out[1].infra_failed and out[1].final_answer
    assert emu.stats().get("gemini", 0) == 0


def test_a_refused_key_fails_the_calls_like_a_synchronous_run(emu: Emulator, tmp_path: Path) -> None:
    emu.configure(api_key="the-right-key")
    out, _ = run_batched([make_traj(lists([1], ["Answer."], [[]]))], pool(emu), tmp_path)
    assert out[0].infra_failed and (out[0].infra_cause or "").startswith("auth")


def test_small_waves_can_take_the_synchronous_lane(emu: Emulator, tmp_path: Path) -> None:
    p = pool(emu)
    out, ex = run_batched(trajs()[:2], p, tmp_path, BatchSettings(poll_s=0.02, sync_below=100))
    assert not emu.batches() and all(t.final_answer for t in out)
    assert all(c.cost_usd == pytest.approx((c.input_tokens * 2 + c.output_tokens * 8) / 1e6) for t in out for c in t.calls)


def test_cached_input_is_priced_at_the_cached_rate(emu: Emulator, tmp_path: Path) -> None:
    emu.configure(cached_input_fraction=0.5)
    price = {**PRICE, "cached_input_per_mtok": 0.2}
    p = Pool(pool_id="emu", workers=(worker(emu, "gpt", "openai", price=price),))
    [t], _ = run_batched([make_traj(lists([0], ["Answer."], [[]]))], p, tmp_path)
    c = t.calls[0]
    cached = int(c.input_tokens * 0.5)
    expected = ((c.input_tokens - cached) * 1.0 + cached * 0.1 + c.output_tokens * 4.0) / 1e6   # batch = half of each
    assert c.cost_usd == pytest.approx(expected)


def test_workers_can_opt_in_or_out_in_the_manifest(emu: Emulator, tmp_path: Path) -> None:
    p = Pool(pool_id="emu", workers=(worker(emu, "gpt", "openai", price=PRICE, batch=False),
                                     worker(emu, "claude", "anthropic", price=PRICE)))
    ts = [make_traj(lists([0, 1], ["a", "b"], [[], [0]]))]
    out, _ = run_batched(ts, p, tmp_path, BatchSettings(poll_s=0.02))
    assert [b["route"] for b in emu.batches()] == ["anthropic"] and emu.stats()["openai"] == 1
    assert out[0].final_answer
    emu.reset()
    p2 = Pool(pool_id="emu", workers=(worker(emu, "gpt", "openai", price=PRICE, batch=True),
                                      worker(emu, "claude", "anthropic", price=PRICE)))
    run_batched([make_traj(lists([0, 1], ["c", "d"], [[], [0]]))], p2, tmp_path, BatchSettings(enabled=False, poll_s=0.02),
                cache="cache2.sqlite")
    assert [b["route"] for b in emu.batches()] == ["openai"] and emu.stats()["anthropic"] == 1


def test_a_batch_the_provider_no_longer_has_is_submitted_again(emu: Emulator, tmp_path: Path) -> None:
    """A stored handle whose batch is gone (404) does not strand its calls: they go into a new batch."""
    emu.configure(batch_delay_s=30.0)
    p = pool(emu)
    ts = [make_traj(lists([1], ["Answer."], [[]]), question=f"Question {i}", qid=f"q{i}") for i in range(3)]
    ex = BatchExecutor(store=BatchStore(tmp_path / "batches.sqlite"), settings=BatchSettings(poll_s=0.02),
                       cache=ResponseCache(tmp_path / "cache.sqlite"), retry=FAST)
    ex.expect(len(ts))

    async def stopped() -> None:
        task = asyncio.ensure_future(execute_batch(ts, p.full(), ex, on_done=lambda t: ex.trajectory_done()))
        while not ex.store.batches():
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ex.aclose()

    asyncio.run(stopped())
    ex.cache.close()
    ex.store.close()
    emu.reset()                                    # the provider forgets every batch
    emu.configure(batch_delay_s=0.1)
    out, ex2 = run_batched([make_traj(lists([1], ["Answer."], [[]]), question=f"Question {i}", qid=f"q{i}")
                            for i in range(3)], p, tmp_path)
    assert all(not t.infra_failed and t.final_answer for t in out)
    assert [len(b["custom_ids"]) for b in emu.batches()] == [3]
    assert [b["final_status"] for b in BatchStore(tmp_path / "batches.sqlite").batches()] == ["not_found", "ended"]


def test_recursion_rounds_wait_for_every_thinking_conductor_and_share_a_wave(emu: Emulator, tmp_path: Path) -> None:
    """A trajectory whose conductor is still writing its next round holds the wave back, so the next round of
    every question goes out in one batch, not one batch per question."""
    from conductor.generation import Generation

    p = pool(emu)
    root = lists([1, 1], ["Draft.", "Improve the draft."], [[], [0]])   # 2 calls: room for a 1-step round (< 2x)
    ts = [make_traj(root, question=f"Question {i}", qid=f"q{i}") for i in range(3)]
    delays = iter([0.05, 0.3, 0.6])

    async def conductor(prompt: str) -> Generation:
        await asyncio.sleep(next(delays))   # the conductors finish thinking at different times
        return Generation(lists([1], ["Check the previous answer and answer again."], [["all"]]))

    ex = BatchExecutor(store=BatchStore(tmp_path / "batches.sqlite"), settings=BatchSettings(poll_s=0.02),
                       cache=ResponseCache(tmp_path / "cache.sqlite"), retry=FAST)
    ex.expect(len(ts))

    async def main() -> list[Trajectory]:
        try:
            return await execute_batch(ts, p.full(), ex, conductor=conductor, max_depth=1,
                                       on_done=lambda t: ex.trajectory_done())
        finally:
            await ex.aclose()

    out = asyncio.run(main())
    assert all(t.recursion_depth == 1 and not t.infra_failed and t.final_answer for t in out)
    assert [(b["route"], len(b["custom_ids"])) for b in emu.batches()] == [("anthropic", 3)] * 3
