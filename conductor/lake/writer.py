"""Atomic, idempotent shard writes into the Hive-partitioned lake.

Each shard becomes exactly one file per table with a deterministic name,
``<table>/kind=K/date=D/run_id=R/shard-<id>.parquet``, so rerunning a shard
replaces it instead of adding rows. Local files are written to a hidden temp name
in the same directory, fsynced and renamed (atomic on POSIX); on S3 the object is
PUT directly (an object becomes visible only when its upload completes). Readers
only list ``*.parquet`` files not starting with '.', so they never see a partial
file. The calls file is written before the trajectories file, which acts as the
shard's commit marker (``shard_done``); both carry the same ``write_id`` in their
Parquet metadata, and readers ignore a calls file that does not match its
committed trajectories file (a writer killed between the two files).
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from conductor.lake.manifest import Manifest, compacted_name, load_visibility
from conductor.lake.schema import (
    METADATA_VERSION_KEY,
    PARTITION_KEYS,
    SCHEMA_VERSION,
    call_rows,
    file_schema,
    trajectory_row,
)
from conductor.lake.storage import LakeLocation, check_key, open_location
from conductor.trajectory import Trajectory

log = logging.getLogger("conductor.lake")

PARTITIONING = ds.partitioning(pa.schema([(k, pa.string()) for k in PARTITION_KEYS]), flavor="hive")
STALE_TEMP_S = 3600.0   # temp files older than this are leftovers of killed writers


def shard_file_name(shard_id: str) -> str:
    """Deterministic file name of a shard (the same shard always lands on the same name).

    >>> shard_file_name("00017")
    'shard-00017.parquet'
    """
    return f"shard-{check_key('shard_id', shard_id)}.parquet"


def partition_dir(kind: str, date: str, run_id: str) -> str:
    """Hive directory for one (kind, date, run_id), formatted by pyarrow's partitioning.

    >>> partition_dir("rollout", "2026-11-21", "r1")
    'kind=rollout/date=2026-11-21/run_id=r1'
    """
    for name, value in zip(PARTITION_KEYS, (kind, date, run_id)):
        check_key(name, value)
    expr = (pc.field("kind") == kind) & (pc.field("date") == date) & (pc.field("run_id") == run_id)
    return PARTITIONING.format(expr)[0]


def _to_table(rows: list[dict[str, Any]], table: str, write_id: str) -> pa.Table:
    schema = file_schema(table, write_id)
    try:
        return pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as e:
        bad = _first_bad_field(rows, schema)
        raise ValueError(f"cannot store {table} row: {bad or e}") from None


def _first_bad_field(rows: list[dict[str, Any]], schema: pa.Schema) -> str | None:
    """Name the offending row/column so a bad record fails with a useful one-liner."""
    for i, row in enumerate(rows):
        for f in schema:
            try:
                pa.array([row.get(f.name)], type=f.type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as e:
                ident = row.get("trajectory_id", i)
                return f"trajectory {ident}: column {f.name}: {str(e).splitlines()[0]}"
    return None


def _write_file(loc: LakeLocation, table: pa.Table, final: str) -> None:
    with atomic_output(loc, final) as f:
        pq.write_table(table, f, compression="zstd")


@contextmanager
def atomic_output(loc: LakeLocation, final: str) -> Iterator[Any]:
    """A binary file that appears under ``final`` only once fully written (or not at all)."""
    directory = final.rsplit("/", 1)[0]
    loc.fs.makedirs(directory, exist_ok=True)
    if not loc.is_local:
        # One S3 object; it becomes visible only when the (multipart) upload completes.
        with loc.fs.open(final, "wb") as f:
            yield f
        return
    name = final.rsplit("/", 1)[1]
    tmp = f"{directory}/.{name}.{uuid.uuid4().hex}.tmp"
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(directory)
    _remove_stale_temps(directory, name)


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_stale_temps(directory: str, name: str) -> None:
    now = time.time()
    for entry in os.scandir(directory):
        if entry.name.startswith(f".{name}.") and entry.name.endswith(".tmp"):
            try:
                if now - entry.stat().st_mtime > STALE_TEMP_S:
                    os.unlink(entry.path)
            except OSError:
                pass


def write_shard(lake_root: str | LakeLocation, trajectories: Iterable[Trajectory], shard_id: str,
                *, storage_options: dict[str, Any] | None = None) -> list[str]:
    """Write one shard (replacing any earlier write of it); return the paths written.

    Trajectories without a ``date`` get today's UTC date, and ``shard`` is set to
    ``shard_id`` (both on the records passed in, so they match the lake). A shard that spans
    several (kind, date, run_id) partitions writes one file per partition.
    """
    loc = open_location(lake_root, storage_options)
    name = shard_file_name(shard_id)
    groups: dict[tuple[str, str, str], list[Trajectory]] = {}
    today = _dt.datetime.now(_dt.UTC).date().isoformat()
    for t in trajectories:
        if not t.date:
            t.date = today
        t.shard = shard_id
        groups.setdefault((t.kind, t.date, t.run_id), []).append(t)
    if not groups:
        raise ValueError(f"shard {shard_id}: no trajectories to write")
    written: list[str] = []
    for (kind, date, run_id), items in groups.items():
        part = partition_dir(kind, date, run_id)
        write_id = uuid.uuid4().hex
        traj = _to_table([_drop_keys(trajectory_row(t)) for t in items], "trajectories", write_id)
        calls = _to_table([_drop_keys(r) for t in items for r in call_rows(t)], "calls", write_id)
        # calls first: the trajectories file is the shard's commit marker, and readers only
        # use a calls file whose write_id matches its committed trajectories file
        for table_name, table in (("calls", calls), ("trajectories", traj)):
            final = loc.path(table_name, part, name)
            _write_file(loc, table, final)
            written.append(final)
        _remove_other_dates(loc, kind, run_id, date, name)
        _evict(loc, kind, run_id, shard_id)
        log.info("lake: wrote shard %s (%d trajectories) to %s", shard_id, len(items), loc.uri(loc.path(part)))
    return written


def _drop_keys(row: dict[str, Any]) -> dict[str, Any]:
    for k in PARTITION_KEYS:
        row.pop(k, None)
    return row


def _remove_other_dates(loc: LakeLocation, kind: str, run_id: str, keep_date: str, name: str) -> None:
    """A rerun on another day must replace, not duplicate, the shard written under the old date."""
    for table_name in ("trajectories", "calls"):
        for path in loc.glob(loc.path(table_name, f"kind={kind}", "date=*", f"run_id={run_id}", name)):
            if f"/date={keep_date}/" not in path:
                loc.fs.rm(path)
                log.info("lake: removed superseded %s", loc.uri(path))


def _evict(loc: LakeLocation, kind: str, run_id: str, shard_id: str) -> None:
    """A rewritten shard leaves the compacted file that held its old rows: that file is rewritten
    without them, and its commit reveals the new shard files in the same atomic step (until then
    the compacted file hides them, so readers see the old rows or the new ones, never both)."""
    vis = load_visibility(loc, kind, run_id)
    for (_, name), m in list(vis.visible.items()):
        if shard_id not in m.shards:
            continue
        for traj in loc.glob(loc.path("trajectories", f"kind={kind}", "date=*", f"run_id={run_id}", name)):
            part = traj[len(loc.path("trajectories")) + 1:].rsplit("/", 1)[0]
            calls = loc.path("calls", part, name)
            rest = m.shards - {shard_id}
            if rest:
                new = compacted_name(name, f"-{shard_id}")
                write_merged(loc, part, new, [(traj, calls if loc.fs.exists(calls) else None)],
                             Manifest(rest, frozenset({name})), drop_shards=frozenset({shard_id}))
            for path in (traj, calls):           # trajectories first: an orphan calls file is invisible
                if loc.fs.exists(path):
                    loc.fs.rm(path)
            log.info("lake: shard %s rewritten; removed it from compacted %s", shard_id, loc.uri(traj))


def shard_done(lake_root: str | LakeLocation, kind: str, run_id: str, shard_id: str,
               *, storage_options: dict[str, Any] | None = None) -> bool:
    """True when the shard is committed, so a flow can skip it: its trajectories file (the commit
    marker) exists, or a compacted file that holds its rows does (conductor/lake/manifest.py)."""
    loc = open_location(lake_root, storage_options)
    pattern = loc.path("trajectories", f"kind={check_key('kind', kind)}", "date=*",
                       f"run_id={check_key('run_id', run_id)}", shard_file_name(shard_id))
    if loc.glob(pattern):
        return True
    return load_visibility(loc, kind, run_id).holder((kind, run_id), shard_id) is not None


# ------------------------------------------------------------------ compacted files

ROW_GROUP_BYTES = 64 * 1024 * 1024     # buffered before a row group is written: fast scans, bounded memory


def write_merged(loc: LakeLocation, part: str, name: str, sources: list[tuple[str, str | None]],
                 manifest: Manifest, drop_shards: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Stream committed (trajectories, calls-or-None) file pairs into one pair ``part/name``, committed
    like a shard: calls first, then trajectories, whose footer carries the manifest. Rows of
    ``drop_shards`` are left out. Returns the rows written per table and the pair's write_id."""
    write_id = uuid.uuid4().hex
    dropped = _trajectory_ids(loc, [t for t, _ in sources], drop_shards) if drop_shards else set()
    rows = {}
    for table, paths in (("calls", [c for _, c in sources if c]), ("trajectories", [t for t, _ in sources])):
        schema = file_schema(table, write_id)
        if table == "trajectories":
            schema = schema.with_metadata({**(schema.metadata or {}), **manifest.metadata()})
        with atomic_output(loc, loc.path(table, part, name)) as f, \
                pq.ParquetWriter(f, schema, compression="zstd") as out:
            rows[table] = _stream(loc, paths, schema, out, dropped)
    return {**rows, "write_id": write_id}


