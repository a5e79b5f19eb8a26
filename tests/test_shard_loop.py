"""The one shard loop (conductor/run/shards.py) with its plain stages, no Prefect: commits, the handling of a
failing conductor, rows kept in memory, simulated workers told their gold by the loop (not by the execute
stage); the fan-out task running the same loop; and the library code the benches use (greedy executor,
one-step prefill)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from conductor.data.questions import Question
from conductor.execution.executor import Executor
from conductor.generation import Generation
from conductor.lake.reader import scan
from conductor.policy.cached import ReplayMiss
from conductor.policy.openai_backend import EndpointError
from conductor.policy.spec import FixedSpec
from conductor.run import pipeline
from conductor.run.shards import MAX_CONDUCTOR_FAILURES, ShardLoop, run_shard
from conductor.workers.pool import load_pool
from conductor.workers.providers.simulated import clear_gold

ROOT = Path(__file__).resolve().parent.parent
SIM_POOL = str(ROOT / "data/pools/simulated.yaml")
ONE_STEP = "model_id = [0]\nsubtasks = ['Solve it.']\naccess_list = [[]]"


class Scripted:
    """A conductor writing ``ONE_STEP`` for every prompt; after ``ok_calls`` generations it raises ``error``."""

    name = "scripted"

    def __init__(self, ok_calls: int = 10**6, error: EndpointError | None = None, generation_batch: int | None = None):
        self.ok_calls, self.error, self.calls = ok_calls, error, 0
        if generation_batch is not None:
            self.generation_batch = generation_batch

    def generate(self, prompts, n, params):
        self.calls += 1
        if self.calls > self.ok_calls and self.error is not None:
            raise self.error
        return [[Generation(text=ONE_STEP) for _ in range(n)] for _ in prompts]


def _questions(prefix: str, n: int) -> list[Question]:
    return [Question(id=f"{prefix}{i}", dataset="t", domain="math", prompt=f"What is {i} * 7 ({prefix})?",
                     gold=str(7 * i)) for i in range(n)]


def _spec(name: str, kind: str = "answer") -> pipeline.RunSpec:
    return pipeline.RunSpec(run_id=name, kind=kind, pool=load_pool(SIM_POOL))


def test_the_plain_loop_commits_every_shard_and_tells_the_simulated_workers_their_gold(tmp_path):
    clear_gold()                                  # nothing registered before: the loop must do it
    qs = _questions("a", 5)
    seen: list[tuple[str, int]] = []
    loop = ShardLoop(_spec("plain"), Scripted(), Executor(), lake=str(tmp_path / "lake"),
                     on_commit=lambda sid, rows: seen.append((sid, len(rows))))
    assert loop.run([("s1", qs[:3]), ("s2", qs[3:])]) == 5
    assert seen == [("s1", 3), ("s2", 2)]
    df = scan(str(tmp_path / "lake")).collect().sort("question_id")
    assert df["question_id"].to_list() == [q.id for q in qs] and df["shard"].to_list() == ["s1"] * 3 + ["s2"] * 2
    assert not any(df["infra_failed"]) and df["correct"].null_count() == 0


def test_the_execute_stage_alone_knows_nothing_of_simulated_gold():
    """The gold is told where the pool meets the run's questions (the loop), not inside ``execute``."""
    clear_gold()
    qs, spec = _questions("g", 1), _spec("stage-alone")
    trajs = pipeline.generate(pipeline.plan(qs, spec, "s0"), Scripted(), spec)
    [t] = pipeline.execute(trajs, spec, Executor())
    assert t.infra_failed and "no gold answer registered" in (t.infra_cause or "")


def test_run_shard_keeps_the_rows_in_memory(tmp_path):
    rows = run_shard(_questions("m", 2), _spec("memory"), Scripted(), Executor(), shard="s0")
    assert [t.question_id for t in rows] == ["m0", "m1"] and all(t.shard == "s0" for t in rows)
    assert all(t.correct is not None and not t.infra_failed for t in rows)


def test_a_failing_conductor_is_recorded_then_the_loop_stops_with_plain_stages(tmp_path):
    down = EndpointError("down", "conductor endpoint http://127.0.0.1:9/v1: connection refused")
    qs = _questions("d", 8)
    shards = [("s1", qs[:2]), ("s2", qs[2:4]), ("s3", qs[4:6]), ("s4", qs[6:])]
    done: list[str] = []
    loop = ShardLoop(_spec("down"), Scripted(ok_calls=1, error=down), Executor(), lake=str(tmp_path / "lake"),
                     on_done=lambda t: done.append(t.question_id))
    assert loop.run(shards) == 2 + 2 * MAX_CONDUCTOR_FAILURES   # s1 answered, s2 and s3 failed, s4 left for a rerun
    df = scan(str(tmp_path / "lake")).collect().sort("question_id")
    assert df["question_id"].to_list() == [q.id for q in qs[:6]]
    assert df["infra_failed"].to_list() == [False, False] + [True] * 4
    assert all(c.startswith("conductor: ") for c in df["infra_cause"].to_list()[2:])
    assert sorted(done) == [q.id for q in qs[:6]]                 # the failed ones are reported done too


