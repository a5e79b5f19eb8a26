"""What ``conductor query``, ``conductor report`` and ``conductor lake ...`` are set with: configuration models
(conductor/run/config.py's ``RunConfig``) whose fields the commands' options are generated from
(conductor/cli/run_options.py).

WHY here and not in conductor/lake/: a model there would import ``RunConfig`` from conductor/run/, a floor above
the lake (an import that runs back up the layering). These commands take no ``--config``: each is one look at a
lake, and ``$CONDUCTOR_LAKE`` (``LAKE_ENV``) already holds the one setting they share. What stays declared by
hand in the commands is what is not a setting: the SQL text, the table name, ``--format`` and ``--port``.
"""

from __future__ import annotations

from pydantic import Field

from conductor.run.config import RunConfig

LAKE_ENV = {"lake": "CONDUCTOR_LAKE"}     # every lake command's --lake falls back to this variable
FORMATS = ("table", "csv", "json")        # --format of query and lake stats (an output switch, not a setting)
KINDS = ("rollout", "eval", "answer", "served")
ENGINES = ("duckdb", "polars")


class LakeCommandConfig(RunConfig):
    """The lake a command reads (or rewrites)."""

    lake: str = Field(description="Lake root: a directory or s3://bucket/prefix.")


class QueryConfig(LakeCommandConfig):
    """``conductor query SQL``."""

    engine: str = Field("duckdb", description="duckdb (full SQL) or polars (SQLContext).")
    allow_files: bool = Field(False, description="The full DuckDB session: files outside the lake, COPY, ATTACH, "
                              "extensions (default: lake-only and read-only).")


class ReportConfig(LakeCommandConfig):
    """``conductor report``."""

    out: str = Field(description="Directory for report.md and the PNG plots.")
    run: str | None = Field(None, description="Only this run_id.")
    kind: str | None = Field(None, description="Only rollout, eval or answer rows.")


class StatsConfig(LakeCommandConfig):
    """``conductor lake stats``."""

    run: str | None = Field(None, description="Only this run_id.")


class CompactConfig(LakeCommandConfig):
    """``conductor lake compact``."""

    run_id: str | None = Field(None, description="Only this run (default: every run).")
    kind: str | None = Field(None, description="Only rollout, eval or answer runs.")
    target_mb: float = Field(128.0, description="Size of the files written (MB).")


class MigrateConfig(LakeCommandConfig):
    """``conductor lake migrate``."""


class ViewConfig(RunConfig):
    """``conductor lake view`` (its ``--port`` is where it listens, not a setting)."""

    lake: list[str] = Field(description="Lake root (a directory or s3://bucket/prefix); repeat for several.")
    open_browser: bool = Field(False, description="Open the page in the default browser.")
