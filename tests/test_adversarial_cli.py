"""Issue #17, items 2, 6 and 7: every CLI mistake is one `error:` line with exit 2 before any work starts;
infrastructure failures exit 3 (all) or 4 (some) with a one-line cause; a killed run leaves no server behind.

All real subprocesses of `python -m conductor`. Each case failed on the code before the fix (a traceback,
exit 0 or 1, a silently clamped value, or a Prefect server left running).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SIM_POOL = str(ROOT / "data/pools/simulated.yaml")


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", **(env or {})}
    return subprocess.run([sys.executable, "-m", "conductor", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env=full_env)


def error_line(r: subprocess.CompletedProcess) -> str:
    """The one `error:` line (Prefect may log around it)."""
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1, r.stderr[-3000:]
    return lines[0]


def assert_one_line_usage_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-2000:]
    assert "Traceback" not in r.stderr + r.stdout
    assert "temporary server" not in r.stderr   # refused before Prefect started
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.fixture()
def qfile(tmp_path) -> Path:
    f = tmp_path / "q.jsonl"
    f.write_text("\n".join(json.dumps({"id": f"q{i}", "question": f"What is {i}+{i}?", "answer": str(2 * i)})
                           for i in range(3)) + "\n", encoding="utf-8")
    return f


def answer_args(qfile: Path, out: Path, *extra: str, pool: str = SIM_POOL) -> list[str]:
    return ["answer", str(qfile), "--out", str(out), "--pool", pool, *extra]


@pytest.mark.parametrize("spec, needle", [
    ("vllm:", "needs a target"),
    ("fixed:abc", "not a worker number"),
    ("fixed:99", "not in the pool"),
    ("transformers:/nonexistent", "does not exist"),
    ("champion", "no champion"),
])
def test_a_bad_conductor_spec_is_one_line_before_anything_starts(tmp_path, qfile, spec, needle):
    (tmp_path / "registry").mkdir()
    r = cli(*answer_args(qfile, tmp_path / "out", "--conductor", spec),
            env={"CONDUCTOR_REGISTRY": str(tmp_path / "registry")})
    assert_one_line_usage_error(r, "--conductor", needle)
    assert not (tmp_path / "out").exists()


def test_bad_answer_options_are_one_line_errors(tmp_path, qfile):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    cases = [
        (["--lake", str(a_file)], "not a directory"),
        (["--fewshot", "bogus"], "--fewshot"),
        (["--run-id", "../../etc"], "--run-id"),
        (["--k", "99"], "--k 99"),
        (["--temperature", "nan"], "--temperature"),
        (["--cache", str(tmp_path)], "--cache"),
    ]
    for extra, needle in cases:
        r = cli(*answer_args(qfile, tmp_path / "out", "--conductor", "fixed:0", *extra))
        assert_one_line_usage_error(r, needle)
    r = cli(*answer_args(qfile, Path("/proc/conductor-adversarial-out"), "--conductor", "fixed:0"))
    assert_one_line_usage_error(r, "--out", "cannot write")


def test_a_question_that_is_not_text_is_refused_naming_file_and_line(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text('{"id": "a", "question": "fine?"}\n{"id": "b", "question": ["a", "b"]}\n', encoding="utf-8")
    r = cli(*answer_args(f, tmp_path / "out", "--conductor", "fixed:0"))
    assert_one_line_usage_error(r, f"{f}:2", "'question'", "list")


@pytest.mark.parametrize("skills, needle", [("{math: banana}", "skills.math"), ("{math: 7.5}", "less than or equal to 1")])
def test_simulated_skills_that_cannot_work_fail_validation(tmp_path, qfile, skills, needle):
    pool = tmp_path / "pool.yaml"
    pool.write_text(f"pool_id: sim\nworkers:\n  - name: s\n    provider: simulated\n    model: s\n"
                    f"    options: {{skills: {skills}}}\n", encoding="utf-8")
    assert_one_line_usage_error(cli("pool", "validate", str(pool)), needle)
    assert_one_line_usage_error(cli(*answer_args(qfile, tmp_path / "out", "--conductor", "fixed:0", pool=str(pool))),
                                needle)


def test_grade_report_registry_and_query_mistakes_are_one_line(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert_one_line_usage_error(cli("grade", "--workers", "-1", str(empty)), "--workers")
    assert_one_line_usage_error(cli("grade", "--timeout", "nan", str(empty)), "--timeout")
    lake = tmp_path / "not-a-lake"
    (lake / "something").mkdir(parents=True)
    assert_one_line_usage_error(cli("query", "SELECT count(*) FROM trajectories", "--lake", str(lake)), "not a lake")
    (lake / "trajectories").mkdir()
    assert_one_line_usage_error(cli("report", "--lake", str(lake), "--out", str(a_file)), "--out")
    assert_one_line_usage_error(cli("registry", "show", "--registry", str(a_file)), "is a file")
    missing = tmp_path / "no" / "registry"
    assert_one_line_usage_error(cli("registry", "rollback", "--registry", str(missing)), "no such registry")
    assert not missing.exists() and not missing.parent.exists()


def test_emulator_on_a_busy_port_is_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = subprocess.run([sys.executable, "-m", "conductor.testing.emulator", "--port", str(s.getsockname()[1])],
                           capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1


def test_a_missing_rollout_question_file_is_one_line_before_prefect_starts(tmp_path):
    r = cli("rollout", str(tmp_path / "missing.jsonl"), "--lake", str(tmp_path / "lake"), "--pool", SIM_POOL,
            "--conductor", "fixed:0", "--run-id", "r1", "--group-size", "1")
    assert_one_line_usage_error(r, "missing.jsonl: no such file")


FLOW_SCRIPT = """
import typer
from prefect import flow
from conductor.cli.boundary import flow_errors
from conductor.workers.pool import PoolError

