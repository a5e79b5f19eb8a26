"""Deployments for real: a long-lived local Prefect server (infra/prefect-server.sh), the scheduled-answering
deployment run by `python -m flows.deploy`, a schedule firing and its run completing; an answer run killed
with SIGKILL mid-way resuming without duplicate rows or lost shards; the shipped infra files staying valid.

The flows run the smallest real model (SmolLM2-135M, transformers backend) as the conductor over the
SIMULATED worker pool (data/pools/simulated.yaml), on 1-4 questions with short completions.
"""

from __future__ import annotations

import doctest
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "infra" / "prefect-server.sh"
SIM_POOL = str(ROOT / "data" / "pools" / "simulated.yaml")

QUESTIONS = [
    {"id": "d1", "question": "What is 2 + 3? Give the number in <answer></answer> tags.", "answer": "5"},
    {"id": "d2", "question": "What is 4 * 5? Give the number in <answer></answer> tags.", "answer": "20"},
    {"id": "d3", "question": "What is 9 - 7? Give the number in <answer></answer> tags.", "answer": "2"},
    {"id": "d4", "question": "What is 12 / 4? Give the number in <answer></answer> tags.", "answer": "3"},
]


# ---------------------------------------------------------------- helpers

def _clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without Conductor deployment settings (so defaults are what we test)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONDUCTOR_") or k in ("CONDUCTOR_HOME",)}
    env.pop("PREFECT_API_URL", None)
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    env.update(extra)
    return env


def _smallest_model_spec() -> str:
    """The smallest real model as the conductor (transformers backend, GGUF loaded directly)."""
    from conductor.local.embedded import EmbeddedError, model_path

    try:
        return f"transformers:{model_path('smollm2-135m-instruct')}"
    except EmbeddedError as e:
        pytest.skip(str(e))


def _conductor(which: str) -> str:
    """``fixed:0`` (the fixed-workflow baseline policy: the whole pipeline, no model) or the smallest real model.

    The real model is the slow variant: on the shared 2-core machine one SmolLM2 conductor generation took
    minutes under load, so the default suite deploys the same flow with the fixed-workflow policy.
    """
    return "fixed:0" if which == "fixed" else _smallest_model_spec()


def _slow_pool(path: Path, latency_s: float) -> str:
    """The simulated pool with a fixed latency per worker call, so a shard takes a known minimum time."""
    doc = yaml.safe_load(Path(SIM_POOL).read_text())
    for w in doc["workers"]:
        w["options"]["latency_s"] = latency_s
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _write_questions(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS[:n]))
    return path


def _stop_group(proc: subprocess.Popen, sig: int = signal.SIGTERM, wait: float = 30) -> None:
    """End a process we started in its own session, and its children, by its id."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _flow_runs(api_url: str, home: Path, deployment_name: str) -> list[dict]:
    """Flow runs of one deployment, read through the Prefect client (a subprocess: its own settings)."""
    code = f"""
import anyio, json
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName
from prefect.client.schemas.sorting import DeploymentSort, FlowRunSort
async def main():
    async with get_client() as c:
        runs = await c.read_flow_runs(deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[{deployment_name!r}])),
                                      sort=FlowRunSort.EXPECTED_START_TIME_ASC, limit=50)
        deps = await c.read_deployments(sort=DeploymentSort.NAME_ASC, limit=50)
        print(json.dumps({{"runs": [{{"id": str(r.id), "state": r.state_type.value if r.state_type else None,
                                      "auto_scheduled": r.auto_scheduled, "parameters": r.parameters}} for r in runs],
                          "deployments": [{{"name": d.name, "schedules": [str(s.schedule) for s in d.schedules]}}
                                          for d in deps]}}))
