"""`conductor deploy start|list|run|yaml`: the scheduled deployments (defined in flows/deployments.py).

The options are generated from the fields of conductor/run/deploy_config.py (conductor/cli/run_options.py); each
subcommand also reads them from ``--config FILE`` (YAML)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import typer

from conductor.cli import app, fail
from conductor.cli.run_options import CONFIG_HELP, build_config, config_options
from conductor.run.deploy_config import (
    OVERRIDES,
    DeployListConfig,
    DeployOverrides,
    DeployRunConfig,
    DeployStartConfig,
    DeployYamlConfig,
)

if TYPE_CHECKING:
    from flows.deployments import DeploymentSpec

deploy_app = typer.Typer(help="Scheduled deployments: nightly retraining and scheduled bulk answering (Prefect).",
                         no_args_is_help=True)
app.add_typer(deploy_app, name="deploy")


def _specs(cfg: DeployOverrides, env: Mapping[str, str] | None = None) -> list[DeploymentSpec]:
    from flows.deployments import DeploymentConfigError, apply_overrides, deployment_specs

    try:
        return apply_overrides(deployment_specs(env), only=cfg.only, cron=cfg.cron, interval=cfg.interval,
                               params=cfg.param)
    except DeploymentConfigError as e:
        fail(str(e))


@deploy_app.command("list")
@config_options(DeployListConfig, repeat=OVERRIDES)
def list_cmd(ctx: typer.Context, config: Path = typer.Option(None, "--config", help=CONFIG_HELP),
             **options: Any) -> None:
    """Print the deployments (one JSON object per line) with their effective schedules and parameters."""
    from flows.deployments import describe

    cfg = build_config(DeployListConfig, ctx, config, options)
    rows = describe(_specs(cfg))
    if cfg.server:
        registered = _registered()
        for row in rows:
            row["server"] = registered.get(row["name"], "not registered")
    for row in rows:
        typer.echo(json.dumps(row, sort_keys=False))


def _registered() -> dict:
    if not os.environ.get("PREFECT_API_URL"):
        fail("--server needs PREFECT_API_URL (start one with `bash infra/prefect-server.sh start`)")
    import anyio
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterStartTime,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import DeploymentSort, FlowRunSort

    async def fetch() -> dict:
        out = {}
        async with get_client() as client:
            # explicit sort and limit: prefect 3.8.8's client sends null defaults that the server rejects (422)
            for d in await client.read_deployments(sort=DeploymentSort.NAME_ASC, limit=200):
                dep = DeploymentFilter(id=DeploymentFilterId(any_=[d.id]))
                started = await client.read_flow_runs(
                    deployment_filter=dep, flow_run_filter=FlowRunFilter(start_time=FlowRunFilterStartTime(is_null_=False)),
                    sort=FlowRunSort.START_TIME_DESC, limit=1)
                upcoming = await client.read_flow_runs(
                    deployment_filter=dep, flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
                        type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))),
                    sort=FlowRunSort.EXPECTED_START_TIME_ASC, limit=1)
                last, nxt = (started[0] if started else None), (upcoming[0] if upcoming else None)
                out[d.name] = {"id": str(d.id), "paused": d.paused,
                               "schedules": [str(s.schedule) for s in d.schedules],
                               "last_run": ({"name": last.name, "state": last.state_name,
                                             "start": str(last.start_time)} if last else None),
                               "next_run": str(nxt.expected_start_time) if nxt else None}
        return out

    try:
        return anyio.run(fetch)
    except Exception as e:  # connection refused, bad URL: one line, not a traceback
        fail(f"cannot reach the Prefect API at {os.environ['PREFECT_API_URL']}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")


@deploy_app.command("start")
@config_options(DeployStartConfig, repeat=OVERRIDES)
def start_cmd(ctx: typer.Context, config: Path = typer.Option(None, "--config", help=CONFIG_HELP),
              **options: Any) -> None:
    """Register the deployments with the server at PREFECT_API_URL and run their scheduled flow runs (foreground)."""
    from flows.deploy import main

    cfg = build_config(DeployStartConfig, ctx, config, options)
    argv = [f"--{name}={x}" for name in OVERRIDES for x in getattr(cfg, name)]
    argv += [f"--limit={cfg.limit}"] + (["--skip-missing"] if cfg.skip_missing else [])
    code = main(argv)
    if code:
        raise typer.Exit(code)


@deploy_app.command("run")
@config_options(DeployRunConfig, repeat=("param",))
def run_cmd(ctx: typer.Context,
            name: str = typer.Argument(..., help="Deployment name, e.g. scheduled-answering."),
            config: Path = typer.Option(None, "--config", help=CONFIG_HELP),
            **options: Any) -> None:
    """Create a flow run of a registered deployment now; prints its id and final state."""
    import yaml

    from flows.deployments import DeploymentConfigError, deployment_specs, load_flow

    cfg = build_config(DeployRunConfig, ctx, config, options)
    wait, timeout = cfg.wait, cfg.timeout
    if not os.environ.get("PREFECT_API_URL"):
        fail("PREFECT_API_URL is not set (start a server with `bash infra/prefect-server.sh start`)")
    specs = {s.name: s for s in deployment_specs()}
    if name not in specs:
        fail(f"unknown deployment {name!r} (known: {', '.join(specs)})")
    params = {}
    for item in cfg.param:
        key, ok, raw = item.partition("=")
        if not ok or not key:
            fail(f"--param {item}: expected key=VALUE")
        params[key] = yaml.safe_load(raw) if raw else ""
    try:
        flow_name = load_flow(specs[name]).name
    except DeploymentConfigError as e:
        fail(str(e))
    from prefect.client.schemas.objects import FlowRun
    from prefect.deployments import run_deployment

    try:   # called outside an event loop, so it runs synchronously (its type says "or a coroutine")
        run = cast(FlowRun, run_deployment(f"{flow_name}/{name}", parameters=params or None,
                                           timeout=timeout if wait else 0))
    except Exception as e:
        fail(f"cannot run {flow_name}/{name}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    state = run.state.name if run.state else "unknown"
    typer.echo(json.dumps({"flow_run_id": str(run.id), "name": run.name, "state": state}))
    if wait and not (run.state and run.state.is_completed()):
        raise typer.Exit(1)


@deploy_app.command("yaml")
@config_options(DeployYamlConfig, repeat=OVERRIDES)
def yaml_cmd(ctx: typer.Context, config: Path = typer.Option(None, "--config", help=CONFIG_HELP),
             **options: Any) -> None:
    """Print the prefect.yaml for `prefect deploy` (infra/prefect.yaml is `conductor deploy yaml --image-env`)."""
    from flows.deployments import IMAGE_ENV, prefect_yaml

    cfg = build_config(DeployYamlConfig, ctx, config, options)
    typer.echo(prefect_yaml(_specs(cfg, IMAGE_ENV if cfg.image_env else None)), nl=False)
