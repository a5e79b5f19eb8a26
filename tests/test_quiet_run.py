"""Issue #37, item 7: a successful run prints no error line and no traceback.

Before the fix, every shard after the first printed ``Task exception was never retrieved ... AsyncClient.aclose()
... RuntimeError: Event loop is closed`` with a traceback: the executor drops its SDK clients when a shard's
``asyncio.run`` ends, and the SDKs' ``__del__`` then closed them on the next shard's loop. Now each provider
closes its client on the loop that used it, before ``asyncio.run`` closes that loop
(``conductor.workers.providers.shared.LoopBoundClose``). Both tests drive the real openai, anthropic and
google-genai clients against the loopback emulator.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conductor.execution.executor import Executor
from conductor.trajectory import CallRecord
from conductor.workers.providers.base import Message
from tests.fixtures_emulator import FAKE_KEYS, emu, emulator, worker  # noqa: F401 - pytest fixtures

ROOT = Path(__file__).resolve().parent.parent
NOISE = ("Error", "Traceback", "Task exception")


@pytest.mark.parametrize("provider", ["openai", "anthropic", "google"])
def test_sdk_clients_are_closed_on_their_own_loop(emu, provider, caplog):
    w = worker(emu, f"w-{provider}", provider)
    ex = Executor()
    clients = []

    async def one_shard() -> None:
        rec = CallRecord("c", None, 0, 0, 0, w.name, provider, w.model, "s")
        await ex.call(w, [Message("user", "What is 6 * 7?")], rec)
        clients.append(ex.provider(w))
        gc.collect()          # the previous shard's dropped client is collected while this loop runs

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        for _ in range(3):    # one asyncio.run per shard, as the pipeline's execute stage does
            asyncio.run(one_shard())
        gc.collect()
    assert len({id(c) for c in clients}) == 3          # a fresh provider per loop
    assert all(c.closing.closed for c in clients)      # each closed before its loop closed
    assert not [r for r in caplog.records if r.name == "asyncio"], [r.getMessage() for r in caplog.records]


def test_a_multi_shard_answer_run_prints_no_error_line(tmp_path, emulator):  # noqa: F811 - the fixture
    base = emulator.base_url
    (tmp_path / "pool.yaml").write_text(f"""pool_id: emu
workers:
  - {{name: gpt, provider: openai, model: gpt-x, base_url: "{base}/v1", api_key_env: EMU_OPENAI_KEY}}
  - {{name: claude, provider: anthropic, model: claude-x, base_url: "{base}", api_key_env: EMU_ANTHROPIC_KEY}}
  - {{name: gemini, provider: google, model: gemini-x, base_url: "{base}", api_key_env: EMU_GEMINI_KEY}}
""", encoding="utf-8")
    (tmp_path / "q.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "question": f"What is {i} + 1?",
                                                          "answer": str(i + 1)}) + "\n" for i in range(6)))
    env = {**os.environ, **FAKE_KEYS, "PREFECT_HOME": str(tmp_path / "prefect"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    # Frequent garbage collection makes a dropped client meet a later shard's loop, as it did in the quickstart.
    run = "import gc, sys; gc.set_threshold(100, 2, 2); sys.argv[0] = 'conductor'; from conductor.cli import main; main()"
    r = subprocess.run([sys.executable, "-c", run, "answer", str(tmp_path / "q.jsonl"), "--out", str(tmp_path / "out"),
                        "--pool", str(tmp_path / "pool.yaml"), "--conductor", "moa:0+1+2:0", "--shard-size", "2"],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "3 shards" in r.stderr or "6 trajectories" in r.stdout, r.stdout + r.stderr[-2000:]
    noisy = [ln for ln in r.stderr.splitlines() if any(n in ln for n in NOISE)]
    assert not noisy, "\n".join(noisy[:20])
