"""`conductor lake compact`: rewrite a run's many small shard files into a few well-sized ones.

Joins the ``lake`` command group of ``query_cmd`` (stats, schema). Compaction is
atomic per output file and safe to interrupt (conductor/lake/compact.py). The options are generated from the
models of conductor/cli/lake_config.py.
"""

from __future__ import annotations

from typing import Any

import typer

from conductor.cli import fail
from conductor.cli.lake_config import LAKE_ENV, CompactConfig, MigrateConfig, ViewConfig
from conductor.cli.query_cmd import lake_app
from conductor.cli.run_options import build_config, config_options


@lake_app.command("compact")
@config_options(CompactConfig, envvar=LAKE_ENV)
def compact_cmd(ctx: typer.Context, **options: Any) -> None:
    """Merge each partition's small files into files of about --target-mb; query results stay the same,
    and a rerun of the same `conductor answer` still finds every compacted shard done."""
    import logging
    import sys

    from conductor.lake.compact import compact
    from conductor.lake.schema import LakeSchemaError
    from conductor.lake.storage import open_location

    cfg = build_config(CompactConfig, ctx, None, options)
    lake, run_id = cfg.lake, cfg.run_id
    logging.basicConfig(level=logging.WARNING, format="warning: %(message)s", stream=sys.stderr)
    try:
        loc = open_location(lake)
        if loc.is_local and not loc.fs.exists(loc.root):
            fail(f"lake {lake}: no such directory")
        report = compact(loc, run_id=run_id, kind=cfg.kind, target_mb=cfg.target_mb)
    except (LakeSchemaError, ValueError, OSError) as e:
        fail(f"lake {lake}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    typer.echo(f"compacted {lake}{f' run {run_id}' if run_id else ''}: {report.line()}")


@lake_app.command("view")
@config_options(ViewConfig, repeat=("lake",), envvar=LAKE_ENV, flags={"open_browser": "--open"})
def view_cmd(ctx: typer.Context,
             port: int = typer.Option(8765, "--port", help="Port on 127.0.0.1 (0: any free one)."),
             **options: Any) -> None:
    """Browse the lake in a local web page: runs, trajectories with filters, each workflow drawn as a graph,
    two runs compared question by question, training curves (loopback only; docs/lake-view.md)."""
    import logging
    import socket
    import sys

    from conductor.lake.schema import LakeSchemaError
    from conductor.lake.storage import open_location, s3_credentials_problem

    cfg = build_config(ViewConfig, ctx, None, options)
    lake = cfg.lake
    logging.basicConfig(level=logging.WARNING, format="warning: %(message)s", stream=sys.stderr)
    for root in lake:
        if problem := s3_credentials_problem(root):   # before any network use (DNS, the credentials chain)
            fail(f"lake {root}: {problem}")
        loc = open_location(root)
        if loc.is_local and not loc.fs.exists(loc.root):
            fail(f"lake {root}: no such directory")
    if not 0 <= port <= 65535:
        fail(f"--port: {port} is not a port number (0-65535)")
    try:
        import uvicorn

        from conductor.lake.view.app import create_app
    except ImportError as e:
        fail(f"lake view needs the lake extra ({e.name} is missing): pip install 'conductor-orchestra[lake]'")
    try:
        app = create_app(list(lake))
    except (LakeSchemaError, ValueError, OSError) as e:
        fail(f"lake {', '.join(lake)}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as e:
        fail(f"--port {port}: cannot listen on 127.0.0.1 ({e.strerror})")
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    typer.echo(f"lake view of {', '.join(lake)} at {url} (Ctrl-C stops it)")
    if cfg.open_browser:
        import webbrowser

        webbrowser.open(url)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


@lake_app.command("migrate")
@config_options(MigrateConfig, envvar=LAKE_ENV)
def migrate_cmd(ctx: typer.Context, **options: Any) -> None:
    """Rewrite files of older schema versions with the current columns (new ones as nulls), atomically per file;
    for engines that read the files without this package. Idempotent."""
    import logging
    import sys

    from conductor.lake.schema import SCHEMA_VERSION, LakeSchemaError
    from conductor.lake.storage import open_location
    from conductor.lake.writer import migrate

    lake = build_config(MigrateConfig, ctx, None, options).lake
    logging.basicConfig(level=logging.WARNING, format="warning: %(message)s", stream=sys.stderr)
    try:
        loc = open_location(lake)
        if loc.is_local and not loc.fs.exists(loc.root):
            fail(f"lake {lake}: no such directory")
        done = migrate(loc)
    except (LakeSchemaError, ValueError, OSError) as e:
        fail(f"lake {lake}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    typer.echo(f"migrated {lake} to schema v{SCHEMA_VERSION}: {done['migrated']} of {done['checked']} files rewritten")
