"""Baselines as strategies: each runs through the real answer flow (Prefect, executor, cache, grader, lake) on the
simulated pool, and self-consistency once over the real SmolLM2 served by llama.cpp."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conductor.generation import GenerationParams
from conductor.lake.reader import scan
from conductor.parser import parse_workflow
from conductor.policy.spec import parse_conductor_spec
from conductor.policy.strategies import (
    VOTE_WORKER,
    RandomWorkflowPolicy,
    StrategyError,
    check_strategy,
    make_strategy,
    strategy_pool,
)
from conductor.workers.pool import load_pool
from conductor.workers.providers.vote import answer_key, majority

ROOT = Path(__file__).resolve().parent.parent
SIM_POOL = str(ROOT / "data/pools/simulated.yaml")
SIM = load_pool(SIM_POOL)


@pytest.fixture()
def questions_file(tmp_path):
    rows = [{"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(6)]
    f = tmp_path / "q.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


def answer(questions, out, spec, max_steps=5, pool=SIM_POOL, cache=None):
    from conductor.run.config import AnswerConfig
    from flows.answer import answer_flow

    return answer_flow(AnswerConfig(questions=str(questions), out=str(out), pool=pool, conductor=spec, max_steps=max_steps,
                                    shard_size=3, show_progress=False, cache=cache))


def lake_rows(summary):
    traj = scan(summary.lake, run_id=summary.run_id).collect().sort("question_id")
    calls = scan(summary.lake, "calls", run_id=summary.run_id).collect().sort(["question_id", "step"])
    return traj, calls


# ---------------------------------------------------------------- each strategy through the answer flow

def test_self_consistency_samples_are_distinct_calls_and_the_vote_picks_the_majority(tmp_path, questions_file):
    s = answer(questions_file, tmp_path / "sc", "sc:0:5", max_steps=6)
    assert s.parse_failures == 0 and s.infra_failures == 0 and s.calls_per_question == 6
    traj, calls = lake_rows(s)
    assert traj["subpool"][0].to_list()[-1] == VOTE_WORKER and set(traj["checkpoint_id"]) == {"sc:0:5"}
    for qid, group in calls.group_by("question_id"):
        samples = group.filter(pl.col("provider") != "vote")
        vote = group.filter(pl.col("provider") == "vote").row(0, named=True)
        assert samples.height == 5 and samples["messages_hash"].n_unique() == 5   # never collapsed into one call
        assert set(samples["worker"]) == {"sim-mathwiz"} and vote["cost_usd"] == 0 and vote["step"] == 5
        expected, _ = majority(samples.sort("step")["response"].to_list())
        assert vote["response"] == expected
        final = traj.filter(pl.col("question_id") == qid[0])["final_answer"].item()
        assert final == expected

    # rerun from scratch with the same cache: the same five samples come back, every call a cache hit
    s2 = answer(questions_file, tmp_path / "sc2", "sc:0:5", max_steps=6, cache=str(tmp_path / "sc" / "cache.sqlite"))
    traj2, calls2 = lake_rows(s2)
    assert traj2["final_answer"].to_list() == traj["final_answer"].to_list() and calls2["cache_hit"].all()


def test_the_first_self_consistency_sample_is_the_single_worker_call(tmp_path, questions_file):
    cache = str(tmp_path / "shared.sqlite")
    fixed = answer(questions_file, tmp_path / "f", "fixed:1", cache=cache)
    sc = answer(questions_file, tmp_path / "s", "sc:1:3", max_steps=4, cache=cache)
    _, fcalls = lake_rows(fixed)
    _, scalls = lake_rows(sc)
    first = scalls.filter(pl.col("step") == 0)
    assert first["cache_hit"].all() and first["response"].to_list() == fcalls["response"].to_list()
    assert not scalls.filter(pl.col("step").is_in([1, 2]))["cache_hit"].any()


def test_mixture_of_agents_proposers_then_aggregator_over_all(tmp_path, questions_file):
    s = answer(questions_file, tmp_path / "moa", "moa:0+1+3:2")
    assert s.parse_failures == 0 and s.calls_per_question == 4
    traj, calls = lake_rows(s)
    steps = traj["steps"][0].to_list()
    assert [st["worker"] for st in steps] == [0, 1, 3, 2]
    assert [st["access_all"] for st in steps] == [False, False, False, True]
    agg = calls.filter(pl.col("step") == 3)
    assert set(agg["worker"]) == {"sim-generalist"} and agg["access_all"].all()
    assert all(a == [0, 1, 2] for a in agg["access"].to_list())         # "all": it saw every proposal


def test_vote_over_different_workers_takes_their_majority(tmp_path, questions_file):
    s = answer(questions_file, tmp_path / "vote", "vote:0+1+3")
    assert s.parse_failures == 0 and s.infra_failures == 0 and s.calls_per_question == 4
    traj, calls = lake_rows(s)
    assert [st["worker"] for st in traj["steps"][0].to_list()][:3] == [0, 1, 3]
    for qid, group in calls.group_by("question_id"):
        answers = group.filter(pl.col("provider") != "vote").sort("step")
        vote = group.filter(pl.col("provider") == "vote").row(0, named=True)
        assert answers["worker"].to_list() == [SIM.workers[i].name for i in (0, 1, 3)] and vote["step"] == 3
        assert vote["response"] == majority(answers["response"].to_list())[0]
        assert traj.filter(pl.col("question_id") == qid[0])["final_answer"].item() == vote["response"]


def test_random_workflows_run_and_are_reproducible(tmp_path, questions_file):
    s = answer(questions_file, tmp_path / "r1", "random:3")
    again = answer(questions_file, tmp_path / "r2", "random:3")
    other = answer(questions_file, tmp_path / "r3", "random:4")
    t1, t2, t3 = (lake_rows(x)[0] for x in (s, again, other))
    assert s.parse_failures == 0 and s.infra_failures == 0
    assert t1["completion"].to_list() == t2["completion"].to_list()
    assert t1["completion"].to_list() != t3["completion"].to_list()
    assert t1["n_steps"].n_unique() > 1 or t3["n_steps"].n_unique() > 1


def test_random_policy_is_uniform_over_lengths_workers_and_access():
    pol = RandomWorkflowPolicy(n_workers=4, max_steps=5, seed=0)
    gens = pol.generate([f"prompt {i}" for i in range(400)], 1, GenerationParams())
    wfs = [parse_workflow(g[0].text, n_workers=4, max_steps=5) for g in gens]
    lengths = Counter(len(w) for w in wfs)
    workers = Counter(s.worker for w in wfs for s in w.steps)
    assert set(lengths) == {1, 2, 3, 4, 5} and min(lengths.values()) > 40           # ~80 each
    assert set(workers) == {0, 1, 2, 3} and min(workers.values()) > 0.18 * sum(workers.values())
    second = [len(w.steps[1].access) for w in wfs if len(w) >= 2]
    assert 0.35 < sum(second) / len(second) < 0.65                                   # step 0 seen half the time


# ---------------------------------------------------------------- the vote

def test_vote_groups_equal_answers_and_breaks_ties_by_first_seen():
    assert answer_key("<answer>1,200</answer>") == answer_key("so the final answer is $1200.")
    assert answer_key("The answer is (c)") == answer_key("<answer>C</answer>")
    assert majority(["<answer>5</answer>", "<answer>7</answer>"]) == ("<answer>5</answer>", 1)
    assert majority(["x <answer>7</answer>", "<answer>5</answer>", "y <answer>7.0</answer>"]) == ("x <answer>7</answer>", 2)


@given(st.lists(st.integers(0, 4), min_size=1, max_size=12))
def test_vote_returns_a_most_common_answer_first_seen(values):
    responses = [f"reasoning {i}\n<answer>{v}</answer>" for i, v in enumerate(values)]
    text, count = majority(responses)
    counts = Counter(values)
    assert count == max(counts.values())
    winner = int(text.split("<answer>")[1].split("<")[0])
    assert counts[winner] == count and values.index(winner) == min(values.index(v) for v in counts if counts[v] == count)


# ---------------------------------------------------------------- specs

@pytest.mark.parametrize("spec,msg", [("fixed:9", "not in the pool"), ("sc:0:0", "k must be at least 1"),
                                      ("moa:0+x:1", "'x' is not a worker number"), ("sc:1", "expected fixed:I"),
                                      ("random:a", "seed 'a' is not an integer")])
def test_bad_specs_are_one_line_errors(spec, msg):
    with pytest.raises(StrategyError, match=msg):
        typed = parse_conductor_spec(spec)
        make_strategy(typed, strategy_pool(typed, SIM))


def test_strategy_pool_adds_one_vote_worker_and_only_for_votes():
    sc, moa, vote = (parse_conductor_spec(s) for s in ("sc:0:3", "moa:0+1:2", "vote:0+1"))
    p = strategy_pool(sc, SIM)
    assert [w.provider for w in p.workers][-1] == "vote" and len(p.workers) == len(SIM.workers) + 1
    assert strategy_pool(sc, p) is p and strategy_pool(moa, SIM) is SIM
    assert strategy_pool(vote, SIM).workers[-1].provider == "vote" and strategy_pool(vote, p) is p
    with pytest.raises(StrategyError, match="--max-steps 6"):
        check_strategy(parse_conductor_spec("sc:0:5"), SIM, 5)


def test_answer_cli_refuses_an_unusable_strategy_before_starting(tmp_path, questions_file):
    r = subprocess.run([sys.executable, "-m", "conductor.cli", "answer", str(questions_file), "--out", str(tmp_path / "o"),
                        "--pool", SIM_POOL, "--conductor", "sc:0:5"], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ")
    assert "strategy 'sc:0:5' writes 6 steps: run it with --max-steps 6 or more" in lines[0]
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------- a real model

@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python not installed")
def test_self_consistency_over_smollm2_through_the_real_server(tmp_path, questions_file):
    from conductor.local import embedded

    try:
        embedded.model_path("smollm2-135m-instruct")
    except embedded.EmbeddedError as e:
        pytest.skip(str(e))
    pool = tmp_path / "smol.yaml"
    pool.write_text("""
pool_id: smol
workers:
  - name: smollm2-135m
    provider: local
    model: smollm2-135m-instruct
    base_url: embedded://smollm2-135m-instruct
    sampling: {temperature: 0.8, max_tokens: 48}
    limits: {max_concurrency: 1, timeout_s: 120}
  - name: python
    provider: python
    model: cpython3
    limits: {timeout_s: 30}
    sandbox: {wall_s: 5}
""")
    q = tmp_path / "q1.jsonl"
    q.write_text(json.dumps({"id": "q1", "question": "What is 2 + 3?", "answer": "5"}) + "\n")
    s = answer(q, tmp_path / "smol", "sc:0:3", max_steps=4, pool=str(pool))
    assert s.parse_failures == 0 and s.infra_failures == 0 and s.calls_per_question == 4
    traj, calls = lake_rows(s)
    samples = calls.filter(pl.col("provider") == "local")
    assert samples.height == 3 and samples["messages_hash"].n_unique() == 3 and (samples["output_tokens"] > 0).all()
    assert traj["final_answer"].item() in samples["response"].to_list()
    r = answer(q, tmp_path / "smol-random", "random:1:3", max_steps=3, pool=str(pool))
    assert r.parse_failures == 0 and r.infra_failures == 0
