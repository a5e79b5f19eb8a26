"""The data teams' standard questions, as functions returning polars DataFrames.

Every function takes a lake (path, s3:// URL or an opened ``Lake``) and optional
partition filters (``kind``, ``date``, ``run_id``) that prune files before any
is opened; the rest runs as one lazy polars query with projection pushdown, so
only the few columns a question needs are read. ``sql`` answers ad-hoc questions
with DuckDB over the same validated files (views ``trajectories`` and ``calls``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Protocol

import polars as pl

from conductor.lake.reader import HIVE_SCHEMA, Lake, open_lake
from conductor.lake.schema import PARTITION_KEYS, SCHEMAS

TRAJECTORY_GROUPS = ("dataset", "domain", "pool_id", "checkpoint_id", "run_id", "kind", "date")


def _outcome_aggs() -> list[pl.Expr]:
    return [
        pl.len().alias("n"),
        pl.col("correct").count().alias("n_graded"),
        pl.col("correct").mean().alias("accuracy"),
        pl.col("reward").mean().alias("mean_reward"),
        (pl.col("parse_status") == "ok").mean().alias("parse_ok_rate"),
        pl.col("infra_failed").sum().alias("n_infra_failed"),
        pl.col("cost_usd").mean().alias("mean_cost_usd"),
    ]


def accuracy_by(lake: str | Lake, by: str | list[str] = "dataset", **where: str | None) -> pl.DataFrame:
    """Accuracy (over graded trajectories), mean reward, parse rate and cost per group.

    ``by`` is any trajectory column (dataset, domain, pool_id, checkpoint_id, run_id, ...),
    or ``"worker"`` / ``"final_worker"`` (see ``accuracy_by_worker``).
    """
    keys = [by] if isinstance(by, str) else list(by)
    if keys in (["worker"], ["final_worker"]):
        return accuracy_by_worker(lake, final=keys == ["final_worker"], **where)
    lf = open_lake(lake).scan("trajectories", **where)
    return lf.group_by(keys).agg(_outcome_aggs()).sort(keys).collect()


def accuracy_by_worker(lake: str | Lake, final: bool = False, **where: str | None) -> pl.DataFrame:
    """Outcomes of trajectories that used each worker (``final=True``: whose last call was that worker).

    A trajectory using two workers counts once for each; the last call is the one
    at the deepest recursion round and the highest step (the answer's author).
    """
    lk = open_lake(lake)
    calls = lk.scan("calls", **where).select("trajectory_id", "worker", "depth", "step")
    if final:
        used = calls.sort(["trajectory_id", "depth", "step"]).group_by("trajectory_id").agg(
            pl.col("worker").last())
        key = "final_worker"
        used = used.rename({"worker": key})
    else:
        used = calls.select("trajectory_id", "worker").unique()
        key = "worker"
    traj = lk.scan("trajectories", **where).select(
        "trajectory_id", "correct", "reward", "parse_status", "infra_failed", "cost_usd")
    return used.join(traj, on="trajectory_id").group_by(key).agg(_outcome_aggs()).sort(key).collect()


def cost_per_question(lake: str | Lake, **where: str | None) -> pl.DataFrame:
    """Calls, tokens and dollars per question (mean over its samples), most expensive first."""
    lf = open_lake(lake).scan("trajectories", **where)
    return (lf.group_by("dataset", "question_id")
            .agg(pl.len().alias("n_samples"),
                 pl.col("n_calls").mean().alias("mean_calls"),
                 pl.col("tokens").mean().alias("mean_tokens"),
                 pl.col("cost_usd").mean().alias("mean_cost_usd"),
                 pl.col("cost_usd").sum().alias("total_cost_usd"),
                 pl.col("correct").mean().alias("accuracy"))
            .sort(["mean_cost_usd", "question_id"], descending=[True, False]).collect())


def cost_summary(lake: str | Lake, by: str | list[str] = "dataset", **where: str | None) -> pl.DataFrame:
    """Per group: questions, trajectories, mean calls/tokens/dollars per trajectory, total dollars."""
    keys = [by] if isinstance(by, str) else list(by)
    lf = open_lake(lake).scan("trajectories", **where)
    return (lf.group_by(keys)
            .agg(pl.col("question_id").n_unique().alias("n_questions"),
                 pl.len().alias("n_trajectories"),
                 pl.col("n_calls").mean().alias("calls_per_trajectory"),
                 pl.col("tokens").mean().alias("tokens_per_trajectory"),
                 pl.col("cost_usd").mean().alias("dollars_per_trajectory"),
                 pl.col("cost_usd").sum().alias("total_dollars"))
            .sort(keys).collect())


def worker_usage(lake: str | Lake, by: str | list[str] = "domain", root_only: bool = True,
                 **where: str | None) -> pl.DataFrame:
    """Share of calls going to each worker within each group (``by="step"``: by step position).

    ``root_only`` keeps depth-0 calls, so step positions mean the same thing across rows.
    """
    keys = [by] if isinstance(by, str) else list(by)
    lf = open_lake(lake).scan("calls", **where)
    if root_only:
        lf = lf.filter(pl.col("depth") == 0)
    counts = lf.group_by([*keys, "worker"]).agg(pl.len().alias("n_calls"))
    return (counts.with_columns((pl.col("n_calls") / pl.col("n_calls").sum().over(keys)).alias("share"))
            .sort([*keys, "share", "worker"], descending=[*([False] * len(keys)), True, False]).collect())


def workflow_length(lake: str | Lake, by: str = "domain", **where: str | None) -> pl.DataFrame:
    """Distribution of root workflow length (steps) per group, over parsed workflows."""
    lf = open_lake(lake).scan("trajectories", **where).filter(pl.col("parse_status") == "ok")
    counts = lf.group_by(by, "n_steps").agg(pl.len().alias("n"))
    return (counts.with_columns((pl.col("n") / pl.col("n").sum().over(by)).alias("share"))
            .sort([by, "n_steps"]).collect())


def _reason_class(col: str) -> pl.Expr:
    """The part before the first ':' (parse errors and infra causes are stored as 'class: detail')."""
    return (pl.col(col).str.split(":").list.first().str.strip_chars().str.to_lowercase()
            .fill_null("unknown").replace("", "unknown"))


def failure_taxonomy(lake: str | Lake, **where: str | None) -> pl.DataFrame:
    """Failures by source and class: parse errors by reason, infra causes, worker-call error kinds.

    ``share`` is relative to all trajectories (all calls for ``source == "call"``).
    """
    lk = open_lake(lake)
    traj = lk.scan("trajectories", **where).select("parse_status", "parse_error", "infra_failed", "infra_cause")
    n_traj = traj.select(pl.len()).collect().item()
    parse = (traj.filter(pl.col("parse_status").is_in(["parse_error", "invalid"]))
             .group_by(pl.col("parse_status").alias("source"), _reason_class("parse_error").alias("cls"))
             .agg(pl.len().alias("n")))
    infra = (traj.filter(pl.col("infra_failed"))
             .group_by(pl.lit("infra").alias("source"), _reason_class("infra_cause").alias("cls"))
             .agg(pl.len().alias("n")))
    calls = lk.scan("calls", **where).select("error", "error_kind")
    n_calls = calls.select(pl.len()).collect().item()
    call_err = (calls.filter(pl.col("error").is_not_null() | pl.col("error_kind").is_not_null())
                .group_by(pl.lit("call").alias("source"), pl.col("error_kind").fill_null("unknown").alias("cls"))
                .agg(pl.len().alias("n")))
    frames = [f.with_columns(pl.col("n").cast(pl.Int64)) for f in pl.collect_all([parse, infra, call_err])]
    out = pl.concat(frames)
    denom = pl.when(pl.col("source") == "call").then(pl.lit(max(n_calls, 1))).otherwise(pl.lit(max(n_traj, 1)))
    return (out.with_columns((pl.col("n") / denom).alias("share"))
            .sort(["source", "n", "cls"], descending=[False, True, False]))


def accuracy_vs_cost(lake: str | Lake, by: str | Sequence[str] = ("run_id", "checkpoint_id", "dataset"),
                     **where: str | None) -> pl.DataFrame:
    """Accuracy against dollars per question (mean over its samples): the cost/quality frontier."""
    keys = [by] if isinstance(by, str) else list(by)
    lf = open_lake(lake).scan("trajectories", **where)
    return (lf.group_by(keys)
            .agg(pl.col("question_id").n_unique().alias("n_questions"),
                 pl.len().alias("n"),
                 pl.col("correct").mean().alias("accuracy"),
                 pl.col("cost_usd").mean().alias("dollars_per_question"),
                 pl.col("tokens").mean().alias("tokens_per_question"),
                 (pl.col("wall_s") + pl.col("conductor_s").fill_null(0)).mean().alias("seconds_per_question"))
            .sort(keys).collect())


def lake_stats(lake: str | Lake, **where: str | None) -> pl.DataFrame:
    """What the lake holds: per (kind, date, run_id) trajectories, questions, shards, accuracy, dollars."""
    lk = open_lake(lake)
    lf = lk.scan("trajectories", **where)
    return (lf.group_by(list(PARTITION_KEYS))
            .agg(pl.len().alias("n_trajectories"),
                 pl.col("question_id").n_unique().alias("n_questions"),
                 pl.col("shard").n_unique().alias("n_shards"),
                 pl.col("correct").mean().alias("accuracy"),
                 pl.col("cost_usd").sum().alias("total_dollars"))
            .sort(list(PARTITION_KEYS)).collect())


class StandardQuery(Protocol):
    """One of the standard questions: a lake and partition filters in, one table out."""

    def __call__(self, lake: str | Lake, **where: str | None) -> pl.DataFrame: ...


STANDARD_QUERIES: dict[str, StandardQuery] = {
    "accuracy_by_dataset": lambda lake, **w: accuracy_by(lake, "dataset", **w),
    "accuracy_by_pool": lambda lake, **w: accuracy_by(lake, "pool_id", **w),
    "accuracy_by_checkpoint": lambda lake, **w: accuracy_by(lake, "checkpoint_id", **w),
    "accuracy_by_worker": lambda lake, **w: accuracy_by_worker(lake, **w),
    "cost_per_question": cost_per_question,
    "worker_usage_by_domain": lambda lake, **w: worker_usage(lake, "domain", **w),
    "worker_usage_by_step": lambda lake, **w: worker_usage(lake, "step", **w),
    "workflow_length_by_domain": lambda lake, **w: workflow_length(lake, "domain", **w),
    "failure_taxonomy": failure_taxonomy,
    "accuracy_vs_cost": lambda lake, **w: accuracy_vs_cost(lake, ("run_id", "checkpoint_id", "dataset"), **w),
}


def standard_report(lake: str | Lake, **where: str | None) -> dict[str, pl.DataFrame]:
    """All standard questions at once (the nightly report's tables)."""
    lk = open_lake(lake)
    return {name: fn(lk, **where) for name, fn in STANDARD_QUERIES.items()}


# ------------------------------------------------------------------ ad-hoc SQL

class QueryRefused(ValueError):
    """A query the lake-only session does not run (a write, a file outside the lake, more than one statement)."""


# Statements a read-only session runs: SELECT covers WITH, FROM-first, DESCRIBE, SHOW and SUMMARIZE.
_READ_ONLY = ("SELECT", "EXPLAIN")
_POLARS_FILE_FUNCS = re.compile(r"\bread_\w+\s*\(|\bscan_\w+\s*\(", re.IGNORECASE)
_POLARS_READ_ONLY = re.compile(r"^\s*\(*\s*(SELECT|WITH|FROM|SHOW|DESCRIBE|EXPLAIN)\b", re.IGNORECASE)


def sql(lake: str | Lake, query: str, *, storage_options: dict[str, Any] | None = None,
        engine: str = "duckdb", allow_files: bool = False) -> pl.DataFrame:
    """Run one SQL query over the views ``trajectories`` and ``calls``.

    DuckDB reads the validated file list itself (corrupt files already skipped,
    ``union_by_name`` for older files; a typed empty table guarantees every
    current column exists). ``engine="polars"`` uses polars' SQLContext instead.

    The session is lake-only and read-only unless ``allow_files``: the views are registered first, then
    DuckDB's external access is switched off with only the lake's directory allowed, extension install and
    autoload are off and the configuration is locked; one ``SELECT``/``WITH``/``DESCRIBE``/``SHOW``/``EXPLAIN``
    statement runs (``QueryRefused`` otherwise). Polars' file-reading table functions are refused too.
    """
    if not query.strip():
        raise QueryRefused("empty query")
    lk = open_lake(lake, storage_options)
    if engine == "polars":
        if not allow_files:
            if _POLARS_FILE_FUNCS.search(query):
                raise QueryRefused("reading files is off in the lake-only session (table functions read_*/scan_*); "
                                   "--allow-files turns it on")
            if not _POLARS_READ_ONLY.match(query):
                raise QueryRefused("only SELECT, WITH, SHOW, DESCRIBE and EXPLAIN run in the lake-only session")
        ctx = pl.SQLContext({t: lk.scan(t) for t in SCHEMAS}, eager=False)
        return ctx.execute(query).collect()
    if engine != "duckdb":
        raise ValueError(f"engine must be 'duckdb' or 'polars', not {engine!r}")
    import duckdb

    if not allow_files:
        try:
            statements = duckdb.extract_statements(query)
        except duckdb.Error as e:
            raise QueryRefused(f"cannot parse: {str(e).strip().splitlines()[0]}") from None
        if len(statements) != 1:
            raise QueryRefused(f"one statement per query, not {len(statements)}")
        kind = statements[0].type.name
        if kind not in _READ_ONLY:
            raise QueryRefused(f"{kind} statements do not run in the lake-only session (only SELECT, WITH, "
                               "DESCRIBE, SHOW and EXPLAIN); --allow-files gives the full DuckDB session")
    con = duckdb.connect(config={} if allow_files else {"autoinstall_known_extensions": False,
                                                        "autoload_known_extensions": False})
    try:
        if not lk.location.is_local:
            con.register_filesystem(lk.location.fs)
        hive_types = "{" + ", ".join(f"'{k}': 'VARCHAR'" for k in HIVE_SCHEMA) + "}"
        for table, schema in SCHEMAS.items():
            con.register(f"_empty_{table}", schema.empty_table())
            files = lk.list_files(table)
            if files:
                listing = "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in files) + "]"
                con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet({listing}, hive_partitioning=true, "
                            f"union_by_name=true, hive_types={hive_types}) "
                            f"UNION ALL BY NAME SELECT * FROM _empty_{table}")
            else:
                con.execute(f"CREATE VIEW {table} AS SELECT * FROM _empty_{table}")
        if not allow_files:   # views first, then the walls: only the lake's files, no extensions, locked
            loc = lk.location
            roots = {loc.root.rstrip("/") + "/"}
            if not loc.is_local:
                roots.add(f"{loc.protocol}://{loc.root.rstrip('/')}/")
            listing = "[" + ", ".join("'" + r.replace("'", "''") + "'" for r in sorted(roots)) + "]"
            con.execute(f"SET allowed_directories={listing}")
            con.execute("SET enable_external_access=false")
            con.execute("SET lock_configuration=true")
        return con.sql(query).pl()
    finally:
        con.close()
