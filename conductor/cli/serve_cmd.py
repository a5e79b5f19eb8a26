"""`conductor serve`: the conductor as one OpenAI-compatible model (docs/serving.md); `conductor serve-key`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import typer

from conductor.cli import app, fail
from conductor.cli.run_options import CONFIG_HELP, build_config, config_options
from conductor.serve.config import TUNING, ServeConfig

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")   # uvicorn's
KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}$")   # one token of a keys-file line


@app.command("serve")
@config_options(ServeConfig, exclude=TUNING, flags={"max_dollars": "--max-cost"}, bounds=False)
def serve(ctx: typer.Context,
          config: Path = typer.Option(None, "--config", help=CONFIG_HELP),
          host: str = typer.Option("127.0.0.1", "--host"),
          port: int = typer.Option(8000, "--port"),
          log_level: str = typer.Option("warning", "--log-level"),
          **options: Any) -> None:
    """Serve the conductor behind /v1/chat/completions, /v1/responses, /v1/models, /health and /metrics."""
    import logging

    from conductor.policy.strategies import StrategyError, check_strategy, strategy_pool
    from conductor.run.preflight import UsageError
    from conductor.workers.pool import PoolError, load_pool

    cfg = build_config(ServeConfig, ctx, config, options)   # the conductor spec, few-shot and limits parsed once
    if not Path(cfg.pool).is_file():
        fail(f"{cfg.pool}: no such pool manifest")
    try:   # a bad manifest or strategy is one line here, not a traceback from the server's start-up
        manifest = load_pool(cfg.pool)
        check_strategy(cfg.conductor, strategy_pool(cfg.conductor, manifest), cfg.max_steps)
    except (PoolError, StrategyError) as e:
        fail(str(e))
    try:
        check_start(cfg, host, port, log_level)
    except UsageError as e:
        fail(str(e))
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        run_server(cfg, host, port, log_level)
    except ValueError as e:
        fail(str(e))


def check_start(cfg: ServeConfig, host: str, port: int, log_level: str) -> None:
    """What the server's start-up would trip over, found before anything starts (UsageError, one line): the
    listening address (an IP address or localhost: a name is never looked up), a port that is free, the log
    level, and the lake, cache and limits paths (a served row that cannot be written is lost)."""
    import ipaddress
    import socket

    from conductor.run.preflight import (
        UsageError,
        check_cache_file,
        check_file_path,
        check_limits,
        check_writable_dir,
    )

    if log_level.lower() not in LOG_LEVELS:
        raise UsageError(f"--log-level {log_level!r}: expected one of {', '.join(LOG_LEVELS)}")
    if not 1 <= port <= 65535:
        raise UsageError(f"--port {port}: expected a port number from 1 to 65535")
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise UsageError(f"--host {host!r}: expected an IP address to listen on (127.0.0.1, 0.0.0.0, ::) "
                             "or localhost") from None
    if cfg.lake and ("://" not in cfg.lake or cfg.lake.startswith("file://")):
        check_writable_dir(Path(cfg.lake.removeprefix("file://")).expanduser(), "--lake")
    if cfg.cache:
        check_file_path(Path(cfg.cache).expanduser(), "--cache")
        check_cache_file(Path(cfg.cache).expanduser())
    check_limits(cfg.limits)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:     # as uvicorn binds: SO_REUSEADDR, then bind
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise UsageError(f"--host {host} --port {port}: cannot listen there ({e.strerror or e}; "
                             "is another server using the port?)") from None


def run_server(cfg: ServeConfig, host: str, port: int, log_level: str = "warning") -> None:
    import uvicorn

    from conductor.serve.app import create_app

    app_ = create_app(cfg)
    # loop/http "auto": uvloop and httptools (the lake extra installs both) when importable, else asyncio and h11;
    # with them a served request costs about a third less CPU (docs/serving.md, "Overhead"). No Server header,
    # no access log: lines and bytes per request that nothing reads. No proxy-headers middleware: nothing here reads
    # the client's address or scheme (keys and limits go by API key), so rewriting them from X-Forwarded-* was one
    # more layer per request for nothing.
    uvicorn.run(app_, host=host, port=port, log_level=log_level, access_log=False, timeout_graceful_shutdown=30,
                loop="auto", http="auto", server_header=False, proxy_headers=False)


@app.command("serve-key")
def serve_key(name: str = typer.Argument(..., help="A name for the client (appears in logs and metrics).")) -> None:
    """Make a new API key: prints the key once (give it to the client) and the line for --keys-file."""
    from conductor.serve.auth import new_key_line

    if not KEY_NAME.match(name):   # the line must read back through --keys-file ("NAME sha256:<hex>")
        fail(f"name {name!r}: use 1-64 letters, digits and . _ @ + - (no spaces or '#'), starting with a "
             "letter or digit")
    key, line = new_key_line(name)
    typer.echo(f"key:  {key}")
    typer.echo(f"line: {line}")
