"""Bulk answering end to end through real Prefect (ephemeral), the real lake and the simulated pool.

The conductor here is the fixed single-worker policy (no model needed) or a scripted policy that writes
malformed workflows; the real-model end-to-end runs are in test_answer_model.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from conductor.data.questions import Question
from conductor.generation import Generation
from conductor.lake.reader import scan
from conductor.run import pipeline
from conductor.run.shards import ShardLoop, run_shard
from conductor.workers.pool import load_pool

ROOT = Path(__file__).resolve().parent.parent
SIM_POOL = str(ROOT / "data/pools/simulated.yaml")


@pytest.fixture()
def questions_file(tmp_path):
    rows = [{"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(7)]
    f = tmp_path / "q.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return f


def test_answer_flow_writes_lake_answers_report_and_resumes(tmp_path, questions_file):
    from conductor.run.config import AnswerConfig
    from flows.answer import answer_flow

    out = tmp_path / "out"
    s1 = answer_flow(AnswerConfig(questions=str(questions_file), out=str(out), pool=SIM_POOL, conductor="fixed:0",
                                  shard_size=3, show_progress=False))
    assert s1.questions == 7 and s1.trajectories == 7 and s1.graded == 7
    assert s1.parse_failures == 0 and s1.infra_failures == 0
    assert s1.calls_per_question == 1.0 and s1.dollars_per_question > 0
    answers = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
    assert [a["question_id"] for a in answers] == sorted(f"q{i}" for i in range(7))  # the user's own ids
    assert all(a["extracted_answer"] is not None for a in answers)
    assert (out / "report" / "report.md").is_file() and (out / "summary.json").is_file()
    lake = str(out / "lake")
    shard_files = sorted((out / "lake" / "trajectories").rglob("*.parquet"))
    assert len(shard_files) == 3

    # a crash before the last shard was committed: its file is missing; the rerun redoes only that shard
    shard_files[-1].unlink()
    s2 = answer_flow(AnswerConfig(questions=str(questions_file), out=str(out), pool=SIM_POOL, conductor="fixed:0",
                                  shard_size=3, show_progress=False))
    df = scan(lake).collect()
    assert df.height == 7 and df["trajectory_id"].n_unique() == 7
    assert s2.accuracy == s1.accuracy
    # the cache made the redone shard free of provider calls
    calls = scan(lake, "calls").collect()
    assert calls.filter(pl.col("cache_hit")).height >= 1


class ScriptedConductor:
    """A conductor whose completions are given: the malformed outputs a real small model writes."""

    name = "scripted"

    def __init__(self, texts):
        self.texts = texts

    def generate(self, prompts, n, params):
        return [[Generation(text=self.texts[(i * n + j) % len(self.texts)]) for j in range(n)] for i in range(len(prompts))]

    def close(self):
        pass


def test_malformed_conductor_outputs_are_scored_and_recorded(tmp_path):
    from conductor.execution.executor import Executor
    from conductor.lake.writer import write_shard

    pool = load_pool(SIM_POOL)
    qs = [Question(id=f"m{i}", dataset="t", domain="math", prompt=f"What is {i}*3?", gold=str(3 * i)) for i in range(2)]
    texts = ["I think Model 0 should do it.",                                       # no lists: reward 0
             "model_id = [9]\nsubtasks = ['x']\naccess_list = [[]]",                # out of range: invalid, 0
             "model_id = [0]\nsubtasks = ['Solve it.']\naccess_list = [[]]"]        # fine
    spec = pipeline.RunSpec(run_id="malformed", kind="answer", pool=pool, samples=3)
    trajs = run_shard(qs, spec, ScriptedConductor(texts), Executor(), shard="s0")
    status = sorted(t.parse_status for t in trajs)
    assert status.count("parse_error") == 2 and status.count("invalid") == 2 and status.count("ok") == 2
    for t in trajs:
        if t.parse_status != "ok":
            assert t.reward == 0.0 and not t.calls and t.rounds[0].parse_error
        else:
            assert t.reward in (0.5, 1.0) and len(t.calls) == 1
    write_shard(str(tmp_path / "lake"), trajs, "s0")
    df = scan(str(tmp_path / "lake")).collect()
    assert df.height == 6 and set(df["parse_status"]) == {"ok", "parse_error", "invalid"}


def test_one_trajectory_that_raises_does_not_sink_the_shard():
    """pipeline.execute runs through recursion.execute_batch: a trajectory whose execution raises is recorded
    as infra-failed, the others run, and ``on_done`` hears of every one (batch mode counts on it)."""
    from conductor.execution.executor import Executor
    from conductor.workers.providers.simulated import know_questions

    pool = load_pool(SIM_POOL)
    qs = [Question(id=f"e{i}", dataset="t", domain="math", prompt=f"What is {i}+1?", gold=str(i + 1)) for i in range(3)]
    know_questions(pool, qs)                    # the stage alone: no shard loop to tell the simulated workers
    spec = pipeline.RunSpec(run_id="guard", kind="answer", pool=pool)
    trajs = pipeline.generate(pipeline.plan(qs, spec, "s0"), ScriptedConductor(
        ["model_id = [0]\nsubtasks = ['Solve it.']\naccess_list = [[]]"]), spec)
    trajs[1].rounds.clear()                     # bad input for one row: execute_trajectory raises on it
    done: list[str] = []
    out = pipeline.execute(trajs, spec, Executor(), on_done=lambda t: done.append(t.question_id))
    assert sorted(done) == ["e0", "e1", "e2"]
    assert out[1].infra_failed and out[1].infra_cause.startswith("executor: ValueError: trajectory")
    assert not out[0].infra_failed and not out[2].infra_failed and out[0].final_answer and out[2].calls


ONE_STEP = "model_id = [0]\nsubtasks = ['Solve it.']\naccess_list = [[]]"


def _questions(prefix: str, n: int) -> list[Question]:
    return [Question(id=f"{prefix}{i}", dataset="t", domain="math", prompt=f"What is {i}*3?", gold=str(3 * i))
            for i in range(n)]


def _run_shards(tmp_path, shards, policy, on_done=None) -> tuple[int, str]:
    """The shard loop with the Prefect task stages, inside a real Prefect flow, over the simulated pool:
    (rows written, lake)."""
    from prefect import flow

    from conductor.execution.executor import Executor
    from tasks.pipeline import TASK_STAGES

    spec = pipeline.RunSpec(run_id=tmp_path.name, kind="answer", pool=load_pool(SIM_POOL))
    lake = str(tmp_path / "lake")

    @flow(persist_result=False)
    def shard_loop() -> int:
        return ShardLoop(spec, policy, Executor(), lake=lake, stages=TASK_STAGES, on_done=on_done).run(shards)

    return shard_loop(), lake


def test_the_conductor_writes_the_next_shard_while_the_workers_execute_this_one(tmp_path):
    """Shard 1's execution waits (up to 10 s) until shard 2's generation has started: only an overlapped loop
    lets it through at once; run one stage after the other, every wait would time out."""
    import threading

    second_generation = threading.Event()
    threads: list[str] = []

    class Recording(ScriptedConductor):
        def generate(self, prompts, n, params):
            threads.append(threading.current_thread().name)
            if len(threads) == 2:
                second_generation.set()
            return super().generate(prompts, n, params)

    waited: list[bool] = []

    def on_done(t):
        if t.question_id in ("o0", "o1"):                     # shard 1
            waited.append(second_generation.wait(10))

    qs = _questions("o", 4)
    written, lake = _run_shards(tmp_path, [("s1", qs[:2]), ("s2", qs[2:])], Recording([ONE_STEP]), on_done)
    assert written == 4
    assert waited == [True, True]
    assert threads and all(name.startswith("one-ahead") for name in threads)   # generation left the flow's thread
    df = scan(lake).collect()
    assert sorted(df["question_id"]) == ["o0", "o1", "o2", "o3"] and set(df["parse_status"]) == {"ok"}


def test_a_one_prompt_conductor_is_fed_one_question_at_a_time_and_shards_commit_whole(tmp_path):
    batches: list[int] = []

    class OnePrompt(ScriptedConductor):
        generation_batch = 1

        def generate(self, prompts, n, params):
            batches.append(len(prompts))
            return super().generate(prompts, n, params)

    qs = _questions("p", 5)
    written, lake = _run_shards(tmp_path, [("s1", qs[:3]), ("s2", qs[3:])], OnePrompt([ONE_STEP]))
    assert written == 5
    assert batches == [1, 1, 1, 1, 1]
    files = sorted((tmp_path / "lake" / "trajectories").rglob("*.parquet"))
    assert len(files) == 2                                   # one file per shard, not per piece
    df = scan(lake).collect()
    assert sorted(df["question_id"]) == [f"p{i}" for i in range(5)] and df["correct"].null_count() == 0


def test_a_conductor_that_dies_mid_shard_keeps_the_answered_piece_and_records_the_rest(tmp_path):
    from conductor.policy.openai_backend import EndpointError

    class DiesAfterOne(ScriptedConductor):
        generation_batch = 1
        calls = 0

        def generate(self, prompts, n, params):
            self.calls += 1
            if self.calls > 1:
                raise EndpointError("down", "conductor endpoint http://127.0.0.1:9/v1: connection refused")
            return super().generate(prompts, n, params)

    qs = _questions("d", 6)
    written, lake = _run_shards(tmp_path, [("s1", qs[:3]), ("s2", qs[3:5]), ("s3", qs[5:])], DiesAfterOne([ONE_STEP]))
    assert written == 5                     # s1 (one answered, two failed) and s2 (failed); then it stops
    df = scan(lake).collect().sort("question_id")
    assert df["question_id"].to_list() == ["d0", "d1", "d2", "d3", "d4"]
    assert df["infra_failed"].to_list() == [False, True, True, True, True]
    assert df["correct"].to_list()[0] is not None and df["reward"].to_list()[1:] == [None] * 4
    assert all(c.startswith("conductor: ") for c in df["infra_cause"].to_list()[1:])
    assert len(sorted((tmp_path / "lake" / "trajectories").rglob("*.parquet"))) == 2
