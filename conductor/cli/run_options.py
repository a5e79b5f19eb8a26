"""A run configuration from a command's options and ``--config FILE``: the options typed on the command line
override the file, the file overrides the configuration's defaults (conductor/run/config.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import typer

from conductor.cli import fail
from conductor.run.config import ConfigError, RunConfig

C = TypeVar("C", bound=RunConfig)

CONFIG_HELP = ("A YAML run configuration (docs/run-config.md); options given on the command line override its "
               "values.")


def default(cls: type[RunConfig], name: str) -> Any:
    """The configuration's default for a field, so an option's shown default is the one the run uses."""
    return cls.model_fields[name].default


def build_config(cls: type[C], ctx: typer.Context, config: Path | None, values: Mapping[str, Any],
                 fields: Mapping[str, str] | None = None) -> C:
    """``cls`` from ``--config`` and the options typed on the command line (``values``: parameter name ->
    value; ``fields`` renames a parameter to its field). Bad values: one ``error:`` line, exit 2."""
    fields = dict(fields or {})
    given: dict[str, Any] = {}
    flags: dict[str, str] = {}
    for name, value in values.items():
        field = fields.get(name, name)
        flags[field] = _flag(ctx, name)
        source = ctx.get_parameter_source(name)   # by name: typer may carry its own copy of click's enum
        if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP"):
            given[field] = str(value) if isinstance(value, os.PathLike) else value
    try:
        return cls.build(config, given, flags)
    except ConfigError as e:
        fail(str(e))
    raise AssertionError("unreachable")  # pragma: no cover  (fail raises)


def _flag(ctx: typer.Context, name: str) -> str:
    """How the user wrote a parameter: ``--shard-size`` for an option, ``QUESTIONS`` for an argument."""
    for p in ctx.command.params:
        if p.name == name:
            longs = [o for o in p.opts if o.startswith("--")]
            return longs[0] if longs else name.upper()
    return name
