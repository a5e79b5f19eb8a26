"""`conductor lake compact`: rewrite a run's many small shard files into a few well-sized ones.

Joins the ``lake`` command group of ``query_cmd`` (stats, schema). Compaction is
atomic per output file and safe to interrupt (conductor/lake/compact.py).
"""

from __future__ import annotations

import typer

from conductor.cli import fail
from conductor.cli.query_cmd import lake_app


@lake_app.command("compact")
def compact_cmd(lake: str = typer.Option(..., "--lake", envvar="CONDUCTOR_LAKE",
                                         help="Lake root: a directory or s3://bucket/prefix."),
                run_id: str | None = typer.Option(None, "--run-id", help="Only this run (default: every run)."),
                kind: str | None = typer.Option(None, "--kind", help="Only rollout, eval or answer runs."),
                target_mb: float = typer.Option(128.0, "--target-mb", help="Size of the files written (MB).")) -> None:
    """Merge each partition's small files into files of about --target-mb; query results stay the same,
    and a rerun of the same `conductor answer` still finds every compacted shard done."""
    import logging
    import sys

    from conductor.lake.compact import compact
    from conductor.lake.schema import LakeSchemaError
    from conductor.lake.storage import open_location

    logging.basicConfig(level=logging.WARNING, format="warning: %(message)s", stream=sys.stderr)
    try:
        loc = open_location(lake)
        if loc.is_local and not loc.fs.exists(loc.root):
            fail(f"lake {lake}: no such directory")
        report = compact(loc, run_id=run_id, kind=kind, target_mb=target_mb)
    except (LakeSchemaError, ValueError, OSError) as e:
        fail(f"lake {lake}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    typer.echo(f"compacted {lake}{f' run {run_id}' if run_id else ''}: {report.line()}")


@lake_app.command("view")
def view_cmd(lake: list[str] = typer.Option(..., "--lake", envvar="CONDUCTOR_LAKE",
                                            help="Lake root (a directory or s3://bucket/prefix); repeat for several."),
             port: int = typer.Option(8765, "--port", help="Port on 127.0.0.1 (0: any free one)."),
             open_browser: bool = typer.Option(False, "--open", help="Open the page in the default browser.")) -> None:
    """Browse the lake in a local web page: runs, trajectories with filters, each workflow drawn as a graph,
    two runs compared question by question, training curves (loopback only; docs/lake-view.md)."""
    import logging
    import socket
    import sys

    from conductor.lake.schema import LakeSchemaError
    from conductor.lake.storage import open_location, s3_credentials_problem

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
    if open_browser:
        import webbrowser

        webbrowser.open(url)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


@lake_app.command("migrate")
def migrate_cmd(lake: str = typer.Option(..., "--lake", envvar="CONDUCTOR_LAKE",
                                         help="Lake root: a directory or s3://bucket/prefix.")) -> None:
    """Rewrite files of older schema versions with the current columns (new ones as nulls), atomically per file;
    for engines that read the files without this package. Idempotent."""
    import logging
    import sys

    from conductor.lake.schema import SCHEMA_VERSION, LakeSchemaError
    from conductor.lake.storage import open_location
    from conductor.lake.writer import migrate

    logging.basicConfig(level=logging.WARNING, format="warning: %(message)s", stream=sys.stderr)
    try:
        loc = open_location(lake)
        if loc.is_local and not loc.fs.exists(loc.root):
            fail(f"lake {lake}: no such directory")
        done = migrate(loc)
    except (LakeSchemaError, ValueError, OSError) as e:
        fail(f"lake {lake}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    typer.echo(f"migrated {lake} to schema v{SCHEMA_VERSION}: {done['migrated']} of {done['checked']} files rewritten")
