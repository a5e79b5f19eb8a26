"""`conductor query`, `conductor report` and `conductor lake ...`: the lake from the command line.

The lake is a local directory or an s3:// URL (credentials and endpoint from the
AWS_* environment); ``--lake`` falls back to $CONDUCTOR_LAKE. ``conductor query`` is a lake-only, read-only
session (conductor/lake/queries.py ``sql``; docs/operations.md) unless ``--allow-files``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer

from conductor.cli import app, fail

if TYPE_CHECKING:
    import polars as pl

    from conductor.lake.reader import Lake

lake_app = typer.Typer(help="Inspect the trajectory lake (stats, schema).", no_args_is_help=True)
app.add_typer(lake_app, name="lake")

_LAKE = typer.Option(..., "--lake", envvar="CONDUCTOR_LAKE", help="Lake root: a directory or s3://bucket/prefix.")
_FORMATS = ("table", "csv", "json")
_KINDS = ("rollout", "eval", "answer", "served")


def _open(lake: str) -> Lake:
    import logging

    from conductor.lake.reader import open_lake

    logging.basicConfig(level=logging.WARNING, format="warning: %(message)s", stream=sys.stderr)
    try:
        lk = open_lake(lake)
        loc = lk.location
        if loc.is_local and not loc.fs.exists(loc.root):
            fail(f"lake {lake}: no such directory")
        if loc.is_local and not loc.fs.isdir(loc.root):
            fail(f"lake {lake}: not a directory")
        if loc.is_local and not any(loc.fs.isdir(loc.path(t)) for t in ("trajectories", "calls")):
            fail(f"lake {lake}: not a lake (it has no trajectories/ or calls/ directory)")
        return lk
    except (OSError, ValueError) as e:
        fail(f"lake {lake}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")


def _csv_ready(df: pl.DataFrame) -> pl.DataFrame:
    """CSV has no nested values: list and struct columns (``steps``, ``subpool``, ...) become JSON text, which
    a spreadsheet shows and ``json.loads`` reads back, instead of polars refusing the whole result."""
    import json

    import polars as pl

    nested = [c for c, t in df.schema.items() if t.is_nested()]
    return df.with_columns(
        pl.Series(c, [None if v is None else json.dumps(v, default=str) for v in df[c].to_list()], dtype=pl.String)
        for c in nested)


def _print(df: pl.DataFrame, fmt: str) -> None:
    import polars as pl

    if fmt == "csv":
        sys.stdout.write(_csv_ready(df).write_csv())
    elif fmt == "json":
        sys.stdout.write(df.write_json() + "\n")
    else:
        with pl.Config(tbl_rows=200, tbl_cols=-1, tbl_width_chars=250, fmt_str_lengths=80,
                       tbl_hide_dataframe_shape=False):
            typer.echo(str(df))


@app.command("query")
def query(sql: str = typer.Argument(..., help="SQL over the views `trajectories` and `calls`."),
          lake: str = _LAKE,
          format: str = typer.Option("table", "--format", "-f", help="table, csv or json."),
          engine: str = typer.Option("duckdb", "--engine", help="duckdb (full SQL) or polars (SQLContext)."),
          allow_files: bool = typer.Option(False, "--allow-files", help="The full DuckDB session: files outside "
                                           "the lake, COPY, ATTACH, extensions (default: lake-only and read-only).")) -> None:
    """Ad-hoc read-only SQL over the lake (one SELECT/WITH/DESCRIBE/SHOW/EXPLAIN; no file outside the lake);
    corrupt files are skipped with a warning naming them."""
    if format not in _FORMATS:
        fail(f"--format must be one of {', '.join(_FORMATS)}, not {format!r}")
    if engine not in ("duckdb", "polars"):
        fail(f"--engine must be duckdb or polars, not {engine!r}")
    from conductor.lake.queries import QueryRefused
    from conductor.lake.queries import sql as run_sql
    from conductor.lake.schema import LakeSchemaError

    if not sql.strip():
        fail("query: empty SQL")
    lk = _open(lake)
    try:
        df = run_sql(lk, sql, engine=engine, allow_files=allow_files)
    except (LakeSchemaError, QueryRefused) as e:
        fail(f"query refused: {e}" if isinstance(e, QueryRefused) else str(e))
    except Exception as e:  # noqa: BLE001 - SQL errors from duckdb/polars become one line
        fail(f"query failed: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}")
    _print(df, format)


@app.command("report")
def report(lake: str = _LAKE,
           out: str = typer.Option(..., "--out", help="Directory for report.md and the PNG plots."),
           run: str | None = typer.Option(None, "--run", help="Only this run_id."),
           kind: str | None = typer.Option(None, "--kind", help="Only rollout, eval or answer rows.")) -> None:
    """Render the standard tables and plots (accuracy vs cost, workflow length, worker usage, failures)."""
    from pathlib import Path

    from conductor.lake.report import render_report
    from conductor.lake.schema import LakeSchemaError
    from conductor.run.preflight import UsageError, check_writable_dir

    if kind is not None and kind not in _KINDS:
        fail(f"--kind must be one of {', '.join(_KINDS)}, not {kind!r}")
    try:
        check_writable_dir(Path(out), "--out")
    except UsageError as e:
        fail(str(e))
    lk = _open(lake)
    try:
        rep = render_report(lk, out, run_id=run, kind=kind)
    except LakeSchemaError as e:
        fail(str(e))
    except ValueError as e:
        fail(str(e))
    typer.echo(str(rep.markdown))
    for path in rep.plots.values():
        typer.echo(str(path))


@lake_app.command("stats")
def stats(lake: str = _LAKE,
          run: str | None = typer.Option(None, "--run", help="Only this run_id."),
          format: str = typer.Option("table", "--format", "-f", help="table, csv or json.")) -> None:
    """Trajectories, questions, shards, accuracy and dollars per (kind, date, run_id)."""
    if format not in _FORMATS:
        fail(f"--format must be one of {', '.join(_FORMATS)}, not {format!r}")
    from conductor.lake.queries import lake_stats
    from conductor.lake.schema import LakeSchemaError

    lk = _open(lake)
    try:
        df = lake_stats(lk, run_id=run)
        n_files = {t: len(lk.list_files(t, run_id=run)) for t in ("trajectories", "calls")}
    except (LakeSchemaError, ValueError) as e:
        fail(str(e))
    _print(df, format)
    if format == "table":
        typer.echo(f"files: {n_files['trajectories']} trajectories, {n_files['calls']} calls; "
                   f"skipped corrupt: {len(lk.skipped)}")


@lake_app.command("schema")
def schema(table: str = typer.Argument("trajectories", help="trajectories or calls")) -> None:
    """Print the current schema (version, columns, Arrow types) of one lake table."""
    from conductor.lake.schema import SCHEMA_VERSION, SCHEMAS

    if table not in SCHEMAS:
        fail(f"unknown table {table!r}; tables are {', '.join(SCHEMAS)}")
    typer.echo(f"# {table}, schema v{SCHEMA_VERSION}")
    for f in SCHEMAS[table]:
        typer.echo(f"{f.name}\t{f.type}{'' if f.nullable else ' not null'}")
