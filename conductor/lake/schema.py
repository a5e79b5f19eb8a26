"""The lake's versioned Arrow schema, derived from the Trajectory/Round/CallRecord dataclasses.

Two tables share the Hive partition keys ``kind/date/run_id``:

* ``trajectories``: one row per trajectory. The root round (depth 0) is flattened
  into top-level columns (prompt, completion, token ids, log-probs, parse status,
  parsed ``steps``) because the trainer and most queries read exactly those;
  recursion rounds (depth >= 1) stay nested in ``recursion_rounds``. Convenient
  derived columns (n_calls, tokens, cost_usd, n_steps, ...) are precomputed.
* ``calls``: one flat row per worker call, joined by ``trajectory_id`` and carrying
  a few denormalised keys (dataset, domain, ...) so usage queries need no join.

The column list is built from the dataclasses, so a new dataclass field either
maps to a column automatically or fails loudly at import (see ``_ROOT_COLUMNS``).
Bump ``SCHEMA_VERSION`` whenever a column is added; never change a column's type
(see docs/schema.md, "Evolution policy").
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Union

import pyarrow as pa

from conductor.trajectory import CallRecord, Round, Trajectory

SCHEMA_VERSION = 3   # v2: conductor_s; v3: policy_version, advantage, used_in_training, unused_reason, calls.fault
PARTITION_KEYS: tuple[str, ...] = ("kind", "date", "run_id")
TABLES: tuple[str, ...] = ("trajectories", "calls")
METADATA_VERSION_KEY = b"conductor.schema_version"
METADATA_TABLE_KEY = b"conductor.table"
METADATA_WRITE_KEY = b"conductor.write_id"   # same value in a shard's calls and trajectories files

STEP_TYPE = pa.struct([
    pa.field("worker", pa.int32()),
    pa.field("subtask", pa.string()),
    pa.field("access", pa.list_(pa.int32())),   # explicit indices; empty when access_all
    pa.field("access_all", pa.bool_()),         # the workflow said "all"
])

# Per-field type choices the Python hints cannot express (sizes, unions).
_OVERRIDES: dict[tuple[str, str], pa.DataType] = {
    ("Round", "steps"): pa.list_(STEP_TYPE),
    ("Round", "completion_token_ids"): pa.list_(pa.int32()),    # vocab ids fit in int32
    ("Round", "completion_logprobs"): pa.list_(pa.float32()),   # backends compute them in fp32
    ("Round", "depth"): pa.int32(),
    ("CallRecord", "depth"): pa.int32(),
    ("CallRecord", "step"): pa.int32(),
    ("CallRecord", "worker_index"): pa.int32(),
    ("CallRecord", "access"): pa.list_(pa.int32()),
    ("CallRecord", "retries"): pa.int32(),
    ("Trajectory", "sample_index"): pa.int32(),
}

# Round field -> top-level column of the root round. Every Round field must be listed.
_ROOT_COLUMNS: dict[str, str | None] = {
    "depth": None,                       # always 0 for the root
    "prompt": "prompt",
    "completion": "completion",
    "completion_token_ids": "completion_token_ids",
    "completion_logprobs": "completion_logprobs",
    "parse_status": "parse_status",
    "parse_error": "parse_error",
    "steps": "steps",
    "final_answer": "root_final_answer",
    "kept_previous": "root_kept_previous",
}

# Trajectory fields that do not become trajectories columns as such.
_NOT_COLUMNS = {"rounds", "calls"} | set(PARTITION_KEYS)

# Columns computed from rounds and calls at write time (name, type, meaning).
DERIVED: tuple[tuple[str, pa.DataType], ...] = (
    ("n_steps", pa.int32()),          # steps in the root workflow
    ("n_rounds", pa.int32()),         # conductor rounds incl. the root
    ("recursion_depth", pa.int32()),  # deepest round
    ("n_calls", pa.int32()),
    ("n_cache_hits", pa.int32()),
    ("n_call_errors", pa.int32()),
    ("input_tokens", pa.int64()),
    ("output_tokens", pa.int64()),
    ("tokens", pa.int64()),           # input + output over all calls
    ("cost_usd", pa.float64()),       # dollars over all calls
)

# Trajectory columns copied onto every call row so usage queries need no join.
CALL_KEYS: tuple[str, ...] = ("trajectory_id", "question_id", "dataset", "domain",
                              "checkpoint_id", "pool_id", "sample_index")


class LakeSchemaError(ValueError):
    """A lake file whose schema the current code must not read (one line, names file and column)."""


def arrow_type(hint: Any, owner: str = "", name: str = "") -> tuple[pa.DataType, bool]:
    """Arrow type and nullability for a dataclass field's type hint.

    >>> arrow_type(list[int] | None)
    (ListType(list<item: int64>), True)
    >>> arrow_type(Literal["ok", "parse_error"])
    (DataType(string), False)
    """
    nullable = False
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        nullable = len(args) < len(typing.get_args(hint))
        hint = args[0] if len(args) == 1 else hint
        origin = typing.get_origin(hint)
    if (owner, name) in _OVERRIDES:
        return _OVERRIDES[(owner, name)], nullable
    if origin is Literal:
        return pa.string(), nullable
    if hint is bool:
        return pa.bool_(), nullable
    if hint is int:
        return pa.int64(), nullable
    if hint is float:
        return pa.float64(), nullable
    if hint is str:
        return pa.string(), nullable
    if origin is list:
        inner, _ = arrow_type(typing.get_args(hint)[0])
        return pa.list_(inner), nullable
    raise TypeError(f"{owner}.{name}: no Arrow type for {hint!r}; add it to conductor/lake/schema.py _OVERRIDES")


def _fields(cls: type, skip: set[str] = frozenset()) -> list[pa.Field]:  # type: ignore[assignment]
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        typ, nullable = arrow_type(hints[f.name], cls.__name__, f.name)
        out.append(pa.field(f.name, typ, nullable=nullable))
    return out


def _build() -> tuple[pa.Schema, pa.Schema, pa.DataType]:
    round_fields = _fields(Round)
    unmapped = [f.name for f in round_fields if f.name not in _ROOT_COLUMNS]
    if unmapped:
        raise TypeError(f"Round fields {unmapped} have no lake column; map them in _ROOT_COLUMNS")
    round_type = pa.struct(round_fields)
    part = [pa.field(k, pa.string(), nullable=False) for k in PARTITION_KEYS]
    version = pa.field("schema_version", pa.int16(), nullable=False)

    traj: list[pa.Field] = [*part, version]
    for f in _fields(Trajectory, skip=_NOT_COLUMNS):
        traj.append(f)
        if f.name == "gold":   # root-round columns read best right after the question
            for rf in round_fields:
                col = _ROOT_COLUMNS[rf.name]
                if col:
                    nullable = rf.nullable or col in ("prompt", "completion")  # null = no round ran
                    traj.append(pa.field(col, rf.type, nullable=nullable))
            traj.append(pa.field("recursion_rounds", pa.list_(round_type), nullable=False))
    traj += [pa.field(n, t, nullable=False) for n, t in DERIVED]

    by_name = {f.name: f for f in traj}
    calls: list[pa.Field] = [*part, version, *(by_name[k] for k in CALL_KEYS),
                             pa.field("call_index", pa.int32(), nullable=False), *_fields(CallRecord)]
    return pa.schema(traj), pa.schema(calls), round_type


TRAJECTORIES_SCHEMA, CALLS_SCHEMA, ROUND_TYPE = _build()
SCHEMAS: dict[str, pa.Schema] = {"trajectories": TRAJECTORIES_SCHEMA, "calls": CALLS_SCHEMA}


def file_schema(table: str, write_id: str = "") -> pa.Schema:
    """Schema of the Parquet files: the logical schema minus the Hive partition keys (they live in the path)."""
    s = SCHEMAS[table]
    s = pa.schema([f for f in s if f.name not in PARTITION_KEYS])
    meta = {METADATA_VERSION_KEY: str(SCHEMA_VERSION).encode(), METADATA_TABLE_KEY: table.encode()}
    if write_id:
        meta[METADATA_WRITE_KEY] = write_id.encode()
    return s.with_metadata(meta)


# ------------------------------------------------------------------ rows <-> records

def _step_row(step: dict[str, Any]) -> dict[str, Any]:
    access = step.get("access", [])
    is_all = access == "all"
    return {"worker": int(step["worker"]), "subtask": str(step["subtask"]),
            "access": [] if is_all else [int(a) for a in access], "access_all": is_all}


def _step_from_row(row: dict[str, Any]) -> dict[str, Any]:
    return {"worker": row["worker"], "subtask": row["subtask"],
            "access": "all" if row["access_all"] else list(row["access"] or [])}


_ROUND_NAMES = tuple(f.name for f in dataclasses.fields(Round))
_CALL_NAMES = tuple(f.name for f in dataclasses.fields(CallRecord))
_TRAJECTORY_NAMES = tuple(f.name for f in dataclasses.fields(Trajectory) if f.name not in ("rounds", "calls"))


def _shallow(obj: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """Like dataclasses.asdict without its deep copy (token-id lists are large; arrow only reads them).
    Read from the instance's ``__dict__``: a dict lookup per field, not an attribute lookup (the served lake
    writes every request)."""
    d = vars(obj)
    return {n: d[n] for n in names}


def _round_row(r: Round) -> dict[str, Any]:
    d = _shallow(r, _ROUND_NAMES)
    d["steps"] = [_step_row(s) for s in r.steps]
    return d


def trajectory_row(t: Trajectory) -> dict[str, Any]:
    """The trajectories-table row (partition keys included) for one record."""
    row = _shallow(t, _TRAJECTORY_NAMES)
    row["schema_version"] = SCHEMA_VERSION
    root = t.rounds[0] if t.rounds and t.rounds[0].depth == 0 else None
    if root is not None:
        rr = _round_row(root)
        for field_name, col in _ROOT_COLUMNS.items():
            if col:
                row[col] = rr[field_name]
    else:
        row.update(prompt=None, completion=None, completion_token_ids=None, completion_logprobs=None,
                   parse_status="not_run", parse_error=None, steps=[], root_final_answer=None,
                   root_kept_previous=False)
    row["recursion_rounds"] = [_round_row(r) for r in (t.rounds[1:] if root is not None else t.rounds)]
    inp, out = t.input_tokens, t.output_tokens
    row.update(n_steps=len(root.steps) if root else 0, n_rounds=len(t.rounds),
               recursion_depth=t.recursion_depth, n_calls=t.n_calls, n_cache_hits=t.n_cache_hits,
               n_call_errors=sum(1 for c in t.calls if c.error or c.error_kind),
               input_tokens=inp, output_tokens=out, tokens=inp + out, cost_usd=t.cost_usd)
    return row


def call_rows(t: Trajectory) -> list[dict[str, Any]]:
    """The calls-table rows for one record, in execution order (``call_index``)."""
    keys = {"kind": t.kind, "date": t.date, "run_id": t.run_id, "schema_version": SCHEMA_VERSION,
            **{k: getattr(t, k) for k in CALL_KEYS}}
    return [{**keys, "call_index": i, **_shallow(c, _CALL_NAMES)} for i, c in enumerate(t.calls)]


def _kwargs(cls: type, d: dict[str, Any], skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Constructor arguments from a row: a null (e.g. a column older files lack) falls back to the
    field's default; required fields are passed as they are."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        v = d.get(f.name)
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        if v is not None or not has_default:
            out[f.name] = v
    return out


def _round_from_row(d: dict[str, Any]) -> Round:
    kw = _kwargs(Round, d, skip=("steps",))
    kw["steps"] = [_step_from_row(s) for s in d.get("steps") or []]
    return Round(**kw)


def trajectory_from_row(row: dict[str, Any], calls: list[dict[str, Any]]) -> Trajectory:
    """Rebuild the record from a trajectories row and its call rows (nulls -> dataclass defaults).

    >>> t = Trajectory("id", "r", "rollout", "q", "ds", "math", "1+1?", date="2026-01-01",
    ...                rounds=[Round(0, "p", "c", [1, 2], [-0.5, -0.25], "ok", steps=[{"worker": 0,
    ...                "subtask": "s", "access": "all"}])])
    >>> trajectory_from_row(trajectory_row(t), []) == t
    True
    """
    kw = _kwargs(Trajectory, row, skip=("rounds", "calls"))
    rounds: list[Round] = []
    if row.get("prompt") is not None:
        root = {fn: row.get(col) for fn, col in _ROOT_COLUMNS.items() if col}
        root["depth"] = 0
        rounds.append(_round_from_row(root))
    rounds += [_round_from_row(r) for r in row.get("recursion_rounds") or []]
    kw["rounds"] = rounds
    kw["calls"] = [CallRecord(**_kwargs(CallRecord, c)) for c in sorted(calls, key=lambda c: c["call_index"])]
    return Trajectory(**kw)
