"""Record a menu of workflows once, replay it forever (issue #47): program-of-thought, chain, vote of kinds and the
agreement cascade; the recording through the real OpenAI SDK against the loopback emulator, the replay with the
emulator STOPPED (so any model call would fail), seconds and per-second prices kept, a missing recording an
infrastructure failure."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from conductor.data.questions import Question
from conductor.execution.cache import ResponseCache, cache_key
from conductor.execution.executor import Executor
from conductor.policy.fixed import FixedWorkflowPolicy
from conductor.policy.menu import WorkflowMenu
from conductor.policy.spec import StrategyError, parse_conductor_spec
from conductor.policy.strategies import (
    DECIDE_SUBTASK,
    DIRECT_SUBTASK,
    PROGRAM_SUBTASK,
    REASON_SUBTASK,
    REPORT_SUBTASK,
    RUN_SUBTASK,
    make_strategy,
    strategy_pool,
)
from conductor.run.pipeline import RunSpec
from conductor.run.record import record_menu
from conductor.run.shards import run_shard
from conductor.testing.emulator import Emulator
from conductor.workers.pool import Pool, Price, SandboxSpec, Worker, load_pool
from conductor.workers.providers.base import Message
from tests.fixtures_emulator import FAKE_KEYS

ROOT = Path(__file__).resolve().parent.parent
MENU = "fixed:0,pot:0,chain:0:0,cascade:0+pot-0:0,vote:0+pot-0+chain-0-0"
PRICE_PER_S = 0.001

# q-agree: the direct answer and the program agree (13); q-split: direct says 12, the program prints 13.
QUESTIONS = [Question(id="q-agree", dataset="unit", domain="math", prompt="What is 6 + 7? (agree)", gold="13"),
             Question(id="q-split", dataset="unit", domain="math", prompt="What is 6 + 7? (split)", gold="13")]
SCRIPT = [   # first match wins: a later step's message also holds the subtasks of the steps it sees
    {"match": DECIDE_SUBTASK, "reply": "Checking both: <answer>13</answer>"},
    {"match": REPORT_SUBTASK, "reply": "<answer>13</answer>"},
    {"match": REASON_SUBTASK, "reply": "6 plus 7 is 13.\n```python\nprint(6 + 7)\n```"},
    {"match": PROGRAM_SUBTASK, "reply": "```python\nprint(6 + 7)\n```"},
    {"match": "(split)", "reply": "<answer>12</answer>"},
    {"match": "(agree)", "reply": "<answer>13</answer>"},
]


def _pool(emu_url: str) -> Pool:
    llm = Worker(name="llm", provider="openai", model="llm-model", base_url=emu_url + "/v1", api_key_env="EMU_OPENAI_KEY",
                 price=Price(per_second=PRICE_PER_S), limits={"timeout_s": 5.0, "max_retries": 0})
    py = Worker(name="python", provider="python", model="cpython3", sandbox=SandboxSpec(wall_s=10))
    return Pool(pool_id="replay-menu", workers=(llm, py))


@pytest.fixture()
def recorded(tmp_path, monkeypatch):
    """A menu recorded over the emulator, which is stopped before the test body runs."""
    for k, v in FAKE_KEYS.items():
        monkeypatch.setenv(k, v)
    emu = Emulator().start()
    try:
        emu.configure(scripted=SCRIPT, latency_s=0.05)
        menu = WorkflowMenu.parse(MENU, _pool(emu.base_url))
        cache = ResponseCache(tmp_path / "rec.sqlite")
        lines: list[str] = []
        summary = record_menu(QUESTIONS, menu, menu.pool, cache, on_question=lambda p: lines.append(p.line()))
        cache.close()
        requests = emu.stats().get("openai", 0)
    finally:
        emu.stop()
    return menu, tmp_path / "rec.sqlite", summary, requests, lines


def replay(menu: WorkflowMenu, spec: str, cache: Path, questions=QUESTIONS):
    entry = next(e for e in menu.entries if e.spec == spec)
    run = RunSpec(run_id=f"replay-{spec}", kind="eval", pool=menu.pool, checkpoint_id=spec, max_steps=len(entry.workflow))
    ex = Executor(cache=ResponseCache(cache, mode="replay"))
    try:
        return {t.question_id: t for t in run_shard(questions, run, FixedWorkflowPolicy(entry.workflow), ex)}
    finally:
        ex.cache.close()


def test_recording_pays_each_shared_call_once_and_reports_progress(recorded):
    menu, _, summary, requests, lines = recorded
    # model calls per question: direct, program, reason, report; the decider only where the answers split
    assert summary.failures == 0 and summary.questions == 2
    assert requests == 4 + 5
    assert summary.cached_calls > 0                       # the vote and the cascade re-read the shared calls
    assert lines[0].startswith("[1/2] q-agree: ") and "ETA" in lines[-1]


def test_every_entry_replays_with_the_model_gone(recorded):
    menu, cache, *_ = recorded
    for spec in menu.specs():
        rows = replay(menu, spec, cache)
        assert all(not t.infra_failed for t in rows.values()), (spec, [t.infra_cause for t in rows.values()])
        assert all(c.cache_hit or c.provider in ("python", "vote", "agree") for t in rows.values() for c in t.calls)
    assert replay(menu, "fixed:0", cache)["q-split"].correct is False
    assert replay(menu, "pot:0", cache)["q-split"].correct is True
    assert replay(menu, "vote:0+pot-0+chain-0-0", cache)["q-split"].correct is True   # 13, 13 outvote 12


def test_the_cascade_escalates_only_when_its_cheap_answers_disagree(recorded):
    menu, cache, *_ = recorded
    rows = replay(menu, "cascade:0+pot-0:0", cache)
    agree, split = rows["q-agree"], rows["q-split"]
    assert [c.provider for c in agree.calls] == ["openai", "openai", "python", "agree"]   # no decider call
    assert agree.calls[-1].finish_reason == "settled" and agree.correct is True
    assert [c.provider for c in split.calls][-2:] == ["agree", "openai"] and split.calls[-1].subtask == DECIDE_SUBTASK
    assert split.correct is True                       # the decider is paid for only where the answers split
    assert sum(c.cost_usd > 0 for c in split.calls) == 3 and sum(c.cost_usd > 0 for c in agree.calls) == 2


def test_a_replayed_call_costs_its_recorded_seconds(recorded):
    menu, cache, *_ = recorded
    rows = replay(menu, "fixed:0", cache)
    call = rows["q-agree"].calls[0]
    assert call.latency_s >= 0.05                                    # the emulator's latency, recorded
    assert call.cost_usd == pytest.approx(call.latency_s * PRICE_PER_S, rel=1e-6)
    again = replay(menu, "fixed:0", cache)["q-agree"].calls[0]
    assert again.latency_s == call.latency_s                         # read back, not re-measured


def test_a_question_that_was_not_recorded_is_an_infrastructure_failure(recorded):
    menu, cache, *_ = recorded
    new = Question(id="q-new", dataset="unit", domain="math", prompt="What is 1 + 1?", gold="2")
    row = replay(menu, "fixed:0", cache, [new])["q-new"]
    assert row.infra_failed and "cache_miss" in (row.infra_cause or "") and row.correct is None


def test_old_caches_without_seconds_still_read_and_gain_the_column(tmp_path):
    import sqlite3

    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE responses (key TEXT PRIMARY KEY, provider TEXT NOT NULL, model TEXT NOT NULL, "
                 "text TEXT NOT NULL, input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, "
                 "finish_reason TEXT, created REAL NOT NULL)")
    conn.execute("INSERT INTO responses VALUES ('k', 'openai', 'm', 'hi', 1, 2, 'stop', 0)")
    conn.commit()
    conn.close()
    ro = ResponseCache(path, mode="replay")
    assert ro.lookup("k").text == "hi" and ro.lookup("k").latency_s is None
    ro.close()
    rw = ResponseCache(path)
    assert rw.lookup("k").latency_s is None
    rw.close()
    cols = [r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(responses)")]
    assert "latency_s" in cols


# ------------------------------------------------------------------ the strategies' shapes and their calls

def test_chain_uses_the_informed_examples_subtasks_word_for_word():
    informed = yaml.safe_load((ROOT / "data/fewshot/informed.yaml").read_text())
    calc = next(e for e in informed["examples"] if "{python}" in e["response"])
    assert REASON_SUBTASK in calc["response"] and REPORT_SUBTASK in calc["response"]
    assert f'"{RUN_SUBTASK}"' in calc["response"]


def test_an_item_inside_a_vote_sends_the_same_messages_as_the_strategy_alone():
    from conductor.prompts import worker_messages

    pool = load_pool(ROOT / "data/pools/local.yaml")
    vote = parse_conductor_spec("vote:0+pot-0+chain-0-1")
    alone = make_strategy(parse_conductor_spec("chain:0:1"), pool).workflow
    vote_pool = strategy_pool(vote, pool)
    voted = make_strategy(vote, vote_pool).workflow
    q = "What is 6 + 7?"
    answers = {0: "13 because ...\n```python\nprint(13)\n```", 1: "13"}
    for i_alone, i_vote in ((0, 3), (1, 4), (2, 5)):
        seen_alone = {j: answers[j] for j in alone.steps[i_alone].sees(i_alone)} if i_alone else {}
        seen_vote = {j: answers[j - 3] for j in voted.steps[i_vote].sees(i_vote)}
        assert worker_messages(q, alone, i_alone, seen_alone) == worker_messages(q, voted, i_vote, seen_vote)


def test_local_hybrid_pool_shares_the_local_pools_recordings():
    local = load_pool(ROOT / "data/pools/local.yaml")
    hybrid = load_pool(ROOT / "data/pools/local-hybrid.yaml")
    msgs = [Message("user", "q")]
    for a, b in zip(local.workers, hybrid.workers[:4]):
        assert cache_key(a, msgs) == cache_key(b, msgs)
        assert a.provider == "python" or b.price.per_second > 0
    assert [w.provider for w in hybrid.workers[4:]] == ["replay", "replay"]


@pytest.mark.parametrize(("text", "steps"), [
    ("pot:0", 2), ("chain:0:1", 3), ("vote:0+pot-0+chain-0-1", 7), ("cascade:0+pot-0:0", 5),
    ("cascade:0+pot-0+4:5", 6),
])
def test_new_strategy_specs_round_trip_and_count_their_steps(text, steps):
    spec = parse_conductor_spec(text)
    assert str(spec) == text and parse_conductor_spec(str(spec)) == spec and spec.steps_needed == steps


@pytest.mark.parametrize(("text", "message"), [
    ("cascade:0:1", "a cascade needs at least two cheap answers"),
    ("vote:0+pot-x", "'x' is not a worker number"),
    ("vote:0+chain-0", "expected pot-I or chain-I-R"),
    ("pot:0:1", "expected fixed:I"),
])
def test_bad_strategy_specs_are_one_line(text, message):
    with pytest.raises(StrategyError, match=message):
        parse_conductor_spec(text)


def test_program_strategies_need_a_python_worker():
    pool = Pool(pool_id="p", workers=(Worker(name="a", provider="simulated", model="a"),))
    with pytest.raises(StrategyError, match="no python tool worker"):
        make_strategy(parse_conductor_spec("pot:0"), pool)
    assert [s.subtask for s in make_strategy(parse_conductor_spec("fixed:0"), pool).workflow.steps] == [DIRECT_SUBTASK]


def test_the_default_conductor_generation_is_never_made_during_a_replay(tmp_path):
    from conductor.generation import Generation, GenerationParams
    from conductor.policy.cached import CachedPolicy, ReplayMiss

    class Counting:
        name = "counting"
        calls = 0

        def generate(self, prompts, n, params):
            Counting.calls += 1
            return [[Generation(text="model_id = [0]") for _ in range(n)] for _ in prompts]

    params = GenerationParams(temperature=0.0)
    rw = ResponseCache(tmp_path / "c.sqlite")
    CachedPolicy(Counting(), rw, "ckpt").generate(["p1"], 1, params)
    rw.close()
    ro = ResponseCache(tmp_path / "c.sqlite", mode="replay")
    got = CachedPolicy(Counting(), ro, "ckpt").generate(["p1"], 1, params)
    assert got[0][0].text == "model_id = [0]" and got[0][0].seconds is not None and Counting.calls == 1
    with pytest.raises(ReplayMiss, match="not recorded"):
        CachedPolicy(Counting(), ro, "ckpt").generate(["p2"], 1, params)
    ro.close()
    assert os.path.exists(tmp_path / "c.sqlite")


# ------------------------------------------------------------------ the headroom check over a menu of workflows

def test_headroom_takes_menu_entries_as_its_options(tmp_path):
    import json
    import subprocess
    import sys

    q = tmp_path / "q.jsonl"
    q.write_text("".join(json.dumps({"id": f"a{i}", "question": f"What is {i} + 4?", "answer": str(i + 4)}) + "\n"
                         for i in range(6)))
    options = "fixed:0,fixed:3,vote:0+1+3,cascade:3+1:0"
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "conductor.cli", "headroom", str(q), "--out", str(out), "--pool",
                        str(ROOT / "data/pools/simulated.yaml"), "--options", options, "--n-boot", "300"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((out / "headroom.json").read_text())
    assert [w["label"] for w in data["workers"]] == options.split(",")
    assert data["n_questions"] == 6 and data["any_correct"]["accuracy"] >= max(w["accuracy"] for w in data["workers"])
    # read mode over the same lake: the same options, the same check
    again = subprocess.run([sys.executable, "-m", "conductor.cli", "headroom", "--lake", str(out / "lake"), "--out",
                            str(tmp_path / "again"), "--options", options, "--n-boot", "300"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((tmp_path / "again" / "headroom.json").read_text())["workers"] == data["workers"]


# ------------------------------------------------------------------ GRPO over the menu, every rollout replayed

def test_grpo_over_the_menu_trains_on_replayed_rollouts_only(recorded, tmp_path):
    """Rollouts through the shard loop over the recording (the emulator is gone: a model call would fail),
    scored, and one GRPO step per iteration with the cost objective; the menu's choices are read back."""
    pytest.importorskip("transformers")
    from conductor.learning.choice import ChoiceSettings, make_choice_conductor, train_choice_conductor
    from conductor.policy.menu import MENU_PREFILL, MenuBackend
    from tests.grpo_fixtures import tiny_checkpoint

    menu, cache, *_ = recorded
    s = ChoiceSettings(n_workers=len(menu), iterations=2, lr=1e-3, group_size=4, prefill=MENU_PREFILL,
                        temperature=1.5, cost_lambda=0.4, max_tokens=3)
    trainer, inner = make_choice_conductor(s, str(tiny_checkpoint(tmp_path / "tiny")))
    backend = MenuBackend(inner, menu)
    ex = Executor(cache=ResponseCache(cache, mode="replay"), shared_samples=True)   # a group replays one recording
    seen = []

    def rollout(qs, run_id, samples, seed):
        spec = RunSpec(run_id=run_id, kind="rollout", pool=menu.pool, samples=samples, seed=seed, fewshot="none",
                       temperature=1.5, max_tokens=3, max_steps=max(len(e.workflow) for e in menu.entries))
        rows = run_shard(qs, spec, backend, ex)
        seen.extend(rows)
        return rows

    curve = train_choice_conductor(trainer, rollout, QUESTIONS, [], s, 2, menu.specs(), run_prefix="t", choices=menu.shares)
    ex.cache.close()
    assert len(curve) == 2 and all(abs(r["loss"]) < 1e3 for r in curve)
    assert seen and not any(t.infra_failed for t in seen)            # every rollout replayed from the recording
    assert all(r["choices"]["math"] and "other" not in r["choices"]["math"] for r in curve)
    assert trainer.cfg.objective.cost_lambda == 0.4