def _trajectory_ids(loc: LakeLocation, paths: list[str], shards: frozenset[str]) -> set[str]:
    out: set[str] = set()
    for p in paths:
        with loc.fs.open(p, "rb") as fh:
            t = pq.read_table(fh, columns=["trajectory_id", "shard"])
        out.update(tid for tid, sh in zip(t.column("trajectory_id").to_pylist(), t.column("shard").to_pylist())
                   if sh in shards)
    return out


def _stream(loc: LakeLocation, paths: list[str], schema: pa.Schema, out: pq.ParquetWriter, drop: set[str]) -> int:
    """Copy every row of ``paths`` (conformed to ``schema``) into ``out`` in row groups of ~ROW_GROUP_BYTES."""
    buf: list[pa.Table] = []
    size = rows = 0
    drop_ids = pa.array(sorted(drop), pa.string())
    for p in paths:
        with _parquet(loc, p) as pf:
            for i in range(pf.num_row_groups):   # one row group at a time: memory stays bounded
                t = _conform(pf.read_row_group(i), schema)
                if drop:
                    t = t.filter(pc.invert(pc.is_in(t.column("trajectory_id"), drop_ids)))
                buf.append(t)
                size += t.nbytes
                rows += t.num_rows
                if size >= ROW_GROUP_BYTES:
                    out.write_table(pa.concat_tables(buf), row_group_size=1 << 30)
                    buf, size = [], 0
    if buf:
        out.write_table(pa.concat_tables(buf), row_group_size=1 << 30)
    return rows


