"""The main job with the paper's pool file calls the real providers: `conductor answer --pool
data/pools/paper.yaml`, unchanged, in a real subprocess, with the three vendors' official SDKs and the
vLLM-served open models all pointed at the local emulator by the SDKs' own base-URL environment variables
(OPENAI_BASE_URL, ANTHROPIC_BASE_URL, GOOGLE_GEMINI_BASE_URL) and the manifest's $VLLM_BASE_URL.

The conductor is an OpenAI-compatible endpoint (the emulator again, scripted to write one workflow that uses
GPT-5, Gemini 2.5 Pro, Claude Sonnet 4 and R1-Distill in turn), so every provider path runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conductor.testing.emulator import Emulator, EmulatorConfig

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ('Solve, check, verify, then answer.\n'
            'model_id = [0, 1, 2, 3]\n'
            'subtasks = ["Solve the problem.", "Check the solution above.", "Verify both.", '
            '"Give the final answer as a number."]\n'
            'access_list = [[], ["all"], ["all"], ["all"]]')
KEYS = {"OPENAI_API_KEY": "sk-test-paper-openai-0000", "ANTHROPIC_API_KEY": "sk-ant-test-paper-0000",
        "GEMINI_API_KEY": "test-paper-gemini-0000", "VLLM_API_KEY": "test-paper-vllm-0000"}


def test_answer_with_the_paper_pool_drives_every_provider_sdk(tmp_path):
    emu = Emulator(EmulatorConfig(scripted=[{"match": "You are a conductor", "reply": WORKFLOW}])).start()
    try:
        q = tmp_path / "q.jsonl"
        q.write_text(json.dumps({"id": "q1", "question": "What is 6 * 7?", "answer": "42"}) + "\n")
        env = {**os.environ, **KEYS, "PREFECT_HOME": str(tmp_path / "prefect"),
               "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
               "OPENAI_BASE_URL": f"{emu.base_url}/v1", "ANTHROPIC_BASE_URL": emu.base_url,
               "GOOGLE_GEMINI_BASE_URL": emu.base_url, "VLLM_BASE_URL": f"{emu.base_url}/v1"}
        out = tmp_path / "out"
        proc = subprocess.run(
            [sys.executable, "-m", "conductor.cli", "answer", str(q), "--out", str(out),
             "--pool", str(ROOT / "data" / "pools" / "paper.yaml"),
             "--conductor", f"openai:conductor-under-test@{emu.base_url}/v1"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (proc.stderr or proc.stdout)[-2000:]
        stats = emu.state.counts
    finally:
        emu.stop()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["questions"] == 1 and summary["parse_failures"] == 0 and summary["infra_failures"] == 0
    assert summary["calls_per_question"] == 4
    assert summary["dollars_per_question"] > 0          # priced from the manifest's price table
    # one conductor call + GPT-5 + R1-Distill on the OpenAI wire format; Gemini and Claude on theirs
    assert stats["openai"] == 3 and stats["gemini"] == 1 and stats["anthropic"] == 1, dict(stats)
    row = json.loads((out / "answers.jsonl").read_text().splitlines()[0])
    assert row["question_id"] == "q1" and row["final_answer"].startswith("reply from deepseek-ai/DeepSeek-R1")
    for f in out.rglob("*"):                            # keys never reach the lake, answers, report or cache
        if f.is_file():
            data = f.read_bytes()
            assert not any(k.encode() in data for k in KEYS.values()), f
