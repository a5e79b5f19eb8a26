"""`conductor emulator` and `conductor preflight`: run the provider emulator; check a pool before a run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer

from conductor.cli import app, fail
from conductor.cli.emulator_config import EmulatorOptions
from conductor.cli.run_options import build_config, config_options


@app.command("emulator")
@config_options(EmulatorOptions, bounds=False)
def emulator(ctx: typer.Context,
             port: int = typer.Option(8765, help="Port on 127.0.0.1."),
             config: Path = typer.Option(None, help="JSON file of emulator settings (faults, scripted replies)."),
             **options: Any) -> None:
    """Serve the OpenAI / Anthropic / Gemini provider emulator on 127.0.0.1 (for tests, benches, dry runs)."""
    cfg = build_config(EmulatorOptions, ctx, None, options)   # not `config`: that is the emulator's JSON file
    try:   # a test double (conductor.testing), imported only here; it needs the dev extra
        from conductor.testing.emulator import main
    except ModuleNotFoundError as e:
        fail(f"the provider emulator needs {e.name}: pip install 'conductor-orchestra[dev]'")

    if config is not None and not config.is_file():
        fail(f"{config}: no such emulator config file")
    argv = ["--port", str(port), "--latency", str(cfg.latency), "--jitter", str(cfg.jitter)]
    argv += ["--rpm", str(cfg.rpm)] if cfg.rpm is not None else []   # 0 is refused there, never read as "no limit"
    argv += ["--config", str(config)] if config else []
    main(argv)


@app.command("preflight")
def preflight(pool_file: Path = typer.Argument(..., help="Pool manifest (YAML).")) -> None:
    """Check every worker can be called: API key variables set (names only), providers installed, limits possible."""
    from conductor.execution.ratelimit import limit_problems
    from conductor.workers.pool import PoolError, load_pool
    from conductor.workers.providers.base import ProviderError, make_provider

    try:
        pool = load_pool(pool_file)
    except PoolError as e:
        fail(str(e))
    problems: list[str] = []
    for w in pool.workers:
        problems += limit_problems(w)
        if w.api_key_env and not os.environ.get(w.api_key_env):
            problems.append(f"worker {w.name}: environment variable {w.api_key_env} is not set")
            continue
        if w.provider in ("conductor", "simulated"):
            continue
        try:
            make_provider(w)
        except ProviderError as e:
            problems.append(str(e))
    for p in problems:
        typer.echo(f"problem: {p}", err=True)
    if problems:
        fail(f"{pool_file}: {len(problems)} worker problem(s); first: {problems[0]}")
    typer.echo(f"ok {pool_file} {pool.id}: {len(pool.workers)} workers callable")
