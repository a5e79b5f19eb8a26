"""`conductor query`, `conductor report` and `conductor lake ...`: the lake from the command line.

The lake is a local directory or an s3:// URL (credentials and endpoint from the
AWS_* environment); ``--lake`` falls back to $CONDUCTOR_LAKE. ``conductor query`` is a lake-only, read-only
session (conductor/lake/queries.py ``sql``; docs/operations.md) unless ``--allow-files``. The options are
generated from the models of conductor/cli/lake_config.py.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import typer

from conductor.cli import app, fail
from conductor.cli.lake_config import ENGINES, FORMATS, KINDS, LAKE_ENV, QueryConfig, ReportConfig, StatsConfig
from conductor.cli.run_options import build_config, config_options

if TYPE_CHECKING:
    import polars as pl

    from conductor.lake.reader import Lake

lake_app = typer.Typer(help="Inspect the trajectory lake (stats, schema).", no_args_is_help=True)
app.add_typer(lake_app, name="lake")

_FORMAT_HELP = "table, csv or json."


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
@config_options(QueryConfig, envvar=LAKE_ENV)
def query(ctx: typer.Context,
          sql: str = typer.Argument(..., help="SQL over the views `trajectories` and `calls`."),
          format: str = typer.Option("table", "--format", "-f", help=_FORMAT_HELP),
          **options: Any) -> None:
    """Ad-hoc read-only SQL over the lake (one SELECT/WITH/DESCRIBE/SHOW/EXPLAIN; no file outside the lake);
    corrupt files are skipped with a warning naming them."""
    cfg = build_config(QueryConfig, ctx, None, options)
    if format not in FORMATS:
        fail(f"--format must be one of {', '.join(FORMATS)}, not {format!r}")
    if cfg.engine not in ENGINES:
        fail(f"--engine must be {' or '.join(ENGINES)}, not {cfg.engine!r}")
    from conductor.lake.queries import QueryRefused
    from conductor.lake.queries import sql as run_sql
    from conductor.lake.schema import LakeSchemaError

    if not sql.strip():
        fail("query: empty SQL")
    lk = _open(cfg.lake)
    try:
        df = run_sql(lk, sql, engine=cfg.engine, allow_files=cfg.allow_files)
    except (LakeSchemaError, QueryRefused) as e:
        fail(f"query refused: {e}" if isinstance(e, QueryRefused) else str(e))
    except Exception as e:  # noqa: BLE001 - SQL errors from duckdb/polars become one line
        fail(f"query failed: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}")
    _print(df, format)


@app.command("report")
@config_options(ReportConfig, envvar=LAKE_ENV)
def report(ctx: typer.Context, **options: Any) -> None:
    """Render the standard tables and plots (accuracy vs cost, workflow length, worker usage, failures)."""
    from pathlib import Path

    from conductor.lake.report import render_report
    from conductor.lake.schema import LakeSchemaError
    from conductor.run.preflight import UsageError, check_writable_dir

    cfg = build_config(ReportConfig, ctx, None, options)
    if cfg.kind is not None and cfg.kind not in KINDS:
        fail(f"--kind must be one of {', '.join(KINDS)}, not {cfg.kind!r}")
    try:
        check_writable_dir(Path(cfg.out), "--out")
    except UsageError as e:
        fail(str(e))
    lk = _open(cfg.lake)
    try:
        rep = render_report(lk, cfg.out, run_id=cfg.run, kind=cfg.kind)
    except LakeSchemaError as e:
        fail(str(e))
    except ValueError as e:
        fail(str(e))
    typer.echo(str(rep.markdown))
    for path in rep.plots.values():
        typer.echo(str(path))


@lake_app.command("stats")
@config_options(StatsConfig, envvar=LAKE_ENV)
def stats(ctx: typer.Context,
          format: str = typer.Option("table", "--format", "-f", help=_FORMAT_HELP),
          **options: Any) -> None:
    """Trajectories, questions, shards, accuracy and dollars per (kind, date, run_id)."""
    cfg = build_config(StatsConfig, ctx, None, options)
    run = cfg.run
    if format not in FORMATS:
        fail(f"--format must be one of {', '.join(FORMATS)}, not {format!r}")
    from conductor.lake.queries import lake_stats
    from conductor.lake.schema import LakeSchemaError

    lk = _open(cfg.lake)
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
