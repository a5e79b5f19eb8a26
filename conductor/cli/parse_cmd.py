"""`conductor parse`: a conductor completion in, the workflow as one JSON object out."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from conductor.cli import app, fail
from conductor.cli.language_config import ParseConfig
from conductor.cli.run_options import build_config, config_options


@app.command("parse")
@config_options(ParseConfig)
def parse_cmd(
    ctx: typer.Context,
    file: str = typer.Argument("-", help="File holding a conductor completion, or - for standard input."),
    render: bool = typer.Option(False, "--render", help="Print the canonical three-list text instead of JSON."),
    **options: Any,
) -> None:
    """Parse a conductor output into {"steps": [{"worker", "subtask", "access"}]}; exit 2 with 'error:' if malformed."""
    from conductor.parser import ParseError, parse_workflow, render_json
    from conductor.workers.pool import PoolError, load_pool

    cfg = build_config(ParseConfig, ctx, None, options)
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        fail(f"{file}: cannot read: {getattr(e, 'strerror', None) or e}")
    n_workers = None
    if cfg.pool is not None:
        try:
            n_workers = len(load_pool(cfg.pool).workers)
        except PoolError as e:
            fail(str(e))
    result = parse_workflow(text, n_workers=n_workers, max_steps=cfg.max_steps,
                            allow_empty=cfg.allow_empty, access_mode="binary" if cfg.binary else "any")
    if isinstance(result, ParseError):
        fail(result.message.replace("\n", " "))
    typer.echo(result.render() if render else render_json(result))
