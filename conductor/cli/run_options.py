"""A run configuration from a command's options and ``--config FILE``: the options typed on the command line
override the file, the file overrides the configuration's defaults (conductor/run/config.py).

WHY the options are generated: each setting is named once, as a field of the configuration model (its name,
default, bounds and ``description``); ``config_options`` turns the fields into the command's typer options, the
way TRL's ``TrlParser`` turns dataclass fields into argparse options, so an option, its shown default, its help
and the YAML field can never drift apart (docs/run-config.md)."""

from __future__ import annotations

import functools
import inspect
import os
import types
import typing
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import annotated_types
import typer
from pydantic.fields import FieldInfo

from conductor.cli import fail
from conductor.run.config import ConfigError, RunConfig, TextOption

C = TypeVar("C", bound=RunConfig)
F = TypeVar("F", bound=Callable[..., Any])

CONFIG_HELP = ("A YAML run configuration (docs/run-config.md); options given on the command line override its "
               "values.")

_SCALARS = (bool, int, float, str)


def config_options(cls: type[RunConfig], *, argument: str | None = None, flags: Mapping[str, str] | None = None,
                   exclude: Collection[str] = (), bounds: bool = True, repeat: Collection[str] = (),
                   envvar: Mapping[str, str] | None = None, file: bool | None = None) -> Callable[[F], F]:
    """Decorate a typer command so its parameters are ``cls``'s fields, then the function's own parameters.

    The function takes ``**options`` for the generated ones (field name -> value; pass them to
    ``build_config``). ``argument``: the field given positionally; ``flags``: a field's option
    declaration when it is not ``--field-name`` (``"--batch-poll"``, ``"--constrained/--free"``; a boolean that
    defaults to true gets ``--name/--no-name``); ``exclude``:
    fields only a ``--config`` file sets; ``bounds``: click checks (and the help shows) a field's ``ge``/``le``
    bounds; without, the model checks them and a bad number is one ``error:`` line however the command is invoked.
    Fields that hold a mapping or a list are never options (a command
    declares its own, e.g. ``--grpo JSON``), except the lists named in ``repeat``: a repeatable option
    (``--only A --only B``); any other non-scalar type (a typed spec) is typed as text. ``envvar``: the variable a
    field's option falls back to. A command without a ``config`` parameter (no ``--config``) has its required
    fields as required options: click names the one missing; ``file=False`` says so for a command whose
    ``--config`` is another kind of file (``train-step``: a GRPO config). A list or mapping field whose type is
    marked ``TextOption`` (``CommaList``, ``GRPOOverrides``) is an option too: its validator parses the text."""

    def wrap(fn: F) -> F:
        own = list(inspect.signature(fn, eval_str=True).parameters.values())
        head = [p for p in own if p.annotation is typer.Context]
        tail = [p for p in own if p.annotation is not typer.Context and p.kind is not inspect.Parameter.VAR_KEYWORD]
        reads_file = any(p.name == "config" for p in own) if file is None else file
        generated = [option_parameter(name, field, argument=name == argument, decl=(flags or {}).get(name),
                                      bounds=bounds, repeat=name in repeat, envvar=(envvar or {}).get(name),
                                      file=reads_file)
                     for name, field in cls.model_fields.items()
                     if name not in exclude and (name in repeat or cli_type(field.annotation) is not None)]

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            return fn(**kwargs)

        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in (*head, *generated, *tail)]
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command  # type: ignore[return-value]

    return wrap