def test_replay_misses_fail_their_shards_and_the_loop_goes_on(tmp_path):
    """A partial recording misses some questions' conductor generations: those shards are infra-failed (a rerun
    retries them) and every later shard is still tried; a dead endpoint would stop the run after two."""
    miss = ReplayMiss("rec.sqlite: 1 conductor generation(s) not recorded, and the cache is in replay mode")
    qs = _questions("p", 8)
    shards = [("s1", qs[:2]), ("s2", qs[2:4]), ("s3", qs[4:6]), ("s4", qs[6:])]
    loop = ShardLoop(_spec("partial"), Scripted(ok_calls=1, error=miss), Executor(), lake=str(tmp_path / "lake"))
    assert loop.run(shards) == 8
    df = scan(str(tmp_path / "lake")).collect().sort("question_id")
    assert df["infra_failed"].to_list() == [False, False] + [True] * 6
    assert all("not recorded" in c for c in df["infra_cause"].to_list()[2:])


def test_a_refused_key_stops_the_loop_at_once(tmp_path):
    refused = EndpointError("auth", "conductor endpoint: 401 invalid key")
    qs = _questions("k", 4)
    loop = ShardLoop(_spec("auth"), Scripted(ok_calls=0, error=refused), Executor(), lake=str(tmp_path / "lake"))
    assert loop.run([("s1", qs[:2]), ("s2", qs[2:])]) == 2
    assert scan(str(tmp_path / "lake")).collect()["infra_failed"].to_list() == [True, True]


def test_a_run_resumed_by_shard_raises_instead_of_committing_failed_rows(tmp_path):
    down = EndpointError("down", "conductor endpoint: connection refused")
    qs = _questions("r", 4)
    loop = ShardLoop(_spec("rollout", "rollout"), Scripted(ok_calls=1, error=down), Executor(),
                     lake=str(tmp_path / "lake"), record_failures=False)
    with pytest.raises(EndpointError):
        loop.run([("s1", qs[:2]), ("s2", qs[2:])])
    df = scan(str(tmp_path / "lake")).collect()
    assert sorted(df["question_id"]) == ["r0", "r1"] and not any(df["infra_failed"])   # s1 only; s2 left to redo


def test_the_fan_out_task_runs_the_same_loop_and_skips_a_committed_shard(tmp_path):
    from prefect import flow

    from tasks.shard import run_shard_task

    clear_gold()
    qs, lake = _questions("f", 3), str(tmp_path / "lake")
    spec = _spec("fan", "rollout")

    @flow(persist_result=False)
    def twice() -> tuple[int, int]:
        return (run_shard_task(qs, spec, "s0", lake, FixedSpec(worker=0)), run_shard_task(qs, spec, "s0", lake, FixedSpec(worker=0)))

    assert twice() == (3, 0)
    df = scan(lake, kind="rollout", run_id="fan").collect()
    assert df.height == 3 and not any(df["infra_failed"]) and df["correct"].null_count() == 0


# ------------------------------------------------------------------ library code the benches use


def test_a_greedy_call_is_one_reply_for_every_sample(tmp_path):
    """``ReuseExecutor``: at temperature 0 the sample index leaves the call's key, so a GRPO group pays once;
    a sampled worker still gets one reply per sample."""
    from conductor.execution.cache import ResponseCache
    from conductor.execution.greedy import ReuseExecutor, greedy_pool
    from conductor.trajectory import CallRecord
    from conductor.workers.providers.base import Message
    from conductor.workers.providers.simulated import register_gold

    register_gold("What is 6*7?", "42", "math")
    sampled = load_pool(SIM_POOL)
    greedy = greedy_pool(sampled)
    assert greedy.pool_id.endswith("-t0") and all(w.sampling.temperature == 0 for w in greedy.workers)

    def calls(worker) -> dict[str, int]:
        ex = ReuseExecutor(cache=ResponseCache(tmp_path / f"{worker.sampling.temperature}.sqlite"))

        async def main():
            for i in range(4):
                rec = CallRecord(call_id="0.0", parent_call_id=None, depth=0, step=0, worker_index=0,
                                 worker=worker.name, provider=worker.provider, model=worker.model, subtask="s")
                await ex.call(worker, [Message("user", "What is 6*7?")], rec, sample_index=i)
            await ex.aclose()

        asyncio.run(main())
        return ex.stats

    assert sampled.workers[0].sampling.temperature > 0
    assert calls(sampled.workers[0])["calls"] == 4
    stats = calls(greedy.workers[0])
    assert stats["calls"] == 1 and stats["cache_hits"] == 3


