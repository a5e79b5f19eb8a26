"""Issue #16: one typed run configuration, built from the command line or read from `--config run.yaml`,
validated once (one `error:` line naming the file and field, exit 2), hashed for the run id.

The CLI cases are real subprocesses of `python -m conductor`; the answer run is a real flow over the
simulated pool.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conductor.run.config import AnswerConfig, ConfigError, NightlyConfig, RolloutConfig

ROOT = Path(__file__).resolve().parent.parent
SIM_POOL = str(ROOT / "data/pools/simulated.yaml")


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "conductor", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600, env=env)


def one_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr[-2000:]
    return lines[0]


def test_file_values_under_given_values_over_defaults(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("questions: gsm8k_test:2\nout: runs/x\nsamples: 3\nseed: 7\n", encoding="utf-8")
    cfg = AnswerConfig.build(f, {"seed": 9})
    assert (cfg.questions, cfg.samples, cfg.seed, cfg.shard_size) == ("gsm8k_test:2", 3, 9, 5)


@pytest.mark.parametrize("text, needle", [
    ("questions: q\nout: o\nsampels: 2\n", "run.yaml: field sampels: Extra inputs are not permitted"),
    ("questions: q\nout: o\nsamples: many\n", "run.yaml: field samples: Input should be a valid integer"),
    ("questions: q\nout: o\nsamples: 0\n", "run.yaml: field samples: Input should be greater than or equal to 1"),
    ("questions: [q\nout: o\n", "run.yaml:2: not valid YAML"),
    ("- questions\n", "run.yaml: expected a mapping of field names to values, got list"),
    ("out: o\n", "run.yaml: field questions: Field required"),
])
def test_a_bad_file_is_one_line_naming_the_file_and_field(tmp_path, text, needle):
    f = tmp_path / "run.yaml"
    f.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        AnswerConfig.build(f)
    assert str(e.value).startswith(str(f)) and needle in str(e.value)
    assert "\n" not in str(e.value)


def test_a_bad_given_value_names_its_flag():
    with pytest.raises(ConfigError, match="^--temperature: Input should be a finite number$"):
        AnswerConfig.build(given={"questions": "q", "out": "o", "temperature": float("nan")},
                           flags={"temperature": "--temperature"})
    with pytest.raises(ConfigError, match="^--kind: Input should be 'rollout' or 'eval'"):
        RolloutConfig.build(given={"questions": "q", "lake": "l", "pool": "p", "conductor": "fixed:0",
                                   "run_id": "r", "kind": "answer"})


def test_the_settings_key_hashes_what_defines_the_run_and_only_that():
    from conductor.workers.pool import load_pool

    pool = load_pool(SIM_POOL)
    base = AnswerConfig(questions="q", out="a", temperature=0.0, fewshot="ood", constrained=False)
    key = base.settings_key(pool, "fixed:0")
    # paths, limits, shard sizes and modes do not change answers: same key, same run id, a rerun resumes
    same = base.model_copy(update={"out": "b", "limit": 3, "shard_size": 9, "cache": "c", "batch": True})
    assert same.settings_key(pool, "fixed:0") == key and same.derive_run_id(key) == base.derive_run_id(key)
    for change in ({"samples": 2}, {"seed": 1}, {"temperature": 0.7}, {"max_steps": 3}, {"fewshot": "none"}):
        assert base.model_copy(update=change).settings_key(pool, "fixed:0") != key, change
    assert base.settings_key(pool, "fixed:1") != key
    assert base.derive_run_id(key) != base.model_copy(update={"questions": "other"}).derive_run_id(key)


def test_cli_config_file_with_an_override_runs_and_resumes(tmp_path):
    q = tmp_path / "q.jsonl"
    q.write_text("".join(json.dumps({"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                         for i in range(3)), encoding="utf-8")
    (tmp_path / "run.yaml").write_text(f"questions: q.jsonl\nout: out\npool: {SIM_POOL}\nconductor: fixed:0\n"
                                       "shard_size: 5\nsamples: 2\n", encoding="utf-8")
    r = cli("answer", "--config", "run.yaml", "--shard-size", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["trajectories"] == 6                                  # samples: 2 from the file
    shards = list((tmp_path / "out" / "lake" / "trajectories").rglob("shard-*.parquet"))
    assert len(shards) == 3                                              # --shard-size 1 over the file's 5
    again = cli("answer", "q.jsonl", "--out", "out", "--pool", SIM_POOL, "--conductor", "fixed:0", "--samples", "2",
                cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["run_id"] == summary["run_id"]
    assert sorted((tmp_path / "out" / "lake" / "trajectories").rglob("shard-*.parquet")) == sorted(shards)


def test_cli_config_mistakes_are_one_line(tmp_path):
    (tmp_path / "bad.yaml").write_text("questions: q.jsonl\nout: out\nsamples: many\n", encoding="utf-8")
    (tmp_path / "night.yaml").write_text("pool: p.yaml\ntrain_questions: a\neval_questions: b\nwork_dir: w\n"
                                         "base: m\niterations: 0\n", encoding="utf-8")
    assert one_error(cli("answer", "--config", "bad.yaml", cwd=tmp_path)) == (
        "error: bad.yaml: field samples: Input should be a valid integer, unable to parse string as an integer")
    assert one_error(cli("answer", "--config", "missing.yaml", cwd=tmp_path)).startswith("error: missing.yaml: cannot read")
    assert one_error(cli("answer", "q.jsonl", cwd=tmp_path)) == "error: --out: Field required"
    assert one_error(cli("nightly", "--config", "night.yaml", cwd=tmp_path)) == (
        "error: night.yaml: field iterations: Input should be greater than or equal to 1")
    assert one_error(cli("rollout", "--config", "bad.yaml", cwd=tmp_path)).startswith("error: bad.yaml: field ")


def test_shipped_example_configs_validate():
    for cls, name in ((AnswerConfig, "answer.yaml"), (RolloutConfig, "rollout.yaml"), (NightlyConfig, "nightly.yaml")):
        cls.build(ROOT / "data" / "run-configs" / name)
