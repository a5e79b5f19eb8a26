"""Issue #50 (Done when: hand-declared options are only those that are not settings): `conductor deploy`,
`query`, `report`, `lake ...`, `prompt`, `parse` and `emulator` get their options from configuration models
(conductor/run/deploy_config.py; conductor/cli/lake_config.py, language_config.py, emulator_config.py), built by
`config_options`; the flags, defaults and help are what they were when written out by hand.

In process: typer's CliRunner over the real commands, a real Parquet lake, and a small command built the same way."""

from __future__ import annotations

import inspect
import json

import pytest
import typer
import typer.main
from pydantic import Field
from typer.testing import CliRunner

from conductor.cli import app
from conductor.cli.emulator_config import EmulatorOptions
from conductor.cli.lake_config import (
    CompactConfig,
    MigrateConfig,
    QueryConfig,
    ReportConfig,
    StatsConfig,
    ViewConfig,
)
from conductor.cli.language_config import ParseConfig, PromptConfig
from conductor.cli.run_options import CONFIG_HELP, build_config, config_options
from conductor.lake import write_shard
from conductor.run.config import RunConfig
from conductor.run.deploy_config import DeployListConfig, DeployRunConfig, DeployStartConfig, DeployYamlConfig
from conductor.workflow import DEFAULT_MAX_STEPS
from lake_records import small_lake_records

# Per command: its model, every flag it had when its options were written out by hand (plus --config for the
# deploy subcommands), and the parameters still declared by hand (not settings: what is acted on, output format,
# where it listens, a configuration file).
COMMANDS = {
    ("deploy", "list"): (DeployListConfig, {"--only", "--cron", "--interval", "--param", "--server", "--config"},
                         {"config"}),
    ("deploy", "start"): (DeployStartConfig, {"--only", "--cron", "--interval", "--param", "--limit", "--skip-missing",
                                              "--config"}, {"config"}),
    ("deploy", "run"): (DeployRunConfig, {"--param", "--wait", "--no-wait", "--timeout", "--config"}, {"name", "config"}),
    ("deploy", "yaml"): (DeployYamlConfig, {"--only", "--cron", "--interval", "--param", "--image-env", "--config"},
                         {"config"}),
    ("query",): (QueryConfig, {"--lake", "--format", "--engine", "--allow-files"}, {"sql", "format"}),
    ("report",): (ReportConfig, {"--lake", "--out", "--run", "--kind"}, set()),
    ("lake", "stats"): (StatsConfig, {"--lake", "--run", "--format"}, {"format"}),
    ("lake", "compact"): (CompactConfig, {"--lake", "--run-id", "--kind", "--target-mb"}, set()),
    ("lake", "view"): (ViewConfig, {"--lake", "--port", "--open"}, {"port"}),
    ("lake", "migrate"): (MigrateConfig, {"--lake"}, set()),
    ("prompt",): (PromptConfig, {"--pool", "--k", "--seed", "--fewshot", "--max-steps"}, {"question"}),
    ("parse",): (ParseConfig, {"--pool", "--max-steps", "--allow-empty", "--binary", "--render"}, {"file", "render"}),
    ("emulator",): (EmulatorOptions, {"--port", "--latency", "--jitter", "--rpm", "--config"}, {"port", "config"}),
}


def _command(path: tuple[str, ...]):
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]   # type: ignore[attr-defined]
    return cmd


@pytest.mark.parametrize("path", list(COMMANDS), ids=" ".join)
def test_options_are_the_model_fields_with_their_defaults_and_help(path):
    model, flags, hand = COMMANDS[path]
    cmd = _command(path)
    own = inspect.signature(inspect.unwrap(cmd.callback)).parameters   # the function as written
    assert not set(model.model_fields) & set(own), "a setting declared by hand"
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in own.values())   # they come as **options
    assert {o for p in cmd.params for o in [*p.opts, *p.secondary_opts] if o.startswith("--")} == flags
    generated = {p.name: p for p in cmd.params if p.name not in hand}
    assert set(generated) == set(model.model_fields)          # every field an option, every other option a field
    for name, field in model.model_fields.items():
        p = generated[name]
        assert field.description and p.help == field.description, name
        if field.is_required():
            assert p.required, name                              # no --config could give it: click requires it
        else:
            assert p.default == field.get_default(call_default_factory=True), name


@pytest.mark.parametrize("path,shown", [
    (("deploy", "start"), ["Flow runs executed at once.", "[default: 1]", "x>=1"]),
    (("deploy", "run"), ["Seconds to wait.", "[default: 3600]", "[default: wait]"]),
    (("query",), ["[env var: CONDUCTOR_LAKE]", "[default: duckdb]", "[default: table]"]),
    (("lake", "compact"), ["Size of the files written (MB).", "[default: 128.0]"]),
    (("prompt",), [f"[default: {DEFAULT_MAX_STEPS}]", "[default: ood]", "Seed for the sub-pool."]),
    (("parse",), ["Most steps a workflow may have.", f"[default: {DEFAULT_MAX_STEPS}]"]),
])
def test_help_shows_the_model_defaults(path, shown):
    r = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    for text in shown:
        assert text in r.output, text


