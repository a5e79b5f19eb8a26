"""The CLI contracts of the typed core, run as real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "conductor", *args], input=stdin, capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_parse_prints_the_workflow_json():
    r = run("parse", "-", stdin='Plan.\nmodel_id = [1, 0]\nsubtasks = ["a", "b"]\naccess_list = [[], ["all"]]\n')
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"steps": [{"worker": 1, "subtask": "a", "access": []},
                                              {"worker": 0, "subtask": "b", "access": "all"}]}


def test_parse_error_exit_2_one_line(tmp_path):
    f = tmp_path / "out.txt"
    f.write_text("model_id = [0, 9]\nsubtasks = ['a', 'b']\naccess_list = [[], []]")
    r = run("parse", str(f), "--pool", "data/pools/local.yaml")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: model_id: entry 1 is 9")


def test_parse_missing_file_and_bad_pool(tmp_path):
    r = run("parse", str(tmp_path / "nope.txt"))
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "nope.txt" in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("pool_id: x\nworkers: []\n")
    r = run("parse", "-", "--pool", str(bad), stdin="model_id=[0]\nsubtasks=['a']\naccess_list=[[]]")
    assert r.returncode == 2 and "bad.yaml" in r.stderr


def test_pool_validate_and_sample():
    r = run("pool", "validate", "data/pools/paper.yaml", "data/pools/local.yaml")
    assert r.returncode == 0 and r.stdout.count("ok ") == 2
    a = json.loads(run("pool", "sample", "data/pools/paper.yaml", "--k", "3", "--seed", "5").stdout)
    b = json.loads(run("pool", "sample", "data/pools/paper.yaml", "--k", "3", "--seed", "5").stdout)
    assert a == b and [m["ordinal"] for m in a["models"]] == [0, 1, 2]
    r = run("pool", "sample", "data/pools/paper.yaml", "--k", "9")
    assert r.returncode == 2 and r.stderr.startswith("error: ")


def _all_commands():
    import typer.main

    from conductor.cli import app

    def walk(cmd, path):
        yield path
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            yield from walk(sub, path + [name])

    return list(walk(typer.main.get_command(app), []))


def test_every_command_has_help():
    from typer.testing import CliRunner

    from conductor.cli import app

    paths = _all_commands()
    assert ["parse"] in paths and ["pool", "sample"] in paths
    runner = CliRunner()
    for path in paths:
        r = runner.invoke(app, path + ["--help"])
        assert r.exit_code == 0 and "Usage" in r.output, path


def test_import_is_light():
    code = ("import sys, conductor, conductor.parser, conductor.workers.pool, conductor.prompts, conductor.cli; "
            "heavy = [m for m in ('torch', 'vllm', 'prefect', 'transformers') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
