"""Secrets never reach the terminal, Prefect's database or a printed URL (issues #17, #39).

A key sent to the conductor's endpoint never reaches the terminal or Prefect's database.

The conductor is the OpenAI SDK against the loopback emulator, which answers a wrong key with a 401 whose
body echoes the key (as real APIs partly do). The key does not look like a key (no ``sk-`` shape), so
only value-based redaction can catch it. Before the fix the 401 was printed unredacted on stderr and
stored in Prefect's database, and the run failed with a traceback.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from conductor.testing.emulator import Emulator, EmulatorConfig
from tests.cli_checks import run

ROOT = Path(__file__).resolve().parent.parent
SIM_POOL = str(ROOT / "data/pools/simulated.yaml")
SECRET = "adv-secret-Zq81xK4mP0wq"


def test_conductor_endpoint_401_echoing_the_key_is_redacted_everywhere(tmp_path):
    emu = Emulator(EmulatorConfig(api_key="the-right-key-123456")).start()
    try:
        q = tmp_path / "q.jsonl"
        q.write_text('{"id": "a", "question": "What is 1+1?", "answer": "2"}\n', encoding="utf-8")
        home = tmp_path / "prefect-home"
        env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
               "PREFECT_LOGGING_LEVEL": "INFO", "CONDUCTOR_ADV_CONDUCTOR_KEY": SECRET}
        env.pop("PREFECT_API_URL", None)
        spec = f"openai:conductor-model@{emu.base_url}/v1#CONDUCTOR_ADV_CONDUCTOR_KEY"
        r = subprocess.run([sys.executable, "-m", "conductor", "answer", str(q), "--out", str(tmp_path / "out"),
                            "--pool", SIM_POOL, "--conductor", spec],
                           capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)
        assert emu.stats().get("openai:401", 0) >= 1          # the endpoint did refuse the key
    finally:
        emu.stop()
    assert SECRET not in r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert r.returncode == 3, r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "401" in errors[0] and "[REDACTED]" in errors[0]

    stored = b"".join(p.read_bytes() for p in home.rglob("*") if p.is_file() and ".db" in p.name)
    assert stored, "Prefect stored nothing"
    assert b"REDACTED" in stored            # the failure was logged to the database ...
    assert SECRET.encode() not in stored    # ... without the key
    for p in (tmp_path / "out").rglob("*"):
        if p.is_file():
            assert SECRET.encode() not in p.read_bytes(), p


def test_redacting_filter_scrubs_tracebacks_on_every_prefect_handler(monkeypatch):
    from conductor.workers.secrets import get_key, redact_prefect_logs

    monkeypatch.setenv("CONDUCTOR_ADV_FILTER_KEY", SECRET)
    get_key("CONDUCTOR_ADV_FILTER_KEY")
    seen: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(logging.Formatter().format(record))

    handler = Capture()
    logger = logging.getLogger("prefect.task_runs")
    logger.addHandler(handler)
    try:
        redact_prefect_logs()
        try:
            raise RuntimeError(f"401 body: Incorrect API key provided: {SECRET}")
        except RuntimeError:
            logging.getLogger("prefect.task_runs.child").exception("task failed with %s", SECRET)
    finally:
        logger.removeHandler(handler)
    assert seen and all(SECRET not in s for s in seen) and "[REDACTED]" in seen[0]


def test_a_key_pasted_into_the_conductor_spec_is_refused_without_echoing_it(tmp_path):
    q = tmp_path / "q.jsonl"
    q.write_text('{"id": "a", "question": "What is 1+1?", "answer": "2"}\n', encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "conductor", "answer", str(q), "--out", str(tmp_path / "out"),
                        "--pool", SIM_POOL, "--conductor", f"openai:m@http://127.0.0.1:9/v1#{SECRET}"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    assert r.returncode == 2 and SECRET not in r.stdout + r.stderr
    assert r.stderr.startswith("error: --conductor:") and "NAME of the environment variable" in r.stderr


def test_7_secrets_in_urls_are_masked(tmp_path, monkeypatch):
    monkeypatch.setenv("R3_API_KEY", "k3y-value-0123456789")
    pool = tmp_path / "p.yaml"
    pool.write_text("pool_id: p\nworkers:\n"
                    "  - {name: a, provider: openai_compatible, model: m, base_url: 'http://h/v1?api-key=${R3_API_KEY}'}\n"
                    "  - {name: b, provider: openai_compatible, model: m, base_url: 'http://user:pa55word-xyz@h/v1'}\n")
    r = run("pool", "show", str(pool))
    assert r.exit_code == 0, r.output
    assert "k3y-value-0123456789" not in r.stdout and "pa55word-xyz" not in r.stdout
    assert "http://h/v1?api-key=[REDACTED]" in r.stdout
    from conductor.policy.spec import parse_conductor_spec
    from conductor.run.runtime import checkpoint_of

    ckpt = checkpoint_of(parse_conductor_spec("openai:m@http://u:SECRET-pass@host/v1#VAR"))
    assert "SECRET-pass" not in ckpt and ckpt == "openai:m@http://[REDACTED]@host/v1#VAR"


_KEYISH = st.sampled_from(["sk-", "sk-ant-", "sk-proj-", "AIza", "hf_", "bearer ", "Bearer\t", "BEARER  ", "bEaReR ",
                           "abcdefghijklmnopqrstuvwxyz0123456789_-", "ABCDEFGHIJ", ".", " ", "\n", "sk", "AIz", "hf",
                           "beare", "ſ", "K", "İ"])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(_KEYISH, st.text(max_size=12)), max_size=24).map("".join))
def test_redact_with_its_substring_prefilter_equals_the_full_pattern_scan(text):
    """``redact`` skips the regex when no key prefix occurs; that shortcut must never change what it returns."""
    from conductor.workers.secrets import _PATTERNS, REDACTED, redact

    assert redact(text) == _PATTERNS.sub(REDACTED, text)