def test_the_one_step_prefill_writes_only_a_worker_index_and_keeps_the_prefix_in_the_tokens(tmp_path):
    pytest.importorskip("transformers")
    from conductor.generation import GenerationParams
    from conductor.parser import parse_workflow
    from conductor.policy.prefill import ONE_STEP_PREFILL, IndexConstraint, PrefilledBackend
    from conductor.policy.transformers_backend import TransformersBackend
    from conductor.workflow import Workflow
    from grpo_fixtures import tiny_checkpoint

    inner = TransformersBackend.load(tiny_checkpoint(tmp_path / "tiny"), device="cpu", batch_size=4)
    tok = inner.tokenizer
    backend = PrefilledBackend(inner, ONE_STEP_PREFILL, IndexConstraint(tok, 3, tok.eos_token_id))
    out = backend.generate(["Route: what is 2+2?", "Route: name a prime."], 3,
                           GenerationParams(temperature=1.0, max_tokens=5, seed=0))
    prefix_ids = tok(ONE_STEP_PREFILL, add_special_tokens=False)["input_ids"]
    assert [len(g) for g in out] == [3, 3]
    for g in (g for gens in out for g in gens):
        assert g.text.startswith(ONE_STEP_PREFILL) and g.logprobs is None
        assert g.token_ids[:len(prefix_ids)] == prefix_ids
        wf = parse_workflow(g.text, n_workers=3)
        assert isinstance(wf, Workflow) and len(wf) == 1 and wf.steps[0].worker in (0, 1, 2), g.text


def test_pieces_execute_two_at_a_time_on_one_shared_loop_and_shards_commit_in_order(tmp_path):
    """A one-question-at-a-time conductor: question k+1's workflow starts executing while question k's still
    runs (so one worker's server is not idle while another reads), both on the run's one shared event loop
    (one executor, one set of limits), and the shards still commit whole and in order."""
    import threading
    from dataclasses import replace

    from conductor.execution.loop import current_loop
    from conductor.run.shards import PLAIN

    second_started, overlapped, loops = threading.Event(), [], []

    def execute(trajs, spec, executor, policy, on_done):
        loops.append(current_loop())
        if trajs[0].question_id == "p0":           # hold the first question until the second is executing
            overlapped.append(second_started.wait(20))
        elif trajs[0].question_id == "p1":
            second_started.set()
        return pipeline.execute(trajs, spec, executor, policy, on_done)

    qs, commits = _questions("p", 4), []
    loop = ShardLoop(_spec("pipelined"), Scripted(generation_batch=1), Executor(), lake=str(tmp_path / "lake"),
                     stages=replace(PLAIN, execute=execute), on_commit=lambda sid, rows: commits.append(sid))
    assert loop.run([("s1", qs[:2]), ("s2", qs[2:])]) == 4
    assert overlapped == [True]
    assert len(loops) == 4 and loops[0] is not None and all(x is loops[0] for x in loops)
    assert commits == ["s1", "s2"] and current_loop() is None
    assert not any(scan(str(tmp_path / "lake")).collect()["infra_failed"])


def test_ctrl_c_stops_a_pipelined_run_at_once_and_sigterm_too(tmp_path):
    """Two questions execute at once on the run's shared loop; an interrupt must cancel them, not wait for their
    worker calls (here 300 s each) to finish, and say so in one line."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml

    manifest = yaml.safe_load(Path(SIM_POOL).read_text())
    manifest["pool_id"] = "simulated-slow"
    for w in manifest["workers"]:
        w["faults"] = {"latency_s": 300}
        w["limits"]["timeout_s"] = 600
    pool = tmp_path / "slow.yaml"
    pool.write_text(yaml.safe_dump(manifest))
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "CONDUCTOR_HOME": str(tmp_path / "home")}
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        out = tmp_path / f"out-{code}"
        p = subprocess.Popen([sys.executable, "-m", "conductor.cli", "answer", "gsm8k_test:4", "--pool", str(pool),
                              "--conductor", "fixed:0", "--shard-size", "1", "--out", str(out)],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # the executor opens the cache when the workflows start; Prefect's temporary server can take over
            # 100 s to come up on a loaded 2-core machine, so wait for the run itself, not a fixed time
            deadline = time.monotonic() + 400
            while not (out / "cache.sqlite").exists() and time.monotonic() < deadline and p.poll() is None:
                time.sleep(0.5)
            assert (out / "cache.sqlite").exists(), "the run never started its workflows"
            time.sleep(5)                          # the first workflows are now waiting on their worker calls
            assert p.poll() is None
            t0 = time.monotonic()
            p.send_signal(sig)
            _, err = p.communicate(timeout=200)
        finally:
            p.kill()
        # cancelled, not waited for: the calls in flight take 300 s; the bound leaves room for a loaded machine
        # (33 s seen with both cores busy at a higher priority: Prefect records each cancelled task's state)
        assert p.returncode == code and time.monotonic() - t0 < 120, err[-2000:]
        assert "Traceback" not in err and [ln for ln in err.splitlines() if ln.startswith("error:")]
        if sig == signal.SIGINT:   # after Ctrl-C the command's line says it; Prefect's crash report stays off the console
            assert "Crash detected" not in err and "| ERROR" not in err, err[-2000:]