def option_parameter(name: str, field: FieldInfo, *, argument: bool = False, decl: str | None = None,
                     bounds: bool = True, repeat: bool = False, envvar: str | None = None,
                     file: bool = True) -> inspect.Parameter:
    """One typer parameter from a configuration field: its default, ``min`` from ``ge``, help from ``description``.

    A required field defaults to None on the command line: the value may come from ``--config`` (``file``), and
    the model says it is missing when neither gives it; without ``--config`` the option itself is required.
    ``repeat``: a list field as a repeatable option."""
    required = field.is_required()
    default = None if required else field.get_default(call_default_factory=True)
    if required and not file:
        default = ...                   # click says "Missing option" (no file could give it)
    elif repeat:
        default = list(default or [])
    elif not isinstance(default, (*_SCALARS, type(None))):
        default = str(default)          # a typed value (a conductor spec): its text, which the model parses back
    flag = "--" + name.replace("_", "-")
    if decl is None and default is True:
        decl = f"{flag}/--no-{flag[2:]}"   # a flag that is on by default can be turned off
    text = field.description or ""
    if required and file:
        text = f"{text.rstrip('.')} (or `{name}:` in --config).".strip()
    if argument:
        info = typer.Argument(default, show_default=False, help=text)
    else:
        info = typer.Option(default, decl or flag, help=text or None, show_default=not required, envvar=envvar,
                            min=_bound(field, annotated_types.Ge) if bounds else None,
                            max=_bound(field, annotated_types.Le) if bounds else None)
    kind = _item_type(field.annotation) if repeat else cli_type(field.annotation)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info,
                             annotation=list[kind] if repeat else kind)  # type: ignore[valid-type]


def _bound(field: FieldInfo, kind: type[annotated_types.Ge] | type[annotated_types.Le]) -> int | float | None:
    """The field's ``ge`` (or ``le``) bound, shown and checked by the option as its ``min`` (or ``max``)."""
    for m in field.metadata:
        if isinstance(m, kind):
            value = m.ge if isinstance(m, annotated_types.Ge) else m.le
            return value if isinstance(value, (int, float)) else None
    return None


def cli_type(annotation: Any) -> type | None:
    """The command-line type of a field: its scalar type (``int | None`` -> int); None for a mapping or list (not
    an option); text for anything else, which the model parses.

    >>> cli_type(int | None), cli_type(bool), cli_type(dict[str, int] | None), cli_type(list[str])
    (<class 'int'>, <class 'bool'>, None, None)
    >>> cli_type(typing.Annotated[float, "gt 0"] | None), cli_type(typing.Annotated[list[str], TextOption()])
    (<class 'float'>, <class 'str'>)
    """
    for _ in range(2):   # Annotated[X | None, ...], or Positive | None: the type inside
        if typing.get_origin(annotation) is typing.Annotated:
            if any(isinstance(m, TextOption) for m in annotation.__metadata__):
                return str                                  # a list or mapping its validator parses from text
            annotation = typing.get_args(annotation)[0]
        annotation = _without_none(annotation)
    if annotation in _SCALARS:
        return annotation
    if typing.get_origin(annotation) in (dict, list, tuple, set, Mapping) or annotation in (dict, list):
        return None
    return str


def _without_none(annotation: Any) -> Any:
    """``X | None`` -> X; anything else as it is."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return annotation


def _item_type(annotation: Any) -> type:
    """The scalar type of a list field's items (``list[str] | None`` -> str)."""
    items = typing.get_args(_without_none(annotation))
    return items[0] if items and items[0] in _SCALARS else str


def build_config(cls: type[C], ctx: typer.Context, config: Path | None, values: Mapping[str, Any],
                 fields: Mapping[str, str] | None = None, error: Callable[[str], NoReturn] = fail) -> C:
    """``cls`` from ``--config`` and the options typed on the command line (``values``: parameter name ->
    value; ``fields`` renames a parameter to its field). Bad values: one ``error:`` line (``error``), exit 2."""
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
        error(str(e))
    raise AssertionError("unreachable")  # pragma: no cover  (fail raises)


def _flag(ctx: typer.Context, name: str) -> str:
    """How the user wrote a parameter: ``--shard-size`` for an option, ``QUESTIONS`` for an argument."""
    for p in ctx.command.params:
        if p.name == name:
            longs = [o for o in p.opts if o.startswith("--")]
            return longs[0] if longs else name.upper()
    return name
