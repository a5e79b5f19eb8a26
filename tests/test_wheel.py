"""The built wheel works outside the checkout: built offline from a copy of the sources, installed with
``--no-deps`` into a fresh venv (dependencies from the shared environment), and run from an empty directory with
no PYTHONPATH. It carries the pool manifests, the few-shot files and the Prefect project, every subpackage of
``conductor/``, and no top-level ``flows`` or ``tasks`` package."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("conductor", "flows", "tasks", "data", "pyproject.toml", "setup.py", "README.md")


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, (cmd, p.stdout[-2000:], p.stderr[-3000:])
    return p


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path, dict[str, str]]:
    """(wheel, venv, environment to run it in); the sources are copied so the build leaves the checkout alone."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp / "dist"),
          str(src)], tmp, env)
    [wheel] = (tmp / "dist").glob("*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], tmp, env)
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], tmp, env)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    work = tmp / "elsewhere"
    work.mkdir()
    return wheel, venv, {**env, "PWD": str(work)}


def test_the_wheel_carries_data_and_every_package_and_no_generic_top_level_names(installed):
    wheel, _, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in [*(ROOT / "data").rglob("*.yaml"), *(ROOT / "flows").glob("*.py"), *(ROOT / "tasks").glob("*.py")]:
        assert f"conductor/_project/{f.relative_to(ROOT)}" in names, f
    for init in (ROOT / "conductor").rglob("__init__.py"):     # every subpackage, found by setup.py
        assert str(init.relative_to(ROOT)) in names, init
    assert "conductor/py.typed" in names
    assert not {n.split("/")[0] for n in names} & {"flows", "tasks", "data"}
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    assert "Name: conductor-orchestra" in zipfile.ZipFile(wheel).read(meta).decode()


def test_every_command_runs_from_the_wheel_outside_the_checkout(installed):
    _, venv, env = installed
    work = Path(env["PWD"])
    py = str(venv / "bin" / "python")
    site = venv / "lib"

    where = json.loads(_run([py, "-c", "import json, conductor; from conductor.resources import data_path; "
                                       "print(json.dumps([conductor.__file__, str(data_path('pools', 'simulated.yaml'))]))"],
                            work, env).stdout)
    assert Path(where[0]).is_relative_to(site) and Path(where[1]).is_relative_to(site)
    sim_pool = where[1]
    # the Prefect project is importable once the CLI put it on the path, from the installed copy
    flows_file = _run([py, "-c", "import conductor.cli, flows.answer, tasks.pipeline; print(flows.answer.__file__)"],
                      work, env).stdout.strip()
    assert Path(flows_file).is_relative_to(site)
    # not a site-packages name: the wheel installs no top-level flows (an unrelated editable install in the shared
    # environment may still provide one, never from the venv)
    bare = _run([py, "-c", "import importlib.util as u; s = u.find_spec('flows'); print(s.origin if s else '')"],
                work, env).stdout.strip()
    assert not bare or not Path(bare).resolve().is_relative_to(venv.resolve()), bare

    prompt = _run(["conductor", "prompt", "What is 2+2?"], work, env).stdout     # default pool and few-shot files
    assert "You are a conductor" in prompt and "What is 2+2?" in prompt
    _run(["conductor", "prompt", "What is 2+2?", "--fewshot", "in_domain:1"], work, env)
    assert _run(["conductor", "pool", "validate", sim_pool], work, env).stdout.startswith("ok ")
    sample = json.loads(_run(["conductor", "pool", "sample", sim_pool, "--k", "2", "--seed", "1"], work, env).stdout)
    assert sample["pool"] == "simulated-4@v1" and len(sample["models"]) == 2
    assert "deployments:" in _run(["conductor", "deploy", "yaml"], work, env).stdout

    (work / "q.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "question": f"What is {i} + {i}?",
                                                      "answer": str(2 * i)}) + "\n" for i in (1, 2)))
    _run(["conductor", "answer", "q.jsonl", "--out", "out", "--pool", sim_pool, "--conductor", "fixed:0"], work, env)
    answers = [json.loads(line) for line in (work / "out" / "answers.jsonl").read_text().splitlines()]
    assert sorted(a["question_id"] for a in answers) == ["q1", "q2"] and all(a["parse_status"] == "ok" for a in answers)
    assert (work / "out" / "lake").is_dir() and (work / "out" / "summary.json").is_file()