def test_deploy_reads_its_overrides_from_config_and_the_command_line_wins(tmp_path):
    f = tmp_path / "deploy.yaml"
    f.write_text("only: [scheduled-answering]\ninterval: [scheduled-answering=15]\n"
                 "param: [scheduled-answering.limit=2]\n", encoding="utf-8")
    run = CliRunner().invoke
    r = run(app, ["deploy", "list", "--config", str(f)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.output.splitlines()]
    assert [(x["name"], x["schedule"], x["parameters"]["limit"]) for x in rows] == [
        ("scheduled-answering", "every 15s", 2)]
    r = run(app, ["deploy", "list", "--config", str(f), "--only", "nightly-retraining"])   # overrides the file's
    assert r.exit_code == 0, r.output
    assert [json.loads(line)["name"] for line in r.output.splitlines()] == ["nightly-retraining"]
    image = tmp_path / "image.yaml"
    image.write_text("image_env: true\n", encoding="utf-8")
    assert "/var/lib/conductor" in run(app, ["deploy", "yaml", "--config", str(image)]).output
    bad = tmp_path / "bad.yaml"
    bad.write_text("onyl: [x]\n", encoding="utf-8")
    r = run(app, ["deploy", "yaml", "--config", str(bad)])
    assert r.exit_code == 2 and f"error: {bad}: field onyl: Extra inputs are not permitted" in r.output
    r = run(app, ["deploy", "list", "--cron", "nope=1 2 3 4 5"])                        # the same one-line errors
    assert r.exit_code == 2 and "error: --cron nope=1 2 3 4 5: unknown deployment 'nope'" in r.output


def test_numbers_are_checked_by_the_models_one_line_each(tmp_path):
    run = CliRunner().invoke
    r = run(app, ["deploy", "run", "scheduled-answering", "--timeout", "inf"])
    assert r.exit_code == 2 and r.output.startswith("error: --timeout: Input should be a finite number"), r.output
    r = run(app, ["lake", "compact", "--lake", str(tmp_path), "--target-mb", "nan"])
    assert r.exit_code == 2 and r.output.startswith("error: --target-mb: Input should be a finite number"), r.output
    r = run(app, ["prompt", "2+2?", "--max-steps", "0"])
    assert r.exit_code == 2 and "--max-steps" in r.output


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("lake")
    write_shard(root, small_lake_records(), "00000")
    return str(root)


def test_lake_commands_take_the_lake_from_the_environment(lake, tmp_path):
    run = CliRunner().invoke
    r = run(app, ["query", "select count(*) as n from trajectories", "-f", "json"], env={"CONDUCTOR_LAKE": lake})
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == [{"n": len(small_lake_records())}]
    r = run(app, ["lake", "stats", "--run", "r2", "-f", "csv"], env={"CONDUCTOR_LAKE": lake})
    assert r.exit_code == 0 and r.output.startswith("kind,"), r.output
    r = run(app, ["query", "select 1", "--lake", str(tmp_path / "nope")], env={"CONDUCTOR_LAKE": lake})
    assert r.exit_code == 2 and "no such directory" in r.output                         # the flag wins
    r = run(app, ["query", "select 1"], env={"CONDUCTOR_LAKE": ""})
    assert r.exit_code == 2 and "Missing option '--lake'" in r.output
    r = run(app, ["query", "select 1", "--engine", "sqlite"], env={"CONDUCTOR_LAKE": lake})
    assert r.exit_code == 2 and "error: --engine must be duckdb or polars, not 'sqlite'" in r.output


class Small(RunConfig):
    where: str = Field(description="A place.")
    tags: list[str] = Field(default_factory=list, description="Tags.")
    n: int = Field(2, ge=1, description="How many.")


small_app = typer.Typer()


@small_app.command()
@config_options(Small, repeat=("tags",), envvar={"where": "SMALL_WHERE"})
def small(ctx: typer.Context, **options) -> None:
    typer.echo(build_config(Small, ctx, None, options).model_dump_json())


with_file_app = typer.Typer()


@with_file_app.command()
@config_options(Small, repeat=("tags",))
def with_file(ctx: typer.Context, config: str = typer.Option(None, "--config", help=CONFIG_HELP), **options) -> None:
    typer.echo(build_config(Small, ctx, config, options).model_dump_json())


def test_generator_repeatable_lists_envvars_and_required_options_without_a_file(tmp_path):
    run = CliRunner().invoke
    got = json.loads(run(small_app, ["--where", "x", "--tags", "a", "--tags", "b"]).output)
    assert got == {"where": "x", "tags": ["a", "b"], "n": 2}
    assert json.loads(run(small_app, [], env={"SMALL_WHERE": "env"}).output)["where"] == "env"
    missing = run(small_app, [], env={"SMALL_WHERE": ""})
    assert missing.exit_code == 2 and "Missing option '--where'" in missing.output
    assert "--config" not in run(small_app, ["--help"]).output
    f = tmp_path / "s.yaml"
    f.write_text("where: file\ntags: [t]\n", encoding="utf-8")
    assert json.loads(run(with_file_app, ["--config", str(f)]).output) == {"where": "file", "tags": ["t"], "n": 2}
    got = json.loads(run(with_file_app, ["--config", str(f), "--tags", "u", "--n", "3"]).output)
    assert got == {"where": "file", "tags": ["u"], "n": 3}
    missing = run(with_file_app, [])
    assert missing.exit_code == 2 and "error: --where: Field required" in missing.output