# ------------------------------------------------------------------ the command: record, then replay

def test_record_command_then_answer_replays_without_a_model(tmp_path):
    import json
    import subprocess
    import sys

    q = tmp_path / "q.jsonl"
    q.write_text("".join(json.dumps({"id": f"r{i}", "question": f"What is {i} + 2?", "answer": str(i + 2)}) + "\n"
                         for i in range(3)))
    pool = str(ROOT / "data/pools/simulated.yaml")
    cache = tmp_path / "rec.sqlite"
    cmd = [sys.executable, "-m", "conductor.cli"]
    r = subprocess.run([*cmd, "record", str(q), "--menu", "fixed:0,vote:0+1+3,cascade:3+1:0", "--cache", str(cache),
                        "--pool", pool], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[0].startswith("[1/3] r0: ") and "recorded 3 questions x 3 entries" in r.stdout
    again = subprocess.run([*cmd, "record", str(q), "--menu", "fixed:0,vote:0+1+3,cascade:3+1:0", "--cache",
                            str(cache), "--pool", pool], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and ": 0 new calls" in again.stdout.splitlines()[-1]   # resumed: nothing to pay
    # the simulated workers are "models": in replay mode a call the recording lacks would be a cache_miss
    for spec in ("vote:0+1+3", "cascade:3+1:0"):
        out = tmp_path / spec.replace(":", "_")
        a = subprocess.run([*cmd, "answer", str(q), "--pool", pool, "--conductor", spec, "--cache", str(cache),
                            "--replay", "--out", str(out), "--max-steps", "5"], cwd=ROOT, capture_output=True,
                           text=True, timeout=600)
        assert a.returncode == 0, (spec, a.stderr[-2000:])
    missing = subprocess.run([*cmd, "answer", str(q), "--pool", pool, "--conductor", "fixed:2", "--cache", str(cache),
                              "--replay", "--out", str(tmp_path / "missing")], cwd=ROOT, capture_output=True, text=True,
                             timeout=600)
    assert missing.returncode == 3     # every question failed on infrastructure: fixed:2 was never recorded


def test_record_command_refuses_a_bad_menu_in_one_line(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "conductor.cli", "record", "gsm8k_test:1", "--menu", "fixed:0,pot:x",
                        "--cache", str(tmp_path / "c.sqlite"), "--pool", str(ROOT / "data/pools/simulated.yaml")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1
    assert "menu entry 2 'pot:x'" in r.stderr and not (tmp_path / "c.sqlite").exists()


# ------------------------------------------------------------------ the bench's library (conductor.run.workflow_replay)

def test_library_doctests() -> None:
    import doctest

    from conductor.learning import splits
    from conductor.run.workflow_replay import recording, report

    for module in (splits, recording, report):
        assert doctest.testmod(module).failed == 0


def test_replay_strategy_reads_outcomes_and_recorded_cost_from_the_recording_alone(recorded):
    from conductor.run.workflow_replay.replay import replay_strategy

    menu, cache, *_ = recorded
    entry = next(e for e in menu.entries if e.spec == "fixed:0")
    new = Question(id="q-new", dataset="unit", domain="math", prompt="What is 1 + 1?", gold="2")
    rows = replay_strategy("fixed:0", entry.workflow, menu.pool, [*QUESTIONS, new], cache)
    assert rows["q-agree"].correct and not rows["q-split"].correct and not rows["q-agree"].infra
    assert rows["q-agree"].dollars == pytest.approx(rows["q-agree"].seconds * PRICE_PER_S, rel=1e-3)
    assert rows["q-agree"].seconds >= 0.05                 # the emulator's recorded latency, not a replay's
    assert rows["q-new"].infra                             # not recorded: an infrastructure failure, no model call


def test_replay_settings_name_the_option_they_refuse() -> None:
    from conductor.run.workflow_replay.replay import ReplaySettings, ReplaySettingsError

    with pytest.raises(ReplaySettingsError, match="--group-size"):
        ReplaySettings(group_size=1)
    with pytest.raises(ReplaySettingsError, match="--lr"):
        ReplaySettings(lr=0.0)
    assert ReplaySettings().lambdas == (0.0, 0.4)


def test_the_question_set_grows_by_keeping_its_prefix_and_its_spec_loads_exactly_it() -> None:
    from conductor.data.questionset import load_questions
    from conductor.run.workflow_replay.questions import question_set, slice_spec, split

    small, big = question_set(20, 8), question_set(40, 16)
    assert {q.id for q in small} <= {q.id for q in big}
    assert [q.id for q in big if q.id in {x.id for x in small}] == [q.id for q in small]   # the same merged order
    # a prefix (a recording under way) mixes the datasets in the set's ratio: 40 GSM8K to 16 MMLU
    assert all(abs(sum(q.domain == "math" for q in big[:n]) - n * 40 / 56) <= 1.5 for n in range(1, 57))
    assert [q.id for q in load_questions(slice_spec(small[:6]))] == [q.id for q in small[:6]]
    assert {split(q) for q in big} <= {"train", "validation", "test"} and [split(q) for q in small] == [
        split(q) for q in small]


def test_a_choice_conductor_with_inconsistent_settings_raises_instead_of_exiting(tmp_path) -> None:
    pytest.importorskip("transformers")
    from conductor.learning.choice import ChoiceSettings, ChoiceSettingsError, make_choice_conductor
    from tests.grpo_fixtures import tiny_checkpoint

    with pytest.raises(ChoiceSettingsError, match="prefill"):
        make_choice_conductor(ChoiceSettings(n_workers=3, prefill=""), str(tiny_checkpoint(tmp_path / "tiny")))


@pytest.mark.parametrize("args, needle", [(["--lambdas", "abc"], "--lambdas"), (["--group-size", "1"], "--group-size"),
                                          (["--lr", "0"], "--lr")])
def test_the_bench_refuses_a_bad_replay_option_with_one_line_and_exit_2(args, needle, tmp_path) -> None:
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(ROOT / "bench/workflow_replay.py"), "replay", *args,
                        "--state", str(tmp_path / "state")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert needle in r.stderr.strip().splitlines()[-1] and not (tmp_path / "state").exists()


def test_progress_table_describes_the_recording_per_dataset_with_paired_differences_and_the_oracle():
    from conductor.run.workflow_replay.report import Outcome, progress_table

    qs = [Question(id=f"g{i}", dataset="gsm8k", domain="math", prompt=f"q{i}", gold="1") for i in range(4)]
    qs += [Question(id=f"m{i}", dataset="mmlu", domain="mcq", prompt=f"m{i}", gold="A") for i in range(2)]
    right = {"g0", "g1", "m0"}                      # fixed:0 right on these
    other = {"g0", "g2", "m1"}                      # pot:0 right on these: together every question but g3

    def rows(ok: set[str]) -> dict[str, Outcome]:
        return {q.id: Outcome(q.id in ok, 10.0, 0.0) for q in qs}

    results = {"fixed:0": rows(right), "pot:0": rows(other), "default": rows({"g0"})}
    text = progress_table(results, qs, ["fixed:0", "pot:0"])
    assert "GSM8K: 4 questions" in text and "MMLU-STEM: 2 questions" in text and "all: 6 questions" in text
    all_part = text[text.index("all: 6 questions"):]
    assert "| fixed:0 | 0.500 ± 0.224 | 10.0 | +0.000 ± 0.000 |" in all_part
    assert "| default | 0.167 ± 0.167 | 10.0 | -0.333 ± 0.211 |" in all_part
    assert "| any-correct oracle over the entries | 0.833 |" in all_part       # 5 of 6: only g3 is missed by both