@contextmanager
def _parquet(loc: LakeLocation, path: str) -> Iterator[pq.ParquetFile]:
    """A Parquet file to stream from: local files by path (Arrow's own reads, ~4x faster than
    through a Python file object), others through fsspec."""
    if loc.is_local:
        pf = pq.ParquetFile(path)
        try:
            yield pf
        finally:
            pf.close()
        return
    with loc.fs.open(path, "rb") as fh:
        yield pq.ParquetFile(fh)


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """A table with exactly ``schema``'s columns: older files' missing columns become nulls."""
    cols = []
    for f in schema:
        idx = table.schema.get_field_index(f.name)
        col = table.column(idx) if idx >= 0 else pa.chunked_array([pa.nulls(table.num_rows, f.type)], f.type)
        cols.append(col if col.type.equals(f.type) else col.cast(f.type))
    return pa.Table.from_arrays(cols, schema=schema)


# ------------------------------------------------------------------ rewriting committed rows

def _fs_path(loc: LakeLocation, uri: str) -> str:
    """A URI from ``Lake.list_files`` back to the filesystem path the location's fs takes."""
    return uri if loc.is_local else uri.split("://", 1)[-1]


def _rewrite(loc: LakeLocation, path: str, change: Callable[[pa.Table], pa.Table | None]) -> bool:
    """Rewrite one committed trajectories file through ``change`` (None: leave the file as it is), conformed
    to the current schema, atomically, keeping its footer metadata (``write_id``, so its calls file stays
    matched; a compacted file's manifest) except the schema version, which becomes the current one."""
    with _parquet(loc, path) as pf:
        old_meta = dict(pf.schema_arrow.metadata or {})
        table = _conform(pf.read(), file_schema("trajectories"))
    new = change(table)
    if new is None:
        return False
    meta = {**old_meta, **(file_schema("trajectories").metadata or {})}
    new = new.set_column(new.schema.get_field_index("schema_version"), "schema_version",
                         pa.array([SCHEMA_VERSION] * new.num_rows, pa.int16()))
    with atomic_output(loc, path) as f:
        pq.write_table(new.replace_schema_metadata(meta), f, compression="zstd")
    return True


