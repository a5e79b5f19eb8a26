"""Response cache: content addressing, replay without calls, concurrent writers (threads and processes)."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conductor.execution.cache import ResponseCache, cache_key, copy_responses, export_responses
from conductor.execution.executor import Executor
from conductor.execution.recursion import run_batch
from conductor.testing.emulator import Emulator
from conductor.trajectory import CallRecord
from conductor.workers.cost import summarize_run
from conductor.workers.pool import Worker
from conductor.workers.providers.base import Completion, Message
from tests.fixtures_emulator import emu, emulator, lists, make_traj, three_provider_pool, worker  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
WF = lists([0, 1, 2], ["Solve.", "Solve again.", "Pick the better answer."], [[], [], ["all"]])


def test_key_covers_everything_that_changes_a_reply() -> None:
    base = Worker(name="a", provider="openai", model="m")
    msgs = [Message("user", "q")]
    k = cache_key(base, msgs)
    variants = [
        Worker(name="a", provider="openai", model="m2"),
        Worker(name="a", provider="openai_compatible", model="m", base_url="http://127.0.0.1:1/v1"),
        Worker(name="a", provider="openai", model="m", sampling={"temperature": 0.7}),
        Worker(name="a", provider="openai", model="m", options={"extra_body": {"x": 1}}),
    ]
    assert len({k, *(cache_key(w, msgs) for w in variants)}) == 5
    assert cache_key(base, [Message("user", "q2")]) != k and cache_key(base, msgs, 1) != k


def test_put_get_and_first_writer_wins(tmp_path: Path) -> None:
    w = Worker(name="a", provider="openai", model="m")
    cache = ResponseCache(tmp_path / "c.sqlite")

    async def main():
        assert await cache.get("k") is None
        await cache.put("k", w, Completion("one", 3, 4, "stop"))
        await cache.put("k", w, Completion("two", 5, 6, "stop"))
        return await cache.get("k")

    assert asyncio.run(main()) == Completion("one", 3, 4, "stop")
    assert (cache.hits, cache.misses, cache.count()) == (1, 1, 1)
    cache.close()


def test_rerun_and_replay_make_zero_calls(emu: Emulator, tmp_path: Path) -> None:
    pool = three_provider_pool(emu, price={"input_per_mtok": 3.0, "output_per_mtok": 15.0})
    path = tmp_path / "responses.sqlite"
    trajs = lambda: [make_traj(WF, question=f"q{i}", qid=f"q{i}", sample=s) for i in range(4) for s in range(2)]  # noqa: E731
    first = run_batch(trajs(), pool.full(), Executor(cache=ResponseCache(path)))
    n_calls = sum(v for k, v in emu.stats().items() if ":" not in k)
    assert n_calls == 24                           # samples 0 and 1 are distinct calls
    emu.reset()
    again = run_batch(trajs(), pool.full(), Executor(cache=ResponseCache(path)))
    emu.configure(api_key="nobody-has-this")       # a provider that would refuse every call
    replay = run_batch(trajs(), pool.full(), Executor(cache=ResponseCache(path, mode="replay")))
    assert sum(emu.stats().values()) == 0
    for a, b, c in zip(first, again, replay):
        assert a.final_answer == b.final_answer == c.final_answer and not c.infra_failed
        assert all(x.cache_hit for x in b.calls + c.calls) and not any(x.cache_hit for x in a.calls)
        assert [x.cost_usd for x in a.calls] == [x.cost_usd for x in c.calls]
    s1, s2 = summarize_run(first), summarize_run(replay)
    assert s1.cost_usd == pytest.approx(s2.cost_usd) and s1.cost_usd > 0
    assert s1.spent_usd == pytest.approx(s1.cost_usd) and s2.spent_usd == 0 and s2.cache_hits == 24


def test_replay_miss_is_an_infra_failure(emu: Emulator, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pool = three_provider_pool(emu)
    ex = Executor(cache=ResponseCache(tmp_path / "empty.sqlite", mode="replay"))
    with caplog.at_level(logging.WARNING, logger="conductor.execution.executor"):
        out = run_batch([make_traj(WF, question=f"q{i}", qid=f"q{i}") for i in range(5)], pool.full(), ex)
    assert all(t.infra_failed and t.infra_cause.startswith("cache_miss:") for t in out)
    assert sum(emu.stats().values()) == 0
    # a partial recording misses every call of every unrecorded question: one warning per worker, not per call
    missed = {c.worker for t in out for c in t.calls if c.error_kind == "cache_miss"}
    warned = [r.getMessage() for r in caplog.records if "cache_miss" in r.getMessage()]
    assert len(warned) == len(missed) >= 1 and all("further misses" in m for m in warned)


_WRITER = textwrap.dedent("""
    import asyncio, sys
    sys.path.insert(0, {root!r})
    from conductor.execution.cache import ResponseCache
    from conductor.workers.pool import Worker
    from conductor.workers.providers.base import Completion
    w = Worker(name="a", provider="openai", model="m")
    cache = ResponseCache(sys.argv[1])
    async def main():
        for i in range(300):
            key = f"shared-{{i}}" if i % 2 else f"own-{{sys.argv[2]}}-{{i}}"
            await cache.put(key, w, Completion(f"text {{i}}", 1, 1, "stop"))
            assert (await cache.get(key)) is not None
    asyncio.run(main())
    cache.close()
