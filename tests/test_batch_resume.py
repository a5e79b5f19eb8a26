"""`conductor answer --batch` killed with SIGKILL while it polls, then rerun: it resumes polling the batches
it had created and submits no request twice; its answers equal a synchronous run's, at a lower cost.

Real subprocesses and the unchanged paper pool: the OpenAI, Anthropic and Gemini SDKs (and the vLLM
endpoint, which has no batch API and so calls synchronously) all talk to the emulator through the SDKs'
base-URL environment variables; the conductor is the emulator too, scripted per question.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from conductor.testing.emulator import Emulator, EmulatorConfig

ROOT = Path(__file__).resolve().parents[1]
CONDUCTOR = "conductor-under-test"
WORKFLOWS = [
    'model_id = [0, 1, 2]\nsubtasks = ["Solve.", "Solve independently.", "Compare and answer."]\n'
    'access_list = [[], [], ["all"]]',
    'model_id = [2, 3, 0]\nsubtasks = ["Plan.", "Work it out.", "Check and answer."]\naccess_list = [[], [0], ["all"]]',
    'model_id = [1]\nsubtasks = ["Answer directly."]\naccess_list = [[]]',
]
KEYS = {"OPENAI_API_KEY": "sk-test-batch-openai-0000", "ANTHROPIC_API_KEY": "sk-ant-test-batch-0000",
        "GEMINI_API_KEY": "test-batch-gemini-0000", "VLLM_API_KEY": "test-batch-vllm-0000"}


def _env(emu: Emulator, tmp: Path) -> dict[str, str]:
    return {**os.environ, **KEYS, "PREFECT_HOME": str(tmp / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "OPENAI_BASE_URL": f"{emu.base_url}/v1", "ANTHROPIC_BASE_URL": emu.base_url,
            "GOOGLE_GEMINI_BASE_URL": emu.base_url, "VLLM_BASE_URL": f"{emu.base_url}/v1"}


def _cmd(emu: Emulator, q: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "conductor.cli", "answer", str(q), "--out", str(out), "--shard-size", "2",
            "--pool", str(ROOT / "data" / "pools" / "paper.yaml"), "--conductor", f"openai:{CONDUCTOR}@{emu.base_url}/v1",
            *extra]


def _answers(out: Path) -> dict[str, str]:
    rows = [json.loads(x) for x in (out / "answers.jsonl").read_text().splitlines()]
    return {r["question_id"]: r["final_answer"] for r in rows}


def _stored_batches(path: Path) -> int:
    if not path.exists():
        return 0
    with sqlite3.connect(path) as c:
        try:
            return int(c.execute("SELECT COUNT(*) FROM batches").fetchone()[0])
        except sqlite3.OperationalError:
            return 0


def test_kill_9_while_polling_then_resume_submits_nothing_twice(tmp_path: Path) -> None:
    n = 6
    scripted = [{"match": f"Question {i}:", "model": CONDUCTOR, "reply": f"Plan.\n{WORKFLOWS[i % 3]}"} for i in range(n)]
    emu = Emulator(EmulatorConfig(scripted=scripted, batch_delay_s=8.0)).start()
    try:
        q = tmp_path / "q.jsonl"
        q.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Question {i}: what is {i} * 7?",
                                         "answer": str(i * 7)}) + "\n" for i in range(n)))
        env = _env(emu, tmp_path)
        sync = subprocess.run(_cmd(emu, q, tmp_path / "sync"), cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=600)
        assert sync.returncode == 0, (sync.stderr or sync.stdout)[-2000:]
        emu.reset()

        out = tmp_path / "batch"
        store = out / "cache.batches.sqlite"
        cmd = _cmd(emu, q, out, "--batch", "--batch-poll", "0.2")
        first = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and first.poll() is None:
                created = emu.batches()
                polled = sum(v for k, v in emu.stats().items() if k.endswith("_batch:retrieve"))
                if len(created) == 3 and _stored_batches(store) == 3 and polled >= 3:
                    break
                time.sleep(0.05)
            assert first.poll() is None, "the batch run ended before it could be killed"
            os.killpg(first.pid, signal.SIGKILL)        # the run and everything it started, mid-poll
            first.wait(30)
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
        before = emu.batches()
        assert len(before) == 3 and all(b["status"] == "in_progress" for b in before)
        assert not (out / "answers.jsonl").exists()

        resumed = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert resumed.returncode == 0, (resumed.stderr or resumed.stdout)[-2000:]
        after = emu.batches()
    finally:
        emu.stop()
    submitted = [cid for b in after for cid in b["custom_ids"]]
    assert len(submitted) == len(set(submitted)), "a request was submitted twice"
    assert [b["id"] for b in after[:3]] == [b["id"] for b in before]      # the resumed run polled the same batches
    assert len(after) > 3                                                 # and went on with the next waves
    assert _answers(out) == _answers(tmp_path / "sync")
    s_sum = json.loads((tmp_path / "sync" / "summary.json").read_text())
    b_sum = json.loads((out / "summary.json").read_text())
    assert b_sum["infra_failures"] == 0 and b_sum["calls_per_question"] == s_sum["calls_per_question"]
    assert 0.3 * s_sum["dollars_per_question"] < b_sum["dollars_per_question"] < 0.75 * s_sum["dollars_per_question"]
    for f in out.rglob("*"):                  # keys never reach the batch store, the cache, the lake or the report
        if f.is_file():
            data = f.read_bytes()
            assert not any(k.encode() in data for k in KEYS.values()), f
