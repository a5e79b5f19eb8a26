"""Issue #50 (last Done-when item): the options of `conductor train-step`, `eval-compare`, `registry ...`, `record`,
`grade`, `pool sample`, and `evaluate --heldout-workers` / `nightly --grpo` are generated from their configuration
models; hand-declared options are only those that are not settings. The command line is the one it was.

In process: the real commands' click parameters, typer's CliRunner, and click contexts parsed from real argv."""

from __future__ import annotations

import inspect
import json
import typing

import pytest
import typer.main
from typer.testing import CliRunner

from conductor.cli import app
from conductor.cli.run_options import build_config
from conductor.learning.registry import PromotionPolicy
from conductor.run.command_config import (
    EvalCompareConfig,
    GradeConfig,
    PoolSampleConfig,
    PromoteConfig,
    RecordConfig,
    RegisterConfig,
    RegistryShowConfig,
    RollbackConfig,
)
from conductor.run.config import DEFAULT_POOL, EvaluateConfig, GRPOPreset, NightlyConfig, TrainStepConfig

# Every option each command had when its parameters were written out by hand (before this change), and the
# parameters that stay hand-declared (not settings: a file format switch, the thing acted on, --config).
COMMANDS = {
    ("train-step",): (TrainStepConfig, {"--run", "--lake", "--from", "--out", "--config", "--preset", "--set",
                                        "--register", "--id"}, {"config"}),
    ("eval-compare",): (EvalCompareConfig, {"--lake", "--candidate-run", "--champion-run", "--metric", "--n-boot",
                                            "--seed", "--out", "--candidate-id", "--champion-id"}, set()),
    ("registry", "show"): (RegistryShowConfig, {"--registry", "--json", "--history"}, {"as_json"}),
    ("registry", "register"): (RegisterConfig, {"--id", "--registry"}, {"uri"}),
    ("registry", "promote"): (PromoteConfig, {"--report", "--force", "--alpha", "--test", "--tolerance", "--reason",
                                              "--registry"}, {"checkpoint_id"}),
    ("registry", "rollback"): (RollbackConfig, {"--reason", "--registry"}, set()),
    ("record",): (RecordConfig, {"--menu", "--cache", "--pool", "--limit"}, set()),
    ("grade",): (GradeConfig, {"--workers", "--timeout"}, {"file"}),
    ("pool", "sample"): (PoolSampleConfig, {"--k", "--seed", "--shuffle"}, {"file"}),
}


def _command(*path: str):
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]   # type: ignore[attr-defined]
    return cmd


def _context(path: str, *argv: str):
    """The click context of a real command line (``path``: the command's words), parsed; nothing runs."""
    words = path.split()
    return _command(*words).make_context(words[-1], list(argv))


def _hand_declared(cmd) -> set[str]:
    """The parameters the command's function declares itself; the others are generated from its model
    (``config_options`` wraps the function, which takes them as ``**options``)."""
    params = inspect.signature(inspect.unwrap(cmd.callback), follow_wrapped=False).parameters.values()
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    return {p.name for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD and p.name != "ctx"}


@pytest.mark.parametrize("path,hand", [("rollout", {"config", "dask"}), ("evaluate", {"config"}),
                                       ("nightly", {"config"})])
def test_learning_commands_declare_only_config_and_dask(path, hand):
    """`--heldout-workers` (evaluate) and `--grpo` (nightly) are generated from their fields now; --dask says
    where the run goes (a Dask scheduler), not how it runs."""
    assert _hand_declared(_command(path)) == hand


@pytest.mark.parametrize("path", list(COMMANDS), ids=" ".join)
def test_options_are_the_model_fields_with_their_defaults_and_help(path):
    model, expected, hand = COMMANDS[path]
    cmd = _command(*path)
    opts = {o for p in cmd.params for o in [*p.opts, *p.secondary_opts] if o.startswith("--")}
    assert opts == expected                                      # the command line did not change
    assert _hand_declared(cmd) == hand
    generated = [p for p in cmd.params if p.name not in hand]
    for p in generated:
        field = model.model_fields[p.name]                       # every other parameter is a field
        assert field.description and field.description.rstrip(".") in (p.help or ""), p.name
        if field.is_required():
            assert p.required, p.name                            # no --config file: click says it is missing
        else:
            assert p.default == field.default, p.name


