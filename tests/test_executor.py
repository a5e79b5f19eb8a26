"""The executor end to end: real SDKs -> emulator, failures, budgets, redaction, graph = sequential."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from conductor.execution.cache import ResponseCache
from conductor.execution.executor import Budget, Executor
from conductor.execution.recursion import execute_batch, run_batch
from conductor.execution.retry import RetryPolicy
from conductor.testing.emulator import Emulator
from conductor.workers.pool import Pool
from tests.fixtures_emulator import FAKE_KEYS, emu, emulator, lists, make_traj, three_provider_pool, worker  # noqa: F401

FAST = RetryPolicy(base_s=0.005, max_wait_s=0.2)
BEST_OF_TWO = lists([0, 1, 2], ["Solve it.", "Solve it independently.", "Compare both and answer."], [[], [], ["all"]])


def test_three_provider_workflow_records_every_call(emu: Emulator) -> None:
    pool = three_provider_pool(emu, price={"input_per_mtok": 1.0, "output_per_mtok": 4.0})
    [t] = run_batch([make_traj(BEST_OF_TWO)], pool.full(), Executor(retry=FAST))
    assert not t.infra_failed and t.rounds[0].parse_status == "ok"
    assert [c.call_id for c in t.calls] == ["0.0", "0.1", "0.2"]
    assert [c.provider for c in t.calls] == ["openai", "anthropic", "google"]
    assert t.final_answer == t.calls[-1].response and t.rounds[0].final_answer == t.final_answer
    assert t.calls[2].access == [0, 1] and t.calls[2].access_all and t.calls[0].access == []
    for c in t.calls:
        assert c.input_tokens > 0 and c.output_tokens > 0 and len(c.messages_hash) == 64
        assert c.cost_usd == pytest.approx((c.input_tokens * 1.0 + c.output_tokens * 4.0) / 1e6)
        assert c.parent_call_id is None and c.depth == 0 and c.error is None
    # the aggregator saw both earlier responses; the independent steps saw none
    last = emu.requests()[-1]["body"]
    text = "".join(p["text"] for c in last["contents"] for p in c["parts"])
    assert t.calls[0].response in text and t.calls[1].response in text


def test_graph_parallel_equals_sequential(emu: Emulator) -> None:
    emu.configure(latency_s=0.05)
    pool = three_provider_pool(emu)
    completions = [BEST_OF_TWO,
                   lists([2, 0, 1, 2], ["a", "b", "c", "d"], [[], ["all"], [], [0, 2]]),
                   lists([1, 1], ["x", "y"], [[], []])]

    def go(sequential: bool) -> list:
        trajs = [make_traj(c, qid=f"q{i}") for i, c in enumerate(completions)]
        emu.reset()
        out = run_batch(trajs, pool.full(), Executor(retry=FAST), sequential=sequential)
        return out, emu.max_in_flight()

    par, par_peak = go(False)
    seq, seq_peak = go(True)
    for a, b in zip(par, seq):
        assert a.final_answer == b.final_answer
        assert [c.messages_hash for c in a.calls] == [c.messages_hash for c in b.calls]
        assert [c.response for c in a.calls] == [c.response for c in b.calls]
    assert par_peak > seq_peak   # independent steps did overlap


def test_storm_of_429_and_5xx_under_concurrency(emu: Emulator) -> None:
    emu.configure(latency_s=0.01, retry_after_s=0.02,
                  faults=[{"kind": "429", "p": 0.3}, {"kind": "500", "p": 0.15}, {"kind": "503", "p": 0.1}])
    pool = three_provider_pool(emu, limits={"max_concurrency": 4, "max_retries": 30})
    trajs = [make_traj(BEST_OF_TWO, question=f"question {i}", qid=f"q{i}") for i in range(30)]
    ex = Executor(retry=FAST)
    out = run_batch(trajs, pool.full(), ex)
    assert all(not t.infra_failed for t in out), [t.infra_cause for t in out if t.infra_failed]
    assert all(c.error is None and c.response.startswith("reply from") for t in out for c in t.calls)
    stats = emu.stats()
    faults = sum(v for k, v in stats.items() if k.endswith((":429", ":500", ":503")))
    assert faults > 20 and ex.stats["retries"] == faults
    assert sum(c.retries for t in out for c in t.calls) == faults
    assert emu.max_in_flight() <= 3 * 4          # one cap of 4 per limit key (three models)


def test_failures_mark_the_workflow_and_spare_the_batch(emu: Emulator) -> None:
    base = three_provider_pool(emu, limits={"max_retries": 1})
    hanger = worker(emu, "hanger", "openai", limits={"timeout_s": 0.5, "max_retries": 1})
    pool = Pool(pool_id="emu", workers=(*base.workers, hanger))
    bad = {   # question id -> (workflow, the kind the failure must be classified as)
        "malformed": (lists([0, 1], ["s [[fault:malformed]]", "t"], [[], ["all"]]), "malformed"),
        "badschema": (lists([1], ["s [[fault:badschema]]"], [[]]), "malformed"),
        "timeout": (lists([2, 3], ["s", "t [[fault:hang]]"], [[], []]), "timeout"),
        "auth": (lists([0], ["s [[fault:401]]"], [[]]), "auth"),
        "permanent": (lists([1], ["s [[fault:400]]"], [[]]), "permanent"),
    }
    trajs = [make_traj(c, qid=k) for k, (c, _) in bad.items()] + [make_traj(BEST_OF_TWO, qid=f"ok{i}") for i in range(4)]
    out = run_batch(trajs, pool.full(), Executor(retry=FAST))
    for t in out[:len(bad)]:
        kind = bad[t.question_id][1]
        assert t.infra_failed and t.infra_cause.startswith(kind + ":"), (t.question_id, t.infra_cause)
        assert t.final_answer is None and t.reward is None
        assert any(c.error_kind == kind for c in t.calls)
    assert [c.retries for c in out[0].calls if c.error] == [1]      # retryable: retried, then given up
    assert [c.retries for c in out[3].calls if c.error] == [0]      # auth: not retried
    for t in out[len(bad):]:
        assert not t.infra_failed and t.final_answer


def test_empty_and_truncated_replies_are_the_workflows_outcome(emu: Emulator) -> None:
    pool = three_provider_pool(emu, sampling={"max_tokens": 3})
    [t] = run_batch([make_traj(lists([0, 1], ["s [[fault:empty]]", "t"], [[], ["all"]]))], pool.full(), Executor())
    assert not t.infra_failed
    assert t.calls[0].response == "" and t.calls[1].finish_reason == "length"
    assert t.final_answer == t.calls[1].response and len(t.final_answer) == 12


def test_unknown_worker_and_parse_errors_are_not_executed(emu: Emulator) -> None:
    pool = three_provider_pool(emu)
    trajs = [make_traj(lists([0, 7], ["a", "b"], [[], []]), qid="unknown"),
             make_traj("I will just answer 42.", qid="noparse"),
             make_traj(BEST_OF_TWO, qid="fine")]
    out = run_batch(trajs, pool.full(), Executor())
    assert out[0].rounds[0].parse_status == "invalid" and "outside the pool" in out[0].rounds[0].parse_error
    assert out[1].rounds[0].parse_status == "parse_error"
    assert out[0].calls == [] and out[1].calls == [] and not out[0].infra_failed
    assert out[2].final_answer and len(out[2].calls) == 3
    assert emu.stats().get("openai", 0) == 1


def test_missing_key_fails_the_workflow_with_the_variable_name(emu: Emulator) -> None:
    os.environ.pop("EMU_NOT_SET", None)
    pool = Pool(pool_id="p", workers=(worker(emu, "a", "openai", api_key_env="EMU_NOT_SET"), worker(emu, "b", "google")))
    out = run_batch([make_traj(lists([0], ["s"], [[]]), qid="nokey"), make_traj(lists([1], ["s"], [[]]), qid="ok")],
                    pool.full(), Executor())
    assert out[0].infra_failed and out[0].infra_cause.startswith("missing_key:") and "EMU_NOT_SET" in out[0].infra_cause
    assert not out[1].infra_failed


def test_budgets_per_question(emu: Emulator) -> None:
    pool = three_provider_pool(emu, price={"input_per_mtok": 1000.0, "output_per_mtok": 1000.0})
    chain = lists([0, 1, 2], ["a", "b", "c"], [[], ["all"], ["all"]])
    ex = Executor(budget=Budget(max_calls=2))
    [t] = run_batch([make_traj(chain)], pool.full(), ex)
    assert t.infra_failed and t.infra_cause.startswith("budget:") and len([c for c in t.calls if not c.error]) == 2
    # the dollar budget (max_cost) is the workflow's own limit: the first call spends it, the rest are not run
    # (each says why), and the answer is the output of the last step that ran; no infrastructure failure
    [t] = run_batch([make_traj(chain)], pool.full(), Executor(budget=Budget(max_dollars=0.05)))
    assert not t.infra_failed and t.infra_cause is None
    ran = [c for c in t.calls if not c.error]
    assert len(ran) == 1 and ran[0].cost_usd >= 0.05 and t.final_answer == ran[0].response
    assert [(c.step, c.error_kind) for c in t.calls if c.error] == [(1, "budget"), (2, "budget")]
    assert "$0.05" in t.calls[1].error and "sees" in t.calls[2].error
    # independent steps: the cap is checked before each call starts; a step that saw nothing still answers
    fan = lists([0, 1, 2], ["a", "b", "c"], [[], [], []])
    [t] = run_batch([make_traj(fan)], pool.full(), Executor(budget=Budget(max_dollars=1e-12)))
    assert not t.infra_failed and t.final_answer is not None
    emu.configure(latency_s=0.3)
    [t] = run_batch([make_traj(chain)], pool.full(), Executor(budget=Budget(max_seconds=0.5)))
    assert t.infra_failed and t.infra_cause.split(":")[0] in ("budget", "timeout")


def test_secrets_never_reach_records_errors_logs_or_cache(emu: Emulator, tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="conductor.execution.executor")
    emu.configure(api_key="a-different-key")      # every call 401s, and the body echoes the key we sent
    pool = three_provider_pool(emu)
    cache = ResponseCache(tmp_path / "cache.sqlite")
    trajs = [make_traj(lists([i], ["s"], [[]]), qid=f"q{i}") for i in range(3)]
    out = run_batch(trajs, pool.full(), Executor(cache=cache))
    emu.configure(api_key=None, scripted=[{"match": "leak", "reply": f"here: {FAKE_KEYS['EMU_OPENAI_KEY']}"}])
    out += run_batch([make_traj(lists([0], ["leak"], [[]]), qid="leak")], pool.full(), Executor(cache=cache))
    cache.close()
    blob = repr([t.to_dict() for t in out]) + (tmp_path / "cache.sqlite").read_bytes().decode("latin-1")
    blob += caplog.text
    assert "auth" in caplog.text
    for wal in tmp_path.glob("cache.sqlite-*"):
        blob += wal.read_bytes().decode("latin-1")
    assert sum(t.infra_failed for t in out) == 3 and all("auth:" in t.infra_cause for t in out[:3])
    for key in FAKE_KEYS.values():
        assert key not in blob
    assert "[REDACTED]" in out[0].infra_cause


def test_batch_in_a_running_loop_shares_the_executor(emu: Emulator) -> None:
    pool = three_provider_pool(emu)
    ex = Executor()

    async def main():
        a = await execute_batch([make_traj(BEST_OF_TWO, qid="a")], pool.full(), ex)
        b = await execute_batch([make_traj(BEST_OF_TWO, qid="b", question="other")], [pool.full()], ex)
        await ex.aclose()
        return a + b

    out = asyncio.run(main())
    assert all(not t.infra_failed for t in out) and out[0].final_answer != out[1].final_answer
    # a second event loop (a new asyncio.run) rebuilds clients instead of failing
    [t] = run_batch([make_traj(BEST_OF_TWO, qid="c")], pool.full(), ex)
    assert not t.infra_failed


def test_impossible_limits_fail_only_that_workers_workflows(emu: Emulator) -> None:
    tiny = worker(emu, "tiny", "openai", limits={"tokens_per_minute": 1000})    # max_tokens 4096 never fits
    pool = Pool(pool_id="p", workers=(tiny, worker(emu, "fine", "anthropic")))
    out = run_batch([make_traj(lists([0], ["s"], [[]]), qid="tiny"), make_traj(lists([1], ["s"], [[]]), qid="fine")],
                    pool.full(), Executor())
    assert out[0].infra_failed and out[0].infra_cause.startswith("permanent:")
    assert "tokens_per_minute is 1000" in out[0].infra_cause and not out[1].infra_failed
    assert emu.stats().get("openai", 0) == 0


def test_a_local_worker_that_times_out_is_not_retried_into_its_busy_slot(emu: Emulator) -> None:
    # a one-slot llama.cpp server keeps generating an abandoned reply: a retry would queue behind it and time out
    emu.configure(latency_s=1.0)
    local = worker(emu, "llama", "local", limits={"timeout_s": 0.3, "max_retries": 4})
    remote = worker(emu, "gpt", "openai", limits={"timeout_s": 0.3, "max_retries": 2})
    for w, attempts in ((local, 1), (remote, 3)):
        emu.reset()
        pool = Pool(pool_id="emu", workers=(w,))
        [t] = run_batch([make_traj(lists([0], ["Solve it."], [[]]))], pool.full(), Executor(retry=FAST))
        assert t.infra_failed and t.calls[0].error_kind == "timeout", t.calls[0].error
        assert len(emu.requests()) == attempts and t.calls[0].retries == attempts - 1
        assert ("not retried" in (t.calls[0].error or "")) == (w is local)
