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
