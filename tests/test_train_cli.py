"""`conductor train-step | eval-compare | registry ...` as real subprocesses over a real Parquet lake."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from conductor.lake import write_shard
from conductor.trajectory import Trajectory, trajectory_id
from grpo_fixtures import rollout, tiny_checkpoint

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    e = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "conductor", *args], capture_output=True, text=True, cwd=ROOT,
                          env=e, timeout=timeout)


def eval_rows(run: str, acc: dict[str, float], seed: int, n_q: int = 60) -> list[Trajectory]:
    rng = random.Random(seed)
    out = []
    for d, p in acc.items():
        for q in range(n_q):
            for s in range(2):
                ok = rng.random() < p
                out.append(Trajectory(trajectory_id(run, f"{d}/{q}", s), run, "eval", f"{d}/{q}", d, d, "?",
                                      sample_index=s, date="2026-11-21", correct=ok, reward=1.0 if ok else 0.5))
    return out


def test_eval_compare_then_promotion_and_rollback_from_the_command_line(tmp_path):
    lake = str(tmp_path / "lake")
    write_shard(lake, eval_rows("ev-champ", {"math": 0.5, "mcq": 0.6}, 1), "00000")
    write_shard(lake, eval_rows("ev-cand", {"math": 0.9, "mcq": 0.75}, 2), "00000")
    write_shard(lake, eval_rows("ev-worse", {"math": 0.3, "mcq": 0.6}, 3), "00000")
    env = {"CONDUCTOR_REGISTRY": str(tmp_path / "reg")}
    for name in ("c0", "c1", "c2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")   # a checkpoint holds a model (issue #39)
        assert cli("registry", "register", str(tmp_path / name), env=env).returncode == 0
    assert cli("registry", "promote", "c0", env=env).stdout.startswith("promoted c0")
    r = cli("eval-compare", "--lake", lake, "--candidate-run", "ev-cand", "--champion-run", "ev-champ",
            "--out", str(tmp_path / "better.json"), "--n-boot", "2000", "--champion-id", "c0")
    assert r.returncode == 0, r.stderr
    assert "McNemar" in r.stdout and "math" in r.stdout
    ok = cli("registry", "promote", "c1", "--report", str(tmp_path / "better.json"), env=env)
    assert ok.returncode == 0 and ok.stdout.startswith("promoted c1"), ok.stderr
    cli("eval-compare", "--lake", lake, "--candidate-run", "ev-worse", "--champion-run", "ev-cand",
        "--out", str(tmp_path / "worse.json"), "--n-boot", "2000", "--champion-id", "c1")
    no = cli("registry", "promote", "c2", "--report", str(tmp_path / "worse.json"), env=env)
    assert no.returncode == 1 and no.stdout.startswith("challenger c2: not better")
    show = json.loads(cli("registry", "show", "--json", env=env).stdout)
    assert show["aliases"] == {"champion": "c1", "challenger": "c2"}
    assert cli("registry", "rollback", env=env).stdout.startswith("champion is now c0")
    bad = cli("eval-compare", "--lake", lake, "--candidate-run", "nope", "--champion-run", "ev-champ")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "no evaluation rows" in bad.stderr


def test_train_step_reads_a_rollout_run_from_the_lake(tmp_path):
    pytest.importorskip("trl")
    base = tiny_checkpoint(tmp_path / "base")
    lake = str(tmp_path / "lake")
    ts = rollout("roll-1", "q1", [1.0, 0.0, 0.5, None]) + rollout("roll-1", "q2", [0.0, 1.0], prompt="Route: MCQ?")
    for t in ts:
        t.date = "2026-11-21"
    write_shard(lake, ts, "00000")
    out = tmp_path / "it1"
    r = cli("train-step", "--run", "roll-1", "--lake", lake, "--from", str(base), "--out", str(out),
            "--preset", "cpu", "--set", '{"learning_rate": 1e-3}', "--register", str(tmp_path / "reg"))
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["metrics"]["n_infra_failed"] == 1 and res["metrics"]["n_samples"] == 5
    lin = json.loads((out / "lineage.json").read_text())
    assert lin["rollout_run"] == "roll-1" and lin["hyperparameters"]["learning_rate"] == 1e-3
    assert json.loads((tmp_path / "reg" / "registry.json").read_text())["checkpoints"]["it1"]["uri"] == str(out)
    bad = cli("train-step", "--run", "roll-1", "--lake", lake, "--from", str(base), "--out", str(tmp_path / "x"),
              "--set", '{"learning_rte": 1}')
    assert bad.returncode == 2 and "learning_rte" in bad.stderr and not (tmp_path / "x").exists()
    missing = cli("train-step", "--run", "nope", "--lake", lake, "--from", str(base), "--out", str(tmp_path / "y"))
    assert missing.returncode == 2 and "no rollout trajectories" in missing.stderr