def test_help_shows_the_models_defaults():
    r = CliRunner().invoke(app, ["eval-compare", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "Bootstrap resamples for the paired test." in r.output
    assert "[default: 10000]" in r.output and "[default: correct]" in r.output
    r = CliRunner().invoke(app, ["record", "--help"], env={"COLUMNS": "400"})
    assert f"[default: {DEFAULT_POOL}]" in r.output


def test_defaults_are_written_once():
    policy = PromotionPolicy()
    promote = PromoteConfig()
    assert (promote.alpha, promote.test, promote.tolerance) == (policy.alpha, policy.test, policy.max_domain_regression)
    assert promote.policy() == policy
    from conductor.learning.grpo.config import _PRESETS, GRPOConfig

    assert set(typing.get_args(GRPOPreset)) == {k for k in _PRESETS if k}
    assert TrainStepConfig(run_id="r", lake="l", base="b", out="o", preset="cpu").grpo_config() == GRPOConfig.cpu()


@pytest.mark.parametrize("argv,line", [
    (["eval-compare", "--lake", "l", "--candidate-run", "a", "--champion-run", "b", "--metric", "x"],
     "error: --metric: must be correct or reward, not 'x'"),
    (["registry", "promote", "c0", "--test", "x"], "error: --test: must be bootstrap, mcnemar or both, not 'x'"),
    (["train-step", "--run", "r", "--lake", "l", "--from", "b", "--out", "o", "--preset", "gpu"],
     "error: --preset: must be cpu or paper, not 'gpu'"),
    (["train-step", "--run", "r", "--lake", "l", "--from", "b", "--out", "o", "--set", "{x"],
     "error: --set: not JSON: Expecting property name enclosed in double quotes at column 2"),
    (["train-step", "--run", "r", "--lake", "l", "--from", "b", "--out", "o", "--set", "[1]"],
     "error: --set: must be a JSON object of GRPOConfig fields"),
    (["train-step", "--run", "r", "--lake", "l", "--from", "b", "--out", "o", "--set", '{"learnig_rate": 1}'],
     "error: --set: learnig_rate: Extra inputs are not permitted"),
])
def test_bad_settings_keep_their_one_line_errors(argv, line):
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 2 and r.output.strip() == line, r.output


def test_train_step_grpo_settings_file_then_preset_then_set(tmp_path):
    """--set over the GRPO config file (or the preset), as before; the file's value when --set leaves it out."""
    f = tmp_path / "grpo.yaml"
    f.write_text("preset: cpu\nlearning_rate: 3.0e-5\nepochs: 2\n", encoding="utf-8")
    base = ["--run", "r", "--lake", "l", "--from", "b", "--out", "o"]
    ctx = _context("train-step", *base, "--set", '{"learning_rate": 1e-3}')
    step = build_config(TrainStepConfig, ctx, None, {k: v for k, v in ctx.params.items() if k != "config"})
    assert step.grpo == {"learning_rate": 1e-3} and step.run_id == "r" and step.base == "b"
    cfg = step.grpo_config(f, source="--set")
    assert (cfg.learning_rate, cfg.epochs, cfg.dtype) == (1e-3, 2, "float32")
    plain = TrainStepConfig(run_id="r", lake="l", base="b", out="o").grpo_config(f)
    assert (plain.learning_rate, plain.epochs) == (3e-5, 2)


def test_evaluate_heldout_and_nightly_grpo_come_from_the_file_unless_given(tmp_path):
    """`--heldout-workers a,b` and `--grpo JSON` are generated from the list and mapping fields they set: a
    --config value is used when the option is absent and overridden when it is given."""
    ev = tmp_path / "eval.yaml"
    ev.write_text("candidate: fixed:0\nquestions: q.jsonl\npool: p.yaml\nlake: l\nout: o\n"
                  "heldout_workers: [w1, w2]\n", encoding="utf-8")

    def evaluate(*argv: str) -> EvaluateConfig:
        ctx = _context("evaluate", "--config", str(ev), *argv)
        return build_config(EvaluateConfig, ctx, ev, {k: v for k, v in ctx.params.items() if k != "config"})

    assert evaluate().heldout_workers == ["w1", "w2"]
    assert evaluate("--heldout-workers", "a, b,").heldout_workers == ["a", "b"]
    assert evaluate("--samples", "3").samples == 3
    night = tmp_path / "night.yaml"
    night.write_text("pool: p.yaml\ntrain_questions: t\neval_questions: e\nwork_dir: w\nbase: b\n"
                     "grpo: {learning_rate: 2.0e-5}\n", encoding="utf-8")

    def nightly(*argv: str) -> NightlyConfig:
        ctx = _context("nightly", "--config", str(night), *argv)
        return build_config(NightlyConfig, ctx, night, {k: v for k, v in ctx.params.items() if k != "config"})

    assert nightly().grpo == {"learning_rate": 2e-5}
    assert nightly("--grpo", '{"epochs": 2}').grpo == {"epochs": 2}
    bad = CliRunner().invoke(app, ["nightly", "--config", str(night), "--grpo", "{x"])
    assert bad.exit_code == 2
    assert bad.output.strip() == "error: --grpo: not JSON: Expecting property name enclosed in double quotes at column 2"


def test_record_and_pool_sample_and_grade_build_their_models():
    ctx = _context("record", "gsm8k_test:2", "--menu", "fixed:0", "--cache", "c.sqlite", "--limit", "2")
    rec = build_config(RecordConfig, ctx, None, ctx.params)
    assert rec == RecordConfig(questions="gsm8k_test:2", menu="fixed:0", cache="c.sqlite", limit=2)
    assert rec.pool == DEFAULT_POOL
    missing = CliRunner().invoke(app, ["record", "gsm8k_test:2", "--cache", "c.sqlite"])
    assert missing.exit_code == 2 and "Missing option '--menu'" in missing.output
    ctx = _context("pool sample", "p.yaml", "--k", "2", "--shuffle")
    assert build_config(PoolSampleConfig, ctx, None, {k: v for k, v in ctx.params.items() if k != "file"}) == \
        PoolSampleConfig(k=2, shuffle=True)
    r = CliRunner().invoke(app, ["grade", "-", "--workers", "-1"], input="")
    assert r.exit_code == 2 and "--workers must be 0 (one per core) or more, got -1" in r.output
    r = CliRunner().invoke(app, ["grade", "-", "--timeout", "nan"], input="")
    assert r.exit_code == 2 and "--timeout must be a number of seconds > 0 and <= 3600, got nan" in r.output


def test_eval_compare_reads_its_settings(tmp_path):
    r = CliRunner().invoke(app, ["eval-compare", "--lake", str(tmp_path / "none"), "--candidate-run", "a",
                                 "--champion-run", "b", "--n-boot", "500"])
    assert r.exit_code == 2 and r.output.startswith("error: lake ") and r.output.count("\n") == 1, r.output
    assert json.loads(EvalCompareConfig(lake="l", candidate_run="a", champion_run="b").model_dump_json())["n_boot"] == 10_000
