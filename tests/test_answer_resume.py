"""A rerun of `conductor answer` (issues #17, #39) resumes by content and layout, not by path and arguments.

Real Prefect (ephemeral), the real Parquet lake, the simulated pool and the fixed single-worker policy; the
infrastructure failures come from a real OpenAI SDK worker (missing key) against the loopback emulator.
Each test failed on the code before the fix (shard ids by position, done = "a file of that name exists").
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from conductor.lake import write_shard
from conductor.lake.reader import scan
from conductor.testing.emulator import Emulator

ROOT = Path(__file__).resolve().parent.parent
SIM_POOL = str(ROOT / "data/pools/simulated.yaml")


def write_questions(path: Path, n: int, edits: dict[int, tuple[str, str]] | None = None) -> Path:
    rows = [{"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(n)]
    for i, (text, answer) in (edits or {}).items():
        rows[i].update(question=text, answer=answer)
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def answer(qfile: Path, out: Path, **kw):
    from conductor.run.config import AnswerConfig
    from flows.answer import answer_flow

    kw.setdefault("pool", SIM_POOL)
    kw.setdefault("conductor", "fixed:0")
    return answer_flow(AnswerConfig(questions=str(qfile), out=str(out), show_progress=False, **kw))


def answers(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "answers.jsonl").read_text(encoding="utf-8").splitlines()]


def lake_rows(out: Path, run_id: str) -> pl.DataFrame:
    return scan(str(out / "lake"), kind="answer", run_id=run_id).collect()


def test_another_shard_size_redoes_nothing_and_never_duplicates_or_drops(tmp_path):
    q = write_questions(tmp_path / "q.jsonl", 12)
    out = tmp_path / "out"
    s1 = answer(q, out, shard_size=5)
    for size in (3, 10):   # smaller shards used to add rows, larger ones to drop questions
        s = answer(q, out, shard_size=size)
        assert s.run_id == s1.run_id and s.questions == 12 and s.trajectories == 12
        assert sorted(a["question_id"] for a in answers(out)) == sorted(f"q{i}" for i in range(12))
        rows = lake_rows(out, s1.run_id)
        assert rows.height == 12 and rows["question_id"].n_unique() == 12
        assert rows["n_cache_hits"].sum() == 0      # nothing was run again, not even from the cache


def test_an_edited_question_is_redone_and_its_stale_answer_leaves_answers_jsonl(tmp_path):
    out = tmp_path / "out"
    s1 = answer(write_questions(tmp_path / "q.jsonl", 6), out, shard_size=3)
    s2 = answer(write_questions(tmp_path / "q.jsonl", 6, {4: ("What is 40 + 2?", "42")}), out, shard_size=3)
    by_id = {a["question_id"]: a for a in answers(out)}
    assert len(answers(out)) == 6 and by_id["q4"]["gold"] == "42" and by_id["q4"]["extracted_answer"] is not None
    assert s2.run_id == s1.run_id and s2.trajectories == 6 and s2.superseded == 1
    rows = lake_rows(out, s1.run_id)
    assert rows.height == 7                          # the old version stays in the lake as history
    assert sorted(rows.filter(pl.col("question_id") == "q4")["gold"].to_list()) == ["42", "8"]


def test_a_larger_limit_adds_only_the_new_questions(tmp_path):
    q = write_questions(tmp_path / "q.jsonl", 8)
    out = tmp_path / "out"
    s1 = answer(q, out, limit=4, shard_size=4)
    s2 = answer(q, out, limit=8, shard_size=4)
    assert s1.run_id == s2.run_id and s2.questions == 8 and s2.superseded == 0
    assert lake_rows(out, s2.run_id).height == 8


@pytest.mark.parametrize("damage", ["truncate-trajectories", "delete-calls"])
def test_a_damaged_shard_file_is_redone(tmp_path, damage):
    q = write_questions(tmp_path / "q.jsonl", 6)
    out = tmp_path / "out"
    s1 = answer(q, out, shard_size=3)
    traj = sorted((out / "lake" / "trajectories").rglob("*.parquet"))[0]
    calls = out / "lake" / "calls" / traj.relative_to(out / "lake" / "trajectories")
    if damage == "truncate-trajectories":
        traj.write_bytes(traj.read_bytes()[:200])
    else:
        calls.unlink()
    answer(q, out, shard_size=3)
    assert lake_rows(out, s1.run_id).height == 6                    # readable again, no duplicates
    assert len(answers(out)) == 6
    n_calls = scan(str(out / "lake"), "calls", kind="answer", run_id=s1.run_id).collect().height
    assert n_calls == 6                                                  # every call row is back
    assert any(p.name.startswith(f".{traj.name}.damaged-") for p in traj.parent.iterdir())


def test_a_rerun_removes_the_temp_files_a_killed_writer_left(tmp_path):
    """A writer killed mid-file (kill -9) leaves its hidden temp file; the resume removes it (once flaky in
    test_deployments.py's kill test, which found one in lake/calls/). Another run's temps and a compaction's
    are not this run's to remove."""
    q = write_questions(tmp_path / "q.jsonl", 4)
    out = tmp_path / "out"
    s1 = answer(q, out, shard_size=2)
    traj = sorted((out / "lake" / "trajectories").rglob("shard-*.parquet"))[0]
    calls = out / "lake" / "calls" / traj.relative_to(out / "lake" / "trajectories")
    orphans = [calls.parent / f".{calls.name}.{'a' * 32}.tmp", traj.parent / f".shard-x.parquet.{'b' * 32}.tmp"]
    other_run = out / "lake" / "calls" / "kind=answer" / traj.parent.parent.name / "run_id=other"
    other_run.mkdir(parents=True)
    kept = [other_run / f".{calls.name}.{'c' * 32}.tmp", calls.parent / f".compact-1.parquet.{'d' * 32}.tmp"]
    for p in orphans + kept:
        p.write_bytes(b"PAR1 half a file")
    s2 = answer(q, out, shard_size=2)
    assert s2.run_id == s1.run_id and s2.answered_now == 0
    assert [p for p in orphans if p.exists()] == [], "the killed writer's temp files are removed"
    assert all(p.exists() for p in kept)
    assert lake_rows(out, s1.run_id).height == 4


def test_a_question_file_name_with_space_accent_and_equals_sign_works(tmp_path):
    q = write_questions(tmp_path / "my questions é=v2.jsonl", 3)
    s = answer(q, tmp_path / "out", shard_size=2)
    assert s.questions == 3 and s.infra_failures == 0


@pytest.fixture()
def emulator():
    emu = Emulator().start()
    yield emu
    emu.stop()


def test_infrastructure_failures_are_retried_on_rerun_not_kept_as_done(tmp_path, emulator, monkeypatch):
    pool = tmp_path / "pool.yaml"
    pool.write_text(f"""pool_id: emu
workers:
  - name: gpt
    provider: openai
    model: gpt-emu
    base_url: {emulator.base_url}/v1
    api_key_env: CONDUCTOR_ADV_RETRY_KEY
    limits: {{max_retries: 0, timeout_s: 5}}
""", encoding="utf-8")
    q = write_questions(tmp_path / "q.jsonl", 4)
    out = tmp_path / "out"
    monkeypatch.delenv("CONDUCTOR_ADV_RETRY_KEY", raising=False)
    s1 = answer(q, out, pool=str(pool), shard_size=2)
    assert s1.infra_failed_questions == 4 and "CONDUCTOR_ADV_RETRY_KEY" in next(iter(s1.infra_causes))

    kept = answer(q, out, pool=str(pool), shard_size=2, retry_failed=False)   # --keep-failed: nothing retried
    assert kept.infra_failed_questions == 4 and emulator.stats().get("openai:ok", 0) == 0

    monkeypatch.setenv("CONDUCTOR_ADV_RETRY_KEY", "emu-key-0123456789")
    s2 = answer(q, out, pool=str(pool), shard_size=2)
    assert s2.infra_failed_questions == 0 and s2.infra_failures == 0 and s2.trajectories == 4
    assert s2.superseded == 4      # the failed attempts stay in the lake as history, not overwritten (#39)
    assert all(not a["infra_failed"] and a["final_answer"] for a in answers(out))
    assert len(answers(out)) == 4
    s3 = answer(q, out, pool=str(pool), shard_size=2)    # answered now: a third run calls nothing
    assert s3.infra_failed_questions == 0 and emulator.stats().get("openai:ok", 0) == 4


def test_the_summary_names_the_workers_the_workflows_called(tmp_path):
    out = tmp_path / "out"
    s = answer(write_questions(tmp_path / "q.jsonl", 6), out, conductor="random:7", shard_size=3)
    calls = scan(str(out / "lake"), "calls", kind="answer", run_id=s.run_id).collect()
    expected = {w: [n, calls.filter(pl.col("worker") == w)["trajectory_id"].n_unique()]
                for w, n in calls["worker"].value_counts().iter_rows()}
    assert s.workers_used == expected and len(expected) >= 2
    assert list(s.workers_used.values()) == sorted(s.workers_used.values(), key=lambda v: -v[0])
    line = next(ln for ln in s.render().splitlines() if ln.strip().startswith("workers used"))
    for w, (n, q) in s.workers_used.items():
        assert f"{w} {n} call{'s' if n != 1 else ''} in {q} of 6 questions" in line


def test_16_a_retried_shard_keeps_the_failed_attempt_as_history(tmp_path):
    from conductor.data.questions import Question, content_sharded
    from conductor.lake.resume import committed
    from lake_records import traj

    failed = [traj("r", f"q{i}", 0, kind="answer", infra_cause="rate_limited: x") for i in range(2)]
    write_shard(tmp_path, failed, "first")
    state = committed(tmp_path, "answer", "r")
    ids = {t.question_id: [t.trajectory_id] for t in failed}
    assert state.failed == set(sum(ids.values(), [])) and set(state.failed_rows.values()) == {1}
    qs = [Question(id=f"q{i}", dataset="d", domain="math", prompt="p") for i in range(2)]
    plain = content_sharded(qs, 5, key=lambda q: "\x1f".join(ids[q.id]))
    retry = content_sharded(qs, 5, key=lambda q: "\x1f".join(ids[q.id]) + state.attempt_key(ids[q.id]))
    assert plain[0][0] != retry[0][0]        # the retry writes a shard of its own: the failed rows are kept
    write_shard(tmp_path, failed, "second")   # failed again: the next retry gets yet another name
    again = committed(tmp_path, "answer", "r")
    assert again.attempt_key(ids["q0"]) != state.attempt_key(ids["q0"])
