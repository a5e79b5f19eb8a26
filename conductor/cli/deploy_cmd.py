"""`conductor deploy start|list|run|yaml`: the scheduled deployments (defined in flows/deployments.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

import typer

from conductor.cli import app, fail

if TYPE_CHECKING:
    from flows.deployments import DeploymentSpec

deploy_app = typer.Typer(help="Scheduled deployments: nightly retraining and scheduled bulk answering (Prefect).",
                         no_args_is_help=True)
app.add_typer(deploy_app, name="deploy")


def _specs(only: list[str], cron: list[str], interval: list[str], param: list[str],
           env: Mapping[str, str] | None = None) -> list[DeploymentSpec]:
    from flows.deployments import DeploymentConfigError, apply_overrides, deployment_specs

    try:
        return apply_overrides(deployment_specs(env), only=only, cron=cron, interval=interval, params=param)
    except DeploymentConfigError as e:
        fail(str(e))


ONLY = typer.Option([], "--only", help="Only these deployments (repeatable).")
CRON = typer.Option([], "--cron", help="NAME=EXPR: replace a deployment's cron schedule.")
INTERVAL = typer.Option([], "--interval", help="NAME=SECONDS: run every SECONDS instead.")
PARAM = typer.Option([], "--param", help="NAME.key=VALUE: set a flow parameter (VALUE parsed as YAML).")


@deploy_app.command("list")
def list_cmd(only: list[str] = ONLY, cron: list[str] = CRON, interval: list[str] = INTERVAL, param: list[str] = PARAM,
             server: bool = typer.Option(False, "--server", help="Also show what the Prefect server at PREFECT_API_URL "
                                         "has registered, with each deployment's last flow run.")) -> None:
    """Print the deployments (one JSON object per line) with their effective schedules and parameters."""
    from flows.deployments import describe

    rows = describe(_specs(only, cron, interval, param))
    if server:
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
def start_cmd(only: list[str] = ONLY, cron: list[str] = CRON, interval: list[str] = INTERVAL, param: list[str] = PARAM,
              limit: int = typer.Option(1, "--limit", min=1, help="Flow runs executed at once."),
              skip_missing: bool = typer.Option(False, "--skip-missing", help="Run the others when a flow module is missing.")) -> None:
    """Register the deployments with the server at PREFECT_API_URL and run their scheduled flow runs (foreground)."""
    from flows.deploy import main

    argv = [f"--only={x}" for x in only] + [f"--cron={x}" for x in cron] + [f"--interval={x}" for x in interval]
    argv += [f"--param={x}" for x in param] + [f"--limit={limit}"] + (["--skip-missing"] if skip_missing else [])
    code = main(argv)
    if code:
        raise typer.Exit(code)


@deploy_app.command("run")
def run_cmd(name: str = typer.Argument(..., help="Deployment name, e.g. scheduled-answering."),
            param: list[str] = typer.Option([], "--param", help="key=VALUE overrides for this run only (YAML values)."),
            wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait for the run to finish (a served or worker "
                                      "process must pick it up)."),
            timeout: float = typer.Option(3600, "--timeout", min=1, help="Seconds to wait.")) -> None:
    """Create a flow run of a registered deployment now; prints its id and final state."""
    import yaml

    from flows.deployments import DeploymentConfigError, deployment_specs, load_flow

    if not os.environ.get("PREFECT_API_URL"):
        fail("PREFECT_API_URL is not set (start a server with `bash infra/prefect-server.sh start`)")
    specs = {s.name: s for s in deployment_specs()}
    if name not in specs:
        fail(f"unknown deployment {name!r} (known: {', '.join(specs)})")
    params = {}
    for item in param:
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
def yaml_cmd(only: list[str] = ONLY, cron: list[str] = CRON, interval: list[str] = INTERVAL, param: list[str] = PARAM,
             image_env: bool = typer.Option(False, "--image-env", help="Use the paths inside our images instead of "
                                            "this shell's CONDUCTOR_* variables (how infra/prefect.yaml is made).")) -> None:
    """Print the prefect.yaml for `prefect deploy` (infra/prefect.yaml is `conductor deploy yaml --image-env`)."""
    from flows.deployments import IMAGE_ENV, prefect_yaml

    typer.echo(prefect_yaml(_specs(only, cron, interval, param, IMAGE_ENV if image_env else None)), nl=False)
