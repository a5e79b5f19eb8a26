"""Issue #37 (2): each setting named once. The command-line options of `conductor answer` and `conductor
evaluate` are generated from their configuration models' fields (name, default, bounds, help), and the flows
return typed records whose JSON keeps the shape the files on disk always had.

In process: typer's CliRunner over the real commands and over a small command built the same way."""

from __future__ import annotations

import json

import pytest
import typer
from pydantic import Field
from typer.testing import CliRunner

from conductor.cli import app
from conductor.cli.run_options import CONFIG_HELP, build_config, cli_type, config_options
from conductor.learning.evaluation import compare
from conductor.learning.results import EvalResult, TrainResult
from conductor.run.config import AnswerConfig, CompareConfig, EvaluateConfig, HeadroomConfig, RunConfig
from conductor.run.summary import EXIT_INFRA, EXIT_OK, EXIT_PARTIAL, RunSummary
from conductor.serve.config import ServeConfig

# Every option `conductor answer` had when its parameters were written out by hand (before #37).
ANSWER_OPTIONS = {"--out", "--pool", "--conductor", "--samples", "--recursion-depth", "--limit", "--shard-size", "--k",
                  "--seed", "--temperature", "--max-tokens", "--run-id", "--cache", "--replay", "--fewshot",
                  "--constrained", "--free", "--max-steps", "--max-cost", "--lake", "--retry-failed", "--keep-failed",
                  "--batch", "--batch-poll", "--limits", "--compact", "--config", "--replace",
                  "--dask"}   # --dask: where the run goes (like --config, --replace), not a run setting


def _command(name: str):
    import typer.main

    return typer.main.get_command(app).commands[name]   # type: ignore[attr-defined]


def test_answer_options_are_the_config_fields_with_their_defaults_and_help():
    cmd = _command("answer")
    opts = {o for p in cmd.params for o in [*p.opts, *p.secondary_opts] if o.startswith("--")}
    assert opts == ANSWER_OPTIONS
    by_name = {p.name: p for p in cmd.params}
    for name, field in AnswerConfig.model_fields.items():
        if name == "show_progress":                     # set by a file only
            assert name not in by_name
            continue
        p = by_name[name]
        assert field.description and field.description.rstrip(".") in p.help, name
        if not field.is_required():
            assert p.default in (field.default, str(field.default)), name   # a typed spec's default as its text
    assert by_name["batch_poll_s"].opts == ["--batch-poll"]
    for flag, low in (("--samples", "0"), ("--max-tokens", "15")):   # ge bounds checked before anything runs
        r = CliRunner().invoke(app, ["answer", "gsm8k_test:1", "--out", "o", flag, low])
        assert r.exit_code == 2 and flag in r.output, r.output
    assert by_name["questions"].param_type_name == "argument"
    assert "(or `out:` in --config)" in by_name["out"].help