def set_trajectory_values(lake_root: str | LakeLocation, kind: str, run_id: str,
                          values: Mapping[str, Mapping[str, Any]], *,
                          storage_options: dict[str, Any] | None = None) -> int:
    """Set columns of committed trajectories rows (``trajectory_id -> {column: value}``) in place; returns the
    rows changed. What the GRPO update writes back (advantage, used_in_training, ...): the rollout rows stay
    where the rollout committed them, each file holding one of them is rewritten whole and atomically, so a
    reader sees the old file or the new one. Idempotent: the same values written twice change nothing more."""
    from conductor.lake.reader import open_lake

    loc = open_location(lake_root, storage_options)
    schema = file_schema("trajectories")
    columns = sorted({c for v in values.values() for c in v})
    for c in columns:
        if schema.get_field_index(c) < 0 or c in ("trajectory_id", "schema_version"):
            raise ValueError(f"cannot set trajectories column {c!r}: not a settable column of schema v{SCHEMA_VERSION}")
    changed = [0]

    def change(table: pa.Table) -> pa.Table | None:
        ids = table.column("trajectory_id").to_pylist()
        hit = [i for i, tid in enumerate(ids) if tid in values]
        if not hit:
            return None
        for c in columns:
            col = table.column(c).to_pylist()
            for i in hit:
                if c in values[ids[i]]:
                    col[i] = values[ids[i]][c]
            idx = schema.get_field_index(c)
            table = table.set_column(table.schema.get_field_index(c), schema.field(idx), pa.array(col, schema.field(idx).type))
        changed[0] += len(hit)
        return table

    for uri in open_lake(loc).list_files("trajectories", kind=kind, run_id=run_id):
        _rewrite(loc, _fs_path(loc, uri), change)
    return changed[0]


def migrate(lake_root: str | LakeLocation, *, storage_options: dict[str, Any] | None = None) -> dict[str, int]:
    """Bring every trajectories and calls file written by an older schema up to the current one: the new
    columns are stored (as nulls: "not recorded") and the files say the current version, so engines that read
    the files without this package (plain DuckDB globs, Spark) see one schema. Readers of this package never
    need it (they insert missing columns themselves); it is for those others. Atomic per file, idempotent.
    Returns files checked and rewritten."""
    from conductor.lake.reader import open_lake

    loc = open_location(lake_root, storage_options)
    lake = open_lake(loc)
    out = {"checked": 0, "migrated": 0}
    for table in ("calls", "trajectories"):   # calls first, like a shard commit
        for uri in lake.list_files(table):
            path = _fs_path(loc, uri)
            out["checked"] += 1
            if _migrate_file(loc, path, table):
                out["migrated"] += 1
    return out


def _migrate_file(loc: LakeLocation, path: str, table: str) -> bool:
    with _parquet(loc, path) as pf:
        meta = dict(pf.schema_arrow.metadata or {})
        version = meta.get(METADATA_VERSION_KEY, b"0")
        if version.isdigit() and int(version) >= SCHEMA_VERSION:
            return False
        schema = file_schema(table)
        data = _conform(pf.read(), schema)
    data = data.set_column(data.schema.get_field_index("schema_version"), "schema_version",
                           pa.array([SCHEMA_VERSION] * data.num_rows, pa.int16()))
    with atomic_output(loc, path) as f:
        pq.write_table(data.replace_schema_metadata({**meta, **(schema.metadata or {})}), f, compression="zstd")
    log.info("lake: migrated %s from schema v%s to v%d", loc.uri(path), version.decode(), SCHEMA_VERSION)
    return True


TRAINING_DIR = "training"   # <lake>/training/run_id=<rollout run>.json: one record per GRPO update


def write_training_record(lake_root: str | LakeLocation, run_id: str, record: Mapping[str, Any], *,
                          storage_options: dict[str, Any] | None = None) -> str:
    """One GRPO update's record (its metrics, checkpoint, iteration) beside the rollout run it trained on,
    atomically; rewriting it replaces it. Kept apart from the Parquet tables: a few per run, read whole."""
    import json

    loc = open_location(lake_root, storage_options)
    path = loc.path(TRAINING_DIR, f"run_id={check_key('run_id', run_id)}.json")
    with atomic_output(loc, path) as f:
        f.write(json.dumps(dict(record), indent=1, sort_keys=True, allow_nan=False).encode())
    return path