""")


def _record() -> CallRecord:
    return CallRecord(call_id="0.0", parent_call_id=None, depth=0, step=0, worker_index=0, worker="gpt",
                      provider="openai", model="gpt-model", subtask="Solve.")


def _same_call_eight_times(emu: Emulator, tmp_path: Path, **limits: float) -> tuple[list, list[CallRecord], Executor]:
    w = worker(emu, "gpt", "openai", limits=limits)
    ex = Executor(cache=ResponseCache(tmp_path / "c.sqlite"))
    recs = [_record() for _ in range(8)]

    async def main():
        return await asyncio.gather(*(ex.call(w, [Message("user", "What is 6 * 7?")], r) for r in recs),
                                    return_exceptions=True)

    return asyncio.run(main()), recs, ex


def test_identical_calls_in_flight_together_are_made_once(emu: Emulator, tmp_path: Path) -> None:
    emu.configure(latency_s=0.3)                   # all eight are in flight before the first reply
    out, recs, ex = _same_call_eight_times(emu, tmp_path)
    assert sum(v for k, v in emu.stats().items() if ":" not in k) == 1
    assert len({c.text for c in out}) == 1 and all(r.response == out[0].text for r in recs)
    assert sum(not r.cache_hit for r in recs) == 1 and ex.stats["coalesced"] == 7 and ex.stats["calls"] == 1
    assert ex.cache is not None and ex.cache.count() == 1


def test_a_failed_call_does_not_fail_the_identical_ones_waiting_on_it(emu: Emulator, tmp_path: Path) -> None:
    emu.configure(latency_s=0.3, faults=[{"kind": "500", "count": 1}])
    out, recs, ex = _same_call_eight_times(emu, tmp_path, max_retries=0)
    failed = [r for r in recs if r.error_kind is not None]
    assert len(failed) == 1 and sum(isinstance(o, Exception) for o in out) == 1   # only the call that got the 500
    assert emu.stats()["openai"] == 2                                          # then one of the others, once
    assert len({r.response for r in recs if r.error_kind is None}) == 1 and ex.stats["coalesced"] == 6


def test_cancelling_the_call_others_wait_on_does_not_cancel_them(emu: Emulator, tmp_path: Path) -> None:
    emu.configure(latency_s=0.3)
    w = worker(emu, "gpt", "openai")
    ex = Executor(cache=ResponseCache(tmp_path / "c.sqlite"))

    async def main():
        calls = [asyncio.create_task(ex.call(w, [Message("user", "q")], _record())) for _ in range(3)]
        await asyncio.sleep(0.1)
        calls[0].cancel()                          # the one the other two are waiting on
        return await asyncio.gather(*calls, return_exceptions=True)

    first, *others = asyncio.run(main())
    assert isinstance(first, asyncio.CancelledError)
    assert all(isinstance(o, Completion) for o in others) and others[0].text == others[1].text
    assert ex.stats["calls"] == 1 and ex.stats["coalesced"] == 1


def test_several_processes_write_concurrently(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite"
    ResponseCache(path).close()
    code = _WRITER.format(root=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), str(n)], stderr=subprocess.PIPE) for n in range(3)]
    errs = [p.communicate(timeout=120)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errs
    cache = ResponseCache(path, mode="read_only")
    assert cache.count() == 150 + 3 * 150
    cache.close()


def test_bad_mode_and_unusable_file_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cache mode 'sometimes'"):
        ResponseCache(tmp_path / "x.sqlite", mode="sometimes")  # type: ignore[arg-type]
    (tmp_path / "not-a-db.sqlite").write_text("this is not a database" * 100)
    with pytest.raises(ValueError, match="not-a-db.sqlite: cannot open the response cache"):
        ResponseCache(tmp_path / "not-a-db.sqlite")


def test_a_cache_carried_to_another_machine_keeps_every_reply_and_the_first_writer(tmp_path: Path) -> None:
    """export (gzipped snapshot, taken while the cache is open) -> copy into another cache: every reply the
    other lacks is added, a key it already holds keeps its own reply, a second copy adds nothing."""
    w = Worker(name="a", provider="openai", model="m")
    src = ResponseCache(tmp_path / "run" / "cache.sqlite")
    for k in ("k1", "k2", "k3"):
        src.store(k, w.provider, w.model, Completion(f"paid {k}", 3, 4, "stop"))
    assert export_responses(src.path, tmp_path / "carry" / "cache.sqlite.gz") == 3
    src.close()
    dest = ResponseCache(tmp_path / "new" / "cache.sqlite")
    dest.store("k1", w.provider, w.model, Completion("already here", 1, 1, "stop"))
    dest.close()
    assert copy_responses(tmp_path / "carry" / "cache.sqlite.gz", tmp_path / "new" / "cache.sqlite") == 2
    assert copy_responses(tmp_path / "carry" / "cache.sqlite.gz", tmp_path / "new" / "cache.sqlite") == 0
    dest = ResponseCache(tmp_path / "new" / "cache.sqlite", mode="replay")
    assert [dest.lookup(k).text for k in ("k1", "k2", "k3")] == ["already here", "paid k2", "paid k3"]
    dest.close()
    assert copy_responses(src.path, tmp_path / "plain" / "cache.sqlite") == 3      # an uncompressed file too


def test_carrying_a_missing_or_foreign_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nope.sqlite.gz: no such response cache"):
        copy_responses(tmp_path / "nope.sqlite.gz", tmp_path / "c.sqlite")
    with pytest.raises(ValueError, match="nope.sqlite: no such response cache"):
        export_responses(tmp_path / "nope.sqlite", tmp_path / "out.sqlite.gz")
    assert not (tmp_path / "nope.sqlite").exists() and not (tmp_path / "out.sqlite.gz").exists()
    (tmp_path / "bad.sqlite.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="bad.sqlite.gz: not a gzipped response cache"):
        copy_responses(tmp_path / "bad.sqlite.gz", tmp_path / "c.sqlite")
    import sqlite3
    sqlite3.connect(tmp_path / "other.sqlite").execute("CREATE TABLE t (x)")
    with pytest.raises(ValueError, match="other.sqlite: not a response cache"):
        copy_responses(tmp_path / "other.sqlite", tmp_path / "c.sqlite")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), st.text()), max_size=4))
def test_messages_hash_is_the_sha256_of_compact_json(pairs) -> None:
    """The lake's ``messages_hash`` keeps its definition (compact JSON, non-ASCII as is) whatever encodes it."""
    import hashlib
    import json

    from conductor.execution.cache import messages_hash

    body = json.dumps([list(p) for p in pairs], ensure_ascii=False, separators=(",", ":"))
    try:
        expected = hashlib.sha256(body.encode()).hexdigest()
    except UnicodeEncodeError:       # a lone surrogate cannot be hashed either way
        with pytest.raises(UnicodeEncodeError):
            messages_hash([Message(r, c) for r, c in pairs])
        return
    assert messages_hash([Message(r, c) for r, c in pairs]) == expected
