"""Reading the lake: validated file lists, polars lazy scans, and records for the trainer.

Every file's footer is checked before it is scanned: a corrupt file is logged by
name and skipped; a file whose column types contradict the current schema is
refused with ``LakeSchemaError`` naming the file and the column; an older file
that lacks newer columns (or newer struct fields) reads with those as nulls.
Partition filters prune the file list from the paths before any footer is read,
and polars pushes the remaining predicates and projections into the scan. Files
a committed compaction supersedes are hidden (``manifest.py``), and a listed file
that vanished before it was opened (a compaction deleted it) makes the list redo.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from conductor.lake.manifest import Visibility, load_visibility
from conductor.lake.schema import (
    METADATA_VERSION_KEY,
    METADATA_WRITE_KEY,
    PARTITION_KEYS,
    SCHEMA_VERSION,
    SCHEMAS,
    LakeSchemaError,
    file_schema,
    trajectory_from_row,
)
from conductor.lake.storage import LakeLocation, open_location
from conductor.trajectory import Trajectory

log = logging.getLogger("conductor.lake")

HIVE_SCHEMA = {k: pl.String for k in PARTITION_KEYS}
CAST_OPTIONS = pl.ScanCastOptions(integer_cast="upcast", float_cast="upcast",
                                  missing_struct_fields="insert", extra_struct_fields="ignore")


def type_mismatch(actual: pa.DataType, expected: pa.DataType, path: str) -> str | None:
    """Where ``actual`` (a file's type) cannot be read as ``expected``; None when compatible.

    Compatible means: equal, a safe widening (int32 -> int64, float32 -> float64,
    string <-> large_string), or a struct missing/adding fields (evolution).

    >>> type_mismatch(pa.int32(), pa.int64(), "x") is None
    True
    >>> type_mismatch(pa.string(), pa.float64(), "reward")
    'reward: file has string, schema expects double'
    >>> type_mismatch(pa.list_(pa.struct([("a", pa.int64())])), pa.list_(pa.struct([("a", pa.string()), ("b", pa.bool_())])), "s")
    's[].a: file has int64, schema expects string'
    """
    if actual.equals(expected):
        return None
    if pa.types.is_struct(actual) and pa.types.is_struct(expected):
        for child in actual:
            idx = expected.get_field_index(child.name)
            if idx >= 0:
                bad = type_mismatch(child.type, expected.field(idx).type, f"{path}.{child.name}")
                if bad:
                    return bad
        return None
    if _is_list(actual) and _is_list(expected):
        return type_mismatch(actual.value_type, expected.value_type, f"{path}[]")
    if pa.types.is_integer(actual) and pa.types.is_integer(expected) and actual.bit_width <= expected.bit_width \
            and pa.types.is_signed_integer(actual) == pa.types.is_signed_integer(expected):
        return None
    if pa.types.is_floating(actual) and pa.types.is_floating(expected) and actual.bit_width <= expected.bit_width:
        return None
    if _is_string(actual) and _is_string(expected):
        return None
    if pa.types.is_null(actual):
        return None
    return f"{path}: file has {actual}, schema expects {expected}"


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def check_schema(actual: pa.Schema, table: str, where: str) -> None:
    """Raise LakeSchemaError when a file's schema contradicts the current one."""
    expected = file_schema(table)
    for f in actual:
        idx = expected.get_field_index(f.name)
        if idx < 0:
            continue   # a column from a newer writer: ignored by this reader
        bad = type_mismatch(f.type, expected.field(idx).type, f.name)
        if bad:
            raise LakeSchemaError(f"{where}: incompatible schema: column {bad} "
                                  f"(schema v{SCHEMA_VERSION} never changes a column's type; "
                                  "rewrite the file or add a new column instead)")


def _partition_values(rel: str) -> dict[str, str]:
    out = {}
    for seg in rel.split("/")[:-1]:
        if "=" in seg:
            k, v = seg.split("=", 1)
            out[k] = v
    return out


class _Vanished(Exception):
    """A listed file was gone when opened."""


@dataclass
class Lake:
    """An opened lake: validated file lists per table, cached for the life of the object."""

    location: LakeLocation
    skipped: list[str] = field(default_factory=list)     # corrupt files, by URI
    _files: dict[tuple[str, tuple[tuple[str, str], ...]], list[str]] = field(default_factory=dict)
    _write_ids: dict[tuple[str, str], bytes | None] = field(default_factory=dict)   # (table, rel) -> id
    _visibility: Visibility | None = None

    @property
    def url(self) -> str:
        return self.location.url

    def list_files(self, table: str, **partitions: str | None) -> list[str]:
        """Readable files of one table under the given partition values (None = any)."""
        if table not in SCHEMAS:
            raise ValueError(f"unknown lake table {table!r}; tables are {sorted(SCHEMAS)}")
        want = tuple(sorted((k, v) for k, v in partitions.items() if v is not None))
        for k, _ in want:
            if k not in PARTITION_KEYS:
                raise ValueError(f"{k!r} is not a partition key {PARTITION_KEYS}")
        key = (table, want)
        if key in self._files:
            return self._files[key]
        if table == "calls":   # calls are visible only once their trajectories file is committed
            self.list_files("trajectories", **partitions)
        for attempt in range(3):
            try:
                self._files[key] = self._list(table, want)
                break
            except _Vanished:      # a compaction committed and deleted files since the listing: list again
                self._visibility = None
                if attempt == 2:
                    raise
        return self._files[key]

    def visibility(self) -> Visibility:
        """Which files compaction has superseded (read once per Lake from the compacted files' footers)."""
        if self._visibility is None:
            self._visibility = load_visibility(self.location)
        return self._visibility

    def _list(self, table: str, want: tuple[tuple[str, str], ...]) -> list[str]:
        loc = self.location
        base = loc.path(table)
        loc.fs.invalidate_cache(base)   # s3fs caches listings; other processes may have written since
        paths = sorted(loc.fs.glob(base + "/**/*.parquet")) if loc.fs.exists(base) else []
        vis = self.visibility()
        good: list[str] = []
        for p in paths:
            rel = p[len(base.rstrip("/")) + 1:] if p.startswith(base) else p.split(f"/{table}/", 1)[-1]
            if any(seg.startswith((".", "_")) for seg in rel.split("/")):
                continue   # temp files of in-flight or killed writers, hidden by name
            values = _partition_values(rel)
            if any(values.get(k) != v for k, v in want):
                continue
            if vis.hides((values.get("kind", ""), values.get("run_id", "")), rel.rsplit("/", 1)[-1]):
                continue   # superseded by a committed compacted file (conductor/lake/manifest.py)
            uri = loc.uri(p)
            try:
                try:
                    with loc.fs.open(p, "rb") as fh:
                        meta = pq.read_metadata(fh)
                except FileNotFoundError:
                    loc.fs.invalidate_cache(p)
                    if not loc.fs.exists(p):
                        raise _Vanished(uri) from None
                    raise ValueError("footer out of range") from None   # s3fs says "not found" for a short file
            except _Vanished:
                raise
            except Exception as e:   # noqa: BLE001 - any unreadable footer means a corrupt file
                msg = f"lake: skipping corrupt file {uri}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
                log.warning(msg)
                if uri not in self.skipped:
                    self.skipped.append(uri)
                continue
            check_schema(meta.schema.to_arrow_schema(), table, uri)
            write_id = (meta.metadata or {}).get(METADATA_WRITE_KEY)
            self._write_ids[(table, rel)] = write_id
            if table == "calls" and not self._committed(rel, write_id, uri):
                continue
            version = (meta.metadata or {}).get(METADATA_VERSION_KEY)
            if version and version.isdigit() and int(version) > SCHEMA_VERSION:
                log.info("lake: %s was written with schema v%s (this reader: v%d); new columns ignored",
                         uri, version.decode(), SCHEMA_VERSION)
            good.append(uri)
        return good

    def _committed(self, rel: str, write_id: bytes | None, uri: str) -> bool:
        if ("trajectories", rel) not in self._write_ids:
            log.info("lake: ignoring %s: its shard has no committed trajectories file", uri)
            return False
        if self._write_ids[("trajectories", rel)] != write_id:
            log.warning("lake: ignoring %s: it does not belong to the committed trajectories file of its shard "
                        "(a rewrite was interrupted; rerun the shard)", uri)
            return False
        return True

    def scan(self, table: str = "trajectories", *, kind: str | None = None, date: str | None = None,
             run_id: str | None = None) -> pl.LazyFrame:
        """Lazy frame over one table with the current schema; absent columns read as null."""
        files = self.list_files(table, kind=kind, date=date, run_id=run_id)
        schema = pl.Schema(pl.DataFrame(SCHEMAS[table].empty_table()).schema)
        if not files:
            return pl.LazyFrame(schema=schema)
        data_schema = {k: v for k, v in schema.items() if k not in PARTITION_KEYS}
        lf = pl.scan_parquet(files, hive_partitioning=True, hive_schema=HIVE_SCHEMA, try_parse_hive_dates=False,
                             schema=data_schema, missing_columns="insert", extra_columns="ignore",
                             cast_options=CAST_OPTIONS, storage_options=self.location.polars_options())
        return lf.select(list(schema.keys()))


def open_lake(lake_root: str | Lake | LakeLocation, storage_options: dict[str, Any] | None = None) -> Lake:
    """Open a local path or s3:// URL (credentials from AWS_* env or storage_options)."""
    if isinstance(lake_root, Lake):
        return lake_root
    return Lake(open_location(lake_root, storage_options))


def scan(lake_root: str | Lake, table: str = "trajectories", *, kind: str | None = None,
         date: str | None = None, run_id: str | None = None,
         storage_options: dict[str, Any] | None = None) -> pl.LazyFrame:
    """Shorthand for ``open_lake(...).scan(...)``."""
    return open_lake(lake_root, storage_options).scan(table, kind=kind, date=date, run_id=run_id)


def load_trajectories(lake_root: str | Lake, run_id: str, *, kind: str | None = "rollout",
                      storage_options: dict[str, Any] | None = None) -> list[Trajectory]:
    """One run's records, rebuilt with token ids and log-probs (what the GRPO trainer reads)."""
    lake = open_lake(lake_root, storage_options)
    rows = lake.scan("trajectories", kind=kind, run_id=run_id).collect().to_dicts()
    calls: dict[str, list[dict[str, Any]]] = {}
    if any(r["n_calls"] for r in rows):
        for c in lake.scan("calls", kind=kind, run_id=run_id).collect().to_dicts():
            calls.setdefault(c["trajectory_id"], []).append(c)
    return [trajectory_from_row(r, calls.get(r["trajectory_id"], [])) for r in rows]