anyio.run(main)
"""
    out = subprocess.run([sys.executable, "-c", code], env=_clean_env(PREFECT_API_URL=api_url, PREFECT_HOME=str(home)),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _lake_frame(lake: Path, kind: str = "answer"):
    import pyarrow.dataset as ds

    files = sorted(p for p in (lake / "trajectories").rglob("*.parquet") if not p.name.startswith("."))
    table = ds.dataset([str(p) for p in files], format="parquet").to_table(columns=["trajectory_id", "question_id", "shard"])
    return files, table.to_pylist()


# ---------------------------------------------------------------- the long-lived server

@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory):
    """A real Prefect server started by infra/prefect-server.sh on a free loopback port; stopped afterwards."""
    state = tmp_path_factory.mktemp("prefect-server")
    env = _clean_env(PREFECT_SERVER_UI_ENABLED="false")   # the API only: faster start, nothing to serve
    out = subprocess.run(["bash", str(SCRIPT), "start", str(state), "auto"], env=env, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr + (state / "server.log").read_text()[-3000:]
    url = out.stdout.strip()
    assert url.startswith("http://127.0.0.1:") and url.endswith("/api"), url
    pid = int((state / "server.pid").read_text())
    yield {"url": url, "dir": state, "env": env, "pid": pid}
    subprocess.run(["bash", str(SCRIPT), "stop", str(state)], env=env, timeout=60, check=True)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_server_script_is_idempotent_and_reports_status(prefect_server):
    state, env = prefect_server["dir"], prefect_server["env"]
    t0 = time.monotonic()
    again = subprocess.run(["bash", str(SCRIPT), "start", str(state), "auto"], env=env, capture_output=True, text=True,
                           timeout=60)
    assert again.returncode == 0 and again.stdout.strip() == prefect_server["url"]
    assert time.monotonic() - t0 < 10, "a second start must find the running server, not start another"
    assert int((state / "server.pid").read_text()) == prefect_server["pid"]
    status = subprocess.run(["bash", str(SCRIPT), "status", str(state)], env=env, capture_output=True, text=True)
    assert status.returncode == 0 and status.stdout.strip() == prefect_server["url"]
    assert (state / "prefect.db").is_file(), "the server's SQLite database lives under its own directory"
    import httpx

    assert httpx.get(prefect_server["url"] + "/health", timeout=10).json() is True
    bad = subprocess.run(["bash", str(SCRIPT), "start", str(state / "other"), "notaport"], env=env,
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and bad.stderr.startswith("error: port must be")


def _serve_until_completed(server: dict, tmp_path: Path, name: str, params: dict, timeout: float) -> dict:
    """Serve one deployment with a 15 s interval schedule until the scheduler's first run completes.

    The deployment is registered by ``python -m flows.deploy``; the server's scheduler service creates the
    run from the schedule; the serving process picks it up (polling every 2 s) and runs it as a subprocess.
    """
    client_home = tmp_path / f"client-{name}"
    log = tmp_path / f"serve-{name}.log"
    env = _clean_env(PREFECT_API_URL=server["url"], PREFECT_HOME=str(client_home),
                     PREFECT_RUNNER_POLL_FREQUENCY="2", CONDUCTOR_REGISTRY=str(tmp_path / "registry"),
                     PREFECT_LOGGING_LEVEL="INFO")   # flow logs in the serve log, for failure messages
    argv = [sys.executable, "-m", "flows.deploy", "--only", name, "--interval", f"{name}=15"]
    for key, value in params.items():
        argv += ["--param", f"{name}.{key}={value if isinstance(value, str) else json.dumps(value)}"]
    serve = subprocess.Popen(argv, cwd=str(ROOT), env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        completed = None
        while time.monotonic() < deadline and completed is None:
            assert serve.poll() is None, log.read_text()[-3000:]
            info = _flow_runs(server["url"], client_home, name)
            failed = [r for r in info["runs"] if r["state"] in ("FAILED", "CRASHED")]
            assert not failed, f"{failed}\n{log.read_text()[-4000:]}"
            completed = next((r for r in info["runs"] if r["state"] == "COMPLETED"), None)
            if completed is None:
                time.sleep(3)
        assert completed is not None, f"no scheduled run of {name} completed in {timeout:.0f}s\n" + log.read_text()[-4000:]
    finally:
        _stop_group(serve)
    assert completed["auto_scheduled"], "the run must come from the deployment's schedule, not a manual trigger"
    dep = next(d for d in info["deployments"] if d["name"] == name)
    assert any("interval" in sched for sched in dep["schedules"]), dep
    return completed


@pytest.mark.parametrize("which", ["fixed", pytest.param("smollm2", marks=pytest.mark.slow)])
def test_scheduled_answering_deployment_fires_and_completes(prefect_server, tmp_path, which):
    """The scheduled-answering deployment, served, fires from its schedule and answers into a dated directory."""
    spec = _conductor(which)
    questions = _write_questions(tmp_path / "questions.jsonl", 2)
    out_root = tmp_path / "answers"
    run = _serve_until_completed(prefect_server, tmp_path, "scheduled-answering", {
        "questions": str(questions), "out_root": str(out_root), "pool": SIM_POOL, "conductor": spec,
        "max_tokens": 64, "shard_size": 1}, timeout=170 if which == "fixed" else 900)
    assert run["parameters"]["config"]["conductor"] == spec   # the flow takes its config model (#50)
    dated = [p for p in out_root.iterdir() if p.is_dir()]
    assert len(dated) >= 1, "scheduled answering writes under OUT_ROOT/<scheduled date>/"
    answers = [json.loads(line) for line in (dated[0] / "answers.jsonl").read_text().splitlines()]
    assert sorted(a.get("question_id", a.get("id")) for a in answers) == ["d1", "d2"]
    files, rows = _lake_frame(dated[0] / "lake")
    assert len(files) == 2 and len(rows) == 2


@pytest.mark.slow
def test_scheduled_nightly_deployment_completes_a_tiny_night(prefect_server, tmp_path):
    """The nightly-retraining deployment, served, fires from its schedule and runs a tiny night end to end:
    1 iteration of rollouts (2 questions x 2 samples) -> GRPO step -> evaluation -> promotion decision."""
    base = _smallest_model_spec().partition(":")[2]
    train = _write_questions(tmp_path / "train.jsonl", 2)
    held = tmp_path / "eval.jsonl"
    held.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS[2:4]))
    work = tmp_path / "night"
    _serve_until_completed(prefect_server, tmp_path, "nightly-retraining", {
        "pool": SIM_POOL, "train_questions": str(train), "eval_questions": str(held), "work_dir": str(work),
        "base": base, "registry": str(tmp_path / "registry"), "night": "t1", "iterations": 1,
        "questions_per_iteration": 2, "group_size": 2, "eval_samples": 1, "max_tokens": 48, "shard_size": 2,
        "baselines": False, "grpo": {"micro_batch_size": 2, "total_iterations": 1, "max_completion_tokens": 48,
                                     "save_optimizer": False}}, timeout=900)
    assert list((work / "reports" / "t1").rglob("*.md")), "the night writes its report"
    assert (work / "checkpoints" / "nightly-t1-it0" / "lineage.json").is_file()
    import pyarrow.dataset as ds

    kinds = set(ds.dataset(str(work / "lake" / "trajectories"), format="parquet", partitioning="hive")
                .to_table(columns=["kind"]).column("kind").to_pylist())
    assert {"rollout", "eval"} <= kinds


def test_provider_key_from_a_secret_block_reaches_the_environment_only(prefect_server, tmp_path):
    """Keys live in Prefect Secret blocks (rotation = overwrite the block); a run exports them to its env."""
    code = """
