"""`conductor parse`: a conductor completion in, the workflow as one JSON object out."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from conductor.cli import app, fail


@app.command("parse")
def parse_cmd(
    file: str = typer.Argument("-", help="File holding a conductor completion, or - for standard input."),
    pool: Path = typer.Option(None, "--pool", help="Pool manifest: also check worker indices against it."),
    max_steps: int = typer.Option(5, "--max-steps", min=1, help="Most steps a workflow may have."),
    allow_empty: bool = typer.Option(False, "--allow-empty", help="Accept three empty lists (a recursion round)."),
    binary: bool = typer.Option(False, "--binary", help="Only \"all\" or [] access entries (the paper's default scheme)."),
    render: bool = typer.Option(False, "--render", help="Print the canonical three-list text instead of JSON."),
) -> None:
    """Parse a conductor output into {"steps": [{"worker", "subtask", "access"}]}; exit 2 with 'error:' if malformed."""
    from conductor.parser import ParseError, parse_workflow, render_json
    from conductor.workers.pool import PoolError, load_pool

    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        fail(f"{file}: cannot read: {getattr(e, 'strerror', None) or e}")
    n_workers = None
    if pool is not None:
        try:
            n_workers = len(load_pool(pool).workers)
        except PoolError as e:
            fail(str(e))
    result = parse_workflow(text, n_workers=n_workers, max_steps=max_steps, allow_empty=allow_empty,
                            access_mode="binary" if binary else "any")
    if isinstance(result, ParseError):
        fail(result.message.replace("\n", " "))
    typer.echo(result.render() if render else render_json(result))