def test_answer_help_lists_every_option_once():
    r = CliRunner().invoke(app, ["answer", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    for opt in ANSWER_OPTIONS:
        assert r.output.count(f"{opt} ") >= 1, opt
    assert "Conductor samples per question." in r.output and "Seconds between polls of a batch." in r.output


def test_evaluate_options_come_from_evaluate_config():
    by_name = {p.name: p for p in _command("evaluate").params}
    scalar = {n for n, f in EvaluateConfig.model_fields.items() if cli_type(f.annotation) is not None}
    assert scalar <= set(by_name) and "objective" not in by_name          # a mapping: set by a file only
    assert by_name["heldout_workers"].opts == ["--heldout-workers"] and by_name["samples"].default == 4


class Tiny(RunConfig):
    name: str = Field(description="A name.")
    count: int = Field(3, ge=1, description="How many.")
    ratio: float | None = Field(None, gt=0, description="A ratio.")
    loud: bool = Field(False, description="Shout.")
    tags: list[str] | None = None


tiny_app = typer.Typer()


@tiny_app.command()
@config_options(Tiny, argument="name", flags={"loud": "--loud/--quiet"})
def tiny(ctx: typer.Context, config: str = typer.Option(None, "--config", help=CONFIG_HELP), **options) -> None:
    typer.echo(build_config(Tiny, ctx, config, options).model_dump_json())


def test_generated_command_types_bounds_flags_and_file_overrides(tmp_path):
    run = CliRunner().invoke
    assert json.loads(run(tiny_app, ["x"]).output) == {"name": "x", "count": 3, "ratio": None, "loud": False,
                                                         "tags": None}
    assert json.loads(run(tiny_app, ["x", "--count", "5", "--ratio", "0.5", "--loud"]).output)["count"] == 5
    assert run(tiny_app, ["x", "--count", "0"]).exit_code == 2                 # ge=1 checked by click
    bad = run(tiny_app, ["x", "--ratio", "0"])                                  # gt=0 checked by the model
    assert bad.exit_code == 2 and "error: --ratio: Input should be greater than 0" in bad.output
    assert run(tiny_app, ["x", "--tags", "a"]).exit_code == 2                  # a list is never an option
    f = tmp_path / "t.yaml"
    f.write_text("name: from-file\ncount: 9\nloud: true\n", encoding="utf-8")
    got = json.loads(run(tiny_app, ["--config", str(f), "--count", "2", "--quiet"]).output)
    assert got == {"name": "from-file", "count": 2, "ratio": None, "loud": False, "tags": None}
    missing = run(tiny_app, [])
    assert missing.exit_code == 2 and "error: NAME: Field required" in missing.output


@pytest.mark.parametrize("annotation,expected", [(int, int), (int | None, int), (str | None, str), (bool, bool),
                                                 (dict[str, int] | None, None), (list[str], None)])
def test_cli_type(annotation, expected):
    assert cli_type(annotation) is expected


def test_run_summary_json_keeps_the_summary_json_shape():
    s = RunSummary("r1", questions=4, trajectories=4, graded=4, accuracy=0.5, calls_per_question=2.0,
                   dollars_per_question=0.25, workflow_length_histogram={1: 3, 2: 1})
    d = s.to_json()
    assert list(d)[:3] == ["run_id", "questions", "trajectories"] and len(d) == 21 and d["workers_used"] == {}
    assert "answers" not in d and "answered_now" not in d        # unset outputs are not written
    out = s.with_outputs(answers="o/answers.jsonl", report="o/report/report.md", lake="o/lake", answered_now=4)
    assert list(out.to_json())[-4:] == ["answers", "report", "lake", "answered_now"]
    back = RunSummary.from_json(json.loads(json.dumps(out.to_json())))
    assert back == out and back.workflow_length_histogram == {1: 3, 2: 1}
    assert s.dollars == pytest.approx(1.0) and s.complete and s.outcome() == (EXIT_OK, None)
    with pytest.raises(TypeError):
        s.with_outputs(accuracy=1.0)


def test_run_summary_outcome_and_render():
    partial = RunSummary("r", questions=4, infra_failed_questions=1, missing=2, infra_causes={"timeout: x": 1})
    code, why = partial.outcome()
    assert code == EXIT_PARTIAL and not partial.complete
    assert why == ("1 of 4 questions failed on infrastructure (timeout: x x1); 2 trajectories were not attempted; "
                   "rerun the same command to retry them")
    assert RunSummary("r", questions=2, infra_failed_questions=2).outcome()[0] == EXIT_INFRA
    text = partial.render()
    assert text.startswith("run r: 4 questions, 0 trajectories") and "n/a (no gold answers)" in text
    assert "not attempted       2 trajectories" in text


def _rows(correct: list[bool]) -> list[dict]:
    return [{"question_id": f"q{i}", "domain": "math", "sample_index": 0, "correct": c, "infra_failed": False,
             "n_calls": 1, "cost_usd": 0.01} for i, c in enumerate(correct)]


def test_eval_result_round_trips_evaluation_json():
    rep = compare(_rows([True, True, False, True]), _rows([False, True, False, False]), n_boot=200,
                  candidate_id="cand", champion_id="champ")
    res = EvalResult({"main": rep}, {"main": {"cand": "eval-cand-1", "champ": "eval-champ-1"}})
    d = json.loads(json.dumps(res.to_json()))
    assert set(d) == {"reports", "runs"}
    assert json.dumps(d["reports"]["main"], sort_keys=True) == json.dumps(rep.to_json(), sort_keys=True)
    back = EvalResult.from_json(d)
    assert back.main.diff == pytest.approx(rep.diff) and back.heldout is None
    assert back.candidate_run == "eval-cand-1" and back.run_of("champ") == "eval-champ-1"
    assert back.render().startswith("== main pool ==\n")


def test_train_result_json_and_loss():
    r = TrainResult("ck/it1", "it1", {"loss": "0.5", "iteration": 1})
    assert r.loss == 0.5 and TrainResult("u", "c").loss is None
    assert r.to_json() == {"uri": "ck/it1", "checkpoint_id": "it1", "metrics": {"loss": "0.5", "iteration": 1}}


def test_evaluate_command_runs_the_flow_and_writes_evaluation_json(tmp_path, monkeypatch):
    """`conductor evaluate` end to end on the simulated pool: two baseline strategies, a held-out sub-pool."""
    from pathlib import Path

    from conductor.lake.reader import scan

    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    q = tmp_path / "q.jsonl"
    q.write_text('{"id": "q1", "question": "What is 2 + 2?", "answer": "4"}\n'
                 '{"id": "q2", "question": "What is 3 + 3?", "answer": "6"}\n', encoding="utf-8")
    pool = str(Path(__file__).resolve().parent.parent / "data/pools/simulated.yaml")
    r = CliRunner().invoke(app, ["evaluate", str(q), "--candidate", "fixed:0", "--champion", "fixed:1", "--pool", pool,
                                 "--lake", str(tmp_path / "lake"), "--out", str(tmp_path / "out"), "--samples", "2",
                                 "--heldout-workers", "sim-mathwiz,sim-generalist"])
    assert r.exit_code == 0, r.output
    res = EvalResult.from_json(json.loads((tmp_path / "out" / "evaluation.json").read_text(encoding="utf-8")))
    assert set(res.reports) == {"main", "heldout"} and res.main.candidate_id != res.main.champion_id
    assert "== main pool ==" in r.output and "== heldout pool ==" in r.output
    rows = scan(str(tmp_path / "lake"), kind="eval", run_id=res.candidate_run).collect()
    assert rows.height == 4                                             # 2 questions x 2 samples
    held = json.loads((tmp_path / "out" / "heldout-pool.json").read_text(encoding="utf-8"))
    assert [w["name"] for w in held["workers"]] == ["sim-mathwiz", "sim-generalist"]


# Issue #50 (1): serve, compare and headroom are generated from their config models too. Every option each had
# when its parameters were written out by hand, plus --config (a YAML file of the same fields).
SERVE_OPTIONS = {"--pool", "--conductor", "--registry", "--reload-s", "--host", "--port", "--lake", "--store-text",
                 "--limits", "--client-limits", "--keys-file", "--key-rpm", "--key-concurrency", "--max-steps",
                 "--max-cost", "--recursion-depth", "--max-input-chars", "--cache", "--run-id", "--fewshot",
                 "--log-level", "--config"}
COMPARE_OPTIONS = {"--out", "--pool", "--strategies", "--conductor", "--lake", "--runs", "--limit", "--shard-size",
                   "--seed", "--temperature", "--max-tokens", "--max-steps", "--fewshot", "--constrained", "--free",
                   "--cache", "--replay", "--n-boot", "--config"}
HEADROOM_OPTIONS = {"--out", "--pool", "--lake", "--runs", "--policy", "--limit", "--shard-size", "--folds", "--n-boot",
                    "--seed", "--margin", "--alpha", "--cost-weight", "--cache", "--replay", "--options", "--config"}
HAND_DECLARED = {"serve": {"config", "host", "port", "log_level"}, "compare": {"config"}, "headroom": {"config"}}


@pytest.mark.parametrize("name,model,expected", [("serve", ServeConfig, SERVE_OPTIONS),
                                                 ("compare", CompareConfig, COMPARE_OPTIONS),
                                                 ("headroom", HeadroomConfig, HEADROOM_OPTIONS)])
def test_serve_compare_headroom_options_are_their_config_fields(name, model, expected):
    cmd = _command(name)
    opts = {o for p in cmd.params for o in [*p.opts, *p.secondary_opts] if o.startswith("--")}
    assert opts == expected
    for p in cmd.params:
        if p.name in HAND_DECLARED[name]:
            continue
        field = model.model_fields[p.name]       # every other parameter is a field, with its help and default
        assert field.description and field.description.rstrip(".") in p.help, p.name
        if not field.is_required():
            assert p.default in (field.default, str(field.default)), p.name


def test_defaults_are_written_once():
    from conductor.workflow import DEFAULT_MAX_STEPS

    for model in (AnswerConfig, CompareConfig, ServeConfig):
        assert model.model_fields["max_steps"].default == DEFAULT_MAX_STEPS
    assert AnswerConfig.model_fields["max_tokens"].default == ServeConfig.model_fields["conductor_max_tokens"].default
    assert CompareConfig.model_fields["max_tokens"].default == AnswerConfig.model_fields["max_tokens"].default


def test_max_cost_is_max_dollars_down_to_the_budget(tmp_path):
    """One name from the configuration to the executor's Budget; the flag and a YAML file keep max_cost."""
    f = tmp_path / "run.yaml"
    f.write_text("questions: q.jsonl\nout: o\nmax_cost: 0.25\n", encoding="utf-8")
    cfg = AnswerConfig.build(f)
    assert cfg.max_dollars == 0.25 and cfg.pipeline_settings()["budget"].max_dollars == 0.25
    assert ServeConfig(pool="p", max_cost=0.5).max_dollars == 0.5
    assert ServeConfig(pool="p", key_rpm=0).key_rpm is None          # --key-rpm 0: unlimited
    by_name = {p.name: p for p in _command("answer").params}
    assert by_name["max_dollars"].opts == ["--max-cost"]


def test_headroom_bounds_and_serve_numbers_are_one_line_errors():
    r = CliRunner().invoke(app, ["headroom", "--lake", ".", "--out", "h", "--margin", "2"])
    assert r.exit_code == 2 and "--margin" in r.output
    r = CliRunner().invoke(app, ["serve", "--pool", "p.yaml", "--max-steps", "0"])
    assert r.exit_code == 2 and r.output.strip().splitlines() == [r.output.strip()]
    assert r.output.startswith("error: --max-steps:"), r.output