import os, sys
from prefect.blocks.system import Secret
from flows.secret_env import export_secret_blocks
from conductor.workers.secrets import redact
Secret(value="sk-rotated-000000000000000000").save("conductor-test-key", overwrite=True)
assert export_secret_blocks({"CONDUCTOR_TEST_PROVIDER_KEY": "conductor-test-key"}) == ["CONDUCTOR_TEST_PROVIDER_KEY"]
assert os.environ["CONDUCTOR_TEST_PROVIDER_KEY"] == "sk-rotated-000000000000000000"
assert redact("echo sk-rotated-000000000000000000") == "echo [REDACTED]"
try:
    export_secret_blocks({"OTHER_KEY": "no-such-block"})
except ValueError as e:
    print("ERR", e)
"""
    env = _clean_env(PREFECT_API_URL=prefect_server["url"], PREFECT_HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-3000:]
    err = out.stdout.strip().splitlines()[-1]
    assert err.startswith("ERR secret block 'no-such-block' for OTHER_KEY:") and "sk-" not in err


# ---------------------------------------------------------------- resume after SIGKILL

def test_killed_answer_run_resumes_without_duplicates(prefect_server, tmp_path):
    questions = _write_questions(tmp_path / "questions.jsonl", 4)
    pool = _slow_pool(tmp_path / "slow-pool.yaml", latency_s=2.0)   # every shard takes >= 2 s
    out = tmp_path / "run"
    env = _clean_env(PREFECT_API_URL=prefect_server["url"], PREFECT_HOME=str(tmp_path / "client-home"),
                     CONDUCTOR_REGISTRY=str(tmp_path / "registry"))
    cmd = [sys.executable, "-m", "flows.answer", str(questions), "--out", str(out), "--pool", pool,
           "--conductor", "fixed:0", "--shard-size", "1"]
    first = subprocess.Popen(cmd, cwd=str(ROOT), env=env, stdout=open(tmp_path / "first.log", "w"),
                             stderr=subprocess.STDOUT, start_new_session=True)
    traj_dir = out / "lake" / "trajectories"
    try:
        deadline = time.monotonic() + 150
        committed: list[Path] = []
        while time.monotonic() < deadline:
            committed = [p for p in traj_dir.rglob("shard-*.parquet")] if traj_dir.exists() else []
            if committed or first.poll() is not None:
                break
            time.sleep(0.05)
        assert committed, "no shard committed before the deadline\n" + (tmp_path / "first.log").read_text()[-3000:]
    finally:
        _stop_group(first, signal.SIGKILL)
    n_before = len(list(traj_dir.rglob("shard-*.parquet")))
    if n_before == len(QUESTIONS):
        pytest.fail("the first run finished before it could be killed; the resume path was not exercised")
    assert 1 <= n_before < len(QUESTIONS)
    before = {p: p.stat().st_mtime_ns for p in traj_dir.rglob("shard-*.parquet")}

    second = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=170)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in before} == before, "committed shards are skipped, not redone"
    files, rows = _lake_frame(out / "lake")
    ids = [r["trajectory_id"] for r in rows]
    assert len(ids) == len(set(ids)) == len(QUESTIONS), "no duplicate and no missing trajectories"
    assert sorted(r["question_id"] for r in rows) == [q["id"] for q in QUESTIONS]
    assert len(files) == len(QUESTIONS) == len({r["shard"] for r in rows}), "every shard present exactly once"
    import pyarrow.dataset as ds

    calls = ds.dataset(str(out / "lake" / "calls"), format="parquet",
                       exclude_invalid_files=True).to_table(columns=["trajectory_id"]).to_pylist()
    assert {c["trajectory_id"] for c in calls} <= set(ids)
    assert not [p for p in (out / "lake").rglob("*") if p.is_file() and p.name.startswith(".")], "no temp files left"


# ---------------------------------------------------------------- one place for deployments; infra files valid

def test_shipped_prefect_yaml_is_generated_from_flows_deployments():
    from flows.deployments import IMAGE_ENV, deployment_specs, prefect_yaml

    shipped = (ROOT / "infra" / "prefect.yaml").read_text()
    assert shipped == prefect_yaml(deployment_specs(IMAGE_ENV)), "run `conductor deploy yaml --image-env > infra/prefect.yaml`"
    doc = yaml.safe_load(shipped)
    names = {d["name"]: d for d in doc["deployments"]}
    assert set(names) == {"nightly-retraining", "scheduled-answering"}
    for d in names.values():
        path, _, fn = d["entrypoint"].partition(":")
        assert path.startswith("flows/") and fn and d["schedules"][0]["cron"]
    assert (ROOT / names["scheduled-answering"]["entrypoint"].partition(":")[0]).is_file()
    assert names["nightly-retraining"]["work_pool"]["name"] == "conductor-gpu"


def test_overrides_and_environment_reach_the_deployments():
    from flows.deployments import DeploymentConfigError, apply_overrides, deployment_specs, to_runner_deployment

    specs = deployment_specs({"CONDUCTOR_ANSWER_CRON": "15 3 * * 1-5", "CONDUCTOR_POOL": SIM_POOL})
    answer = apply_overrides(specs, only=["scheduled-answering"], params=["scheduled-answering.limit=3"])[0]
    assert answer.cron == "15 3 * * 1-5" and answer.parameters["pool"] == SIM_POOL and answer.parameters["limit"] == 3
    runner = to_runner_deployment(answer)
    # the flow takes its config model (#50): the parameters arrive nested under "config", as nightly's do
    assert runner.name == "scheduled-answering" and runner.parameters["config"]["limit"] == 3
    assert runner.schedules[0].schedule.cron == "15 3 * * 1-5"
    with pytest.raises(DeploymentConfigError, match="parameter 'nope': Extra inputs are not permitted"):
        to_runner_deployment(apply_overrides(specs, params=["scheduled-answering.nope=1"])[1])
    nightly = to_runner_deployment(specs[0])   # the shipped defaults satisfy nightly_flow's signature
    assert nightly.name == "nightly-retraining" and nightly.schedules[0].schedule.cron == "0 2 * * *"
    assert {"pool", "train_questions", "eval_questions", "work_dir", "base", "registry"} <= set(nightly.parameters["config"])
    with pytest.raises(DeploymentConfigError, match="parameter 'iterations': Input should be greater than or equal to 1"):
        to_runner_deployment(apply_overrides(specs, params=["nightly-retraining.iterations=0"])[0])
    with pytest.raises(DeploymentConfigError, match="parameter 'nope': Extra inputs are not permitted"):
        to_runner_deployment(apply_overrides(specs, params=["nightly-retraining.nope=1"])[0])
    with pytest.raises(DeploymentConfigError, match="seconds must be > 0"):
        apply_overrides(specs, interval=["scheduled-answering=0"])


def test_cli_and_serve_fail_with_one_line_errors(tmp_path):
    env = _clean_env(PREFECT_HOME=str(tmp_path))
    bad = subprocess.run([sys.executable, "-m", "conductor", "deploy", "list", "--cron", "nope=* * * * *"],
                         cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip() == \
        "error: --cron nope=* * * * *: unknown deployment 'nope' (known: nightly-retraining, scheduled-answering)"
    listed = subprocess.run([sys.executable, "-m", "conductor", "deploy", "list"], cwd=str(ROOT), env=env,
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [r["name"] for r in rows] == ["nightly-retraining", "scheduled-answering"]
    no_api = subprocess.run([sys.executable, "-m", "flows.deploy"], cwd=str(ROOT), env=env, capture_output=True,
                            text=True, timeout=60)
    assert no_api.returncode == 2 and no_api.stderr.startswith("error: PREFECT_API_URL is not set")


def test_deploy_start_runs_the_deployments_and_serve_means_the_http_server_only(tmp_path):
    """`conductor deploy start` is `python -m flows.deploy` (the Prefect deployments, #50); `serve` is only
    `conductor serve`, the HTTP server: neither the deploy group nor the flows hold a `serve` any more."""
    env = _clean_env(PREFECT_HOME=str(tmp_path))
    start = subprocess.run([sys.executable, "-m", "conductor", "deploy", "start", "--only", "scheduled-answering"],
                           cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=60)
    assert start.returncode == 2 and start.stderr.startswith("error: PREFECT_API_URL is not set"), start.stderr
    old = subprocess.run([sys.executable, "-m", "conductor", "deploy", "serve"], cwd=str(ROOT), env=env,
                         capture_output=True, text=True, timeout=60)
    assert old.returncode == 2 and "No such command 'serve'" in old.stderr
    assert not (ROOT / "flows" / "serve.py").exists()


def test_compose_file_is_valid_and_wires_the_server():
    doc = yaml.safe_load((ROOT / "infra" / "compose.yaml").read_text())
    services = doc["services"]
    assert {"postgres", "prefect-server", "worker"} <= set(services)
    server = services["prefect-server"]
    assert server["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"].startswith("postgresql+asyncpg://")
    assert server["environment"]["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    assert server["depends_on"]["postgres"]["condition"] == "service_healthy"
    worker = services["worker"]
    assert worker["environment"]["PREFECT_API_URL"] == "http://prefect-server:4200/api"
    mounts = {v.split(":")[1] for v in worker["volumes"]}
    assert {"/var/lib/conductor/lake", "/var/lib/conductor/registry"} <= mounts
    assert set(doc["volumes"]) >= {"lake", "registry", "postgres"}
    assert "--pool" in worker["entrypoint"] and "conductor-cpu" in worker["entrypoint"]
    for dockerfile in ("Dockerfile.cpu", "Dockerfile.gpu"):
        text = (ROOT / "infra" / dockerfile).read_text()
        assert 'ENTRYPOINT ["conductor"]' in text and "torch==2.13.0" in text and "requirements.lock" in text
    for manifest in (ROOT / "infra" / "dask").glob("*.yaml"):
        assert yaml.safe_load(manifest.read_text())["kind"] == "DaskCluster"


@pytest.mark.parametrize("module", ["flows.deployments", "flows.scheduled_answer"])
def test_doctests_of_deployment_modules(module):
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0