@flow
def broken():
    raise PoolError("pool.yaml:3: workers.0.model: Field required")

app = typer.Typer()

@app.command()
def main():
    with flow_errors():
        broken()

app()
"""


def test_an_error_raised_inside_a_flow_is_one_line(tmp_path):
    """A project error raised inside a real Prefect flow reaches the terminal as one line, exit 2."""
    script = tmp_path / "run_flow.py"
    script.write_text(FLOW_SCRIPT, encoding="utf-8")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "INFO"})
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr + r.stdout
    assert error_line(r) == "error: pool.yaml:3: workers.0.model: Field required"
    assert "Encountered exception during execution" in r.stderr   # Prefect did run it as a failing flow


def test_a_run_whose_every_call_failed_exits_3_with_the_cause(tmp_path, qfile):
    pool = tmp_path / "pool.yaml"
    pool.write_text("pool_id: nokey\nworkers:\n  - name: gpt\n    provider: openai\n    model: gpt-x\n"
                    "    base_url: http://127.0.0.1:9/v1\n    api_key_env: CONDUCTOR_ADV_MISSING_KEY\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "CONDUCTOR_ADV_MISSING_KEY"}
    r = subprocess.run([sys.executable, "-m", "conductor", *answer_args(qfile, tmp_path / "out", "--conductor", "fixed:0",
                                                                        pool=str(pool))],
                       capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)
    assert r.returncode == 3, r.stderr[-3000:]
    last = error_line(r)
    assert last.startswith("error: 3 of 3 questions failed on infrastructure") and "CONDUCTOR_ADV_MISSING_KEY" in last


def test_a_partly_failed_run_exits_4_and_answers_the_rest(tmp_path):
    """Simulated workers cannot answer a question without a gold answer: that call fails (provider error)."""
    f = tmp_path / "q.jsonl"
    f.write_text('{"id": "a", "question": "What is 1+1?", "answer": "2"}\n{"id": "b", "question": "What is 2+2?"}\n',
                 encoding="utf-8")
    r = cli(*answer_args(f, tmp_path / "out", "--conductor", "fixed:0"), timeout=600)
    assert r.returncode == 4, r.stderr[-3000:]
    assert error_line(r).startswith("error: 1 of 2 questions failed on infrastructure")
    rows = {json.loads(x)["question_id"]: json.loads(x) for x in (tmp_path / "out/answers.jsonl").read_text().splitlines()}
    assert not rows["a"]["infra_failed"] and rows["b"]["infra_failed"]


def test_kill_9_of_a_run_stops_its_prefect_server(tmp_path, qfile):
    psutil = pytest.importorskip("psutil")
    pool = tmp_path / "slow.yaml"
    pool.write_text("pool_id: slow\nworkers:\n  - name: s\n    provider: simulated\n    model: s\n"
                    "    limits: {timeout_s: 600}\n    options: {skills: {default: 1.0}, latency_s: 300}\n", encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-m", "conductor", *answer_args(qfile, tmp_path / "out", "--conductor",
                                                                             "fixed:0", pool=str(pool))],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    servers: list = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not servers:
            time.sleep(1)
            servers = [c for c in psutil.Process(proc.pid).children(recursive=True)
                       if "uvicorn" in " ".join(c.cmdline())]
        assert servers, "the run never started its Prefect server"
        time.sleep(3)   # the watcher polls once a second
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        gone, alive = psutil.wait_procs(servers, timeout=30)
        assert not alive, f"Prefect server still running after kill -9: {[p.pid for p in alive]}"
    finally:
        for p in servers:
            try:
                p.kill()
            except psutil.Error:
                pass
        if proc.poll() is None:
            proc.kill()
