"""Lake compaction: a run's many small shard files rewritten into a few files of a sensible size.

WHY: bulk answering commits one small file per shard per table (5 questions by
default), so 100,000 questions leave ~40,000 files, and every reader pays per
file (listing, footer, open, tiny row groups). Compaction fixes the layout
without changing a single query result.

Per partition (kind, date, run_id) the visible small files (shard files, and
compacted files under half the target) are grouped in name order up to
``target_mb`` each, and each group of two or more is streamed into one
compacted pair (``writer.write_merged``), committed exactly like a shard: calls
first, trajectories last. The trajectories footer lists the shards it holds and
the compacted files it replaces, so its commit hides all of them at once
(``manifest.py``); the sources are deleted after that. A kill -9 at any point
leaves every row visible exactly once (before the commit: the sources, the new
calls file being an invisible orphan; after it: the compacted file, the
sources hidden until deleted), and the next compaction deletes the leftovers.
Idempotent: a compacted partition has at most one small file, which is left as
it is; names are derived from the inputs, so a rerun after a crash rewrites the
same names. Resume keeps working: ``shard_done`` and the trajectory-id resume
read compacted files like shard files.

One compaction at a time per lake (a lock file on local lakes; on S3 run one
compactor). Compact a run that is not being written at the same moment.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from conductor.lake.manifest import Manifest, Visibility, compacted_name, is_compacted, run_of, shard_id_of
from conductor.lake.reader import Lake, open_lake
from conductor.lake.storage import LakeLocation, check_key, open_location
from conductor.lake.writer import STALE_TEMP_S, write_merged

log = logging.getLogger("conductor.lake")

DEFAULT_TARGET_MB = 128.0


@dataclass
class CompactReport:
    """What a compaction did (files count both tables, in the partitions it looked at)."""

    partitions: int = 0
    files_before: int = 0
    files_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    written: int = 0              # compacted pairs written
    rows: int = 0                 # trajectories rows moved into them
    leftovers_removed: int = 0    # files of earlier, interrupted compactions deleted
    target_mb: float = 0.0        # the target it merged towards

    def line(self) -> str:
        why = ""
        if not self.written and self.files_before:   # say why nothing was merged
            why = (f"; nothing merged: a file is merged only with others while it is under half of --target-mb "
                   f"({self.target_mb:g} MB), and no partition had two such files")
        return (f"{self.partitions} partitions: {self.files_before} -> {self.files_after} files "
                f"({self.bytes_before / 1e6:.1f} MB -> {self.bytes_after / 1e6:.1f} MB), "
                f"{self.written} compacted pairs written holding {self.rows} trajectories, "
                f"{self.leftovers_removed} leftover files removed{why}")


@dataclass
class _Entry:
    traj: str                     # native paths
    calls: str | None
    name: str
    size: int
    write_id: bytes | None
    rows: int = 0


def compact(lake_root: str | LakeLocation, *, run_id: str | None = None, kind: str | None = None,
            target_mb: float = DEFAULT_TARGET_MB, storage_options: dict[str, Any] | None = None) -> CompactReport:
    """Compact every partition of one run (``run_id``), of one kind, or of the whole lake."""
    loc = open_location(lake_root, storage_options)
    for name, value in (("run_id", run_id), ("kind", kind)):
        if value is not None:
            check_key(name, value)
    if target_mb <= 0:
        raise ValueError(f"target_mb must be positive, not {target_mb:g}")
    report = CompactReport(target_mb=target_mb)
    with _lock(loc):
        lake = open_lake(loc)
        vis = lake.visibility()
        report.leftovers_removed = remove_leftovers(loc, vis, kind, run_id)
        sizes = {t: _sizes(loc, t) for t in ("trajectories", "calls")}
        for part, entries in _partitions(loc, lake, kind, run_id, sizes).items():
            report.partitions += 1
            report.files_before += len(entries) + sum(1 for e in entries if e.calls)
            report.bytes_before += sum(e.size for e in entries)
            manifests = {name: m for (_, name), m in vis.visible.items()}
            final = _compact_partition(loc, part, entries, target_mb * 1e6, manifests, report)
            report.files_after += len(final) + sum(1 for e in final if e.calls)
            report.bytes_after += sum(e.size for e in final)
    log.info("lake compaction of %s: %s", loc.url, report.line())
    return report


def _compact_partition(loc: LakeLocation, part: str, entries: list[_Entry], target: float,
                       manifests: dict[str, Manifest], report: CompactReport) -> list[_Entry]:
    """Merge the partition's small files (under half the target) into files of about ``target`` bytes;
    returns the partition's files afterwards.

    Groups are planned from input sizes scaled by the compression the previous output achieved (bigger
    row groups compress better), and an output that still came out small is merged into the next
    group, so every output but the last ends up near the target and a second run finds nothing to do.
    """
    keep = [e for e in entries if e.size >= target / 2]
    todo = [e for e in entries if e.size < target / 2]
    ratio = 1.0
    while len(todo) >= 2:
        group, budget = [todo.pop(0), todo.pop(0)], target / ratio
        while todo and sum(e.size for e in group) + todo[0].size <= budget:
            group.append(todo.pop(0))
        out = _merge(loc, part, group, manifests)
        report.written += 1
        report.rows += out.rows - sum(e.rows for e in group)     # an output merged again counts once
        ratio = max(0.05, min(1.0, out.size / max(1, sum(e.size for e in group))))
        if out.size < target / 2 and todo:
            todo.insert(0, out)
        else:
            keep.append(out)
    return keep + todo


def _merge(loc: LakeLocation, part: str, group: list[_Entry], manifests: dict[str, Manifest]) -> _Entry:
    """Write one group as a compacted pair, then delete its sources; the new pair as an entry."""
    shards: set[str] = set()
    replaces: set[str] = set()
    for e in group:
        if is_compacted(e.name):
            shards |= manifests[e.name].shards
            replaces.add(e.name)
        elif (sid := shard_id_of(e.name)) is not None:
            shards.add(sid)
    name = compacted_name(*(f"{e.name}:{(e.write_id or b'').decode()}" for e in group))
    manifests[name] = Manifest(frozenset(shards), frozenset(replaces))
    out = write_merged(loc, part, name, [(e.traj, e.calls) for e in group], manifests[name])
    traj, calls = loc.path("trajectories", part, name), loc.path("calls", part, name)
    size = loc.fs.size(traj) + loc.fs.size(calls)
    for e in group:                 # committed: the sources are hidden now, and can go
        for path in (e.traj, e.calls):
            if path is not None:
                _rm(loc, path)
    log.info("lake: compacted %d files of %s into %s (%d trajectories)", len(group), part, name,
             out["trajectories"])
    return _Entry(traj, calls, name, size, out["write_id"].encode(), out["trajectories"])


def _partitions(loc: LakeLocation, lake: Lake, kind: str | None, run_id: str | None,
                sizes: dict[str, dict[str, int]]) -> dict[str, list[_Entry]]:
    """Visible trajectories files (with their committed calls twins) by partition directory."""
    calls = {_native(loc, u) for u in lake.list_files("calls", kind=kind, run_id=run_id)}
    base = loc.path("trajectories")
    out: dict[str, list[_Entry]] = defaultdict(list)
    for uri in lake.list_files("trajectories", kind=kind, run_id=run_id):
        path = _native(loc, uri)
        rel = path[len(base) + 1:]
        part, name = rel.rsplit("/", 1)
        calls_path = loc.path("calls", rel)
        twin = calls_path if calls_path in calls else None
        size = sizes["trajectories"].get(path, 0) + (sizes["calls"].get(twin, 0) if twin else 0)
        out[part].append(_Entry(path, twin, name, size, lake._write_ids.get(("trajectories", rel))))
    for entries in out.values():
        entries.sort(key=lambda e: e.name)
    return dict(sorted(out.items()))


def remove_leftovers(loc: LakeLocation, vis: Visibility, kind: str | None = None, run_id: str | None = None) -> int:
    """Delete what interrupted compactions left: files a committed compacted file supersedes, and
    compacted calls files whose trajectories twin never committed (older than an hour)."""
    removed = 0
    now = time.time()
    for table in ("trajectories", "calls"):
        pattern = loc.path(table, f"kind={kind or '*'}", "date=*", f"run_id={run_id or '*'}", "*.parquet")
        for path, info in loc.fs.glob(pattern, detail=True).items():
            run, name = run_of(path), path.rsplit("/", 1)[1]
            if run is None or name.startswith((".", "_")):
                continue
            orphan = (table == "calls" and is_compacted(name)
                      and not loc.fs.exists(loc.path("trajectories", path[len(loc.path(table)) + 1:]))
                      and now - _mtime(info, now) > STALE_TEMP_S)
            if vis.hides(run, name) or orphan:
                _rm(loc, path)
                removed += 1
    if removed:
        log.info("lake: removed %d files left by interrupted compactions", removed)
    return removed


def _sizes(loc: LakeLocation, table: str) -> dict[str, int]:
    base = loc.path(table)
    if not loc.fs.exists(base):
        return {}
    return {p: int(info.get("size") or 0) for p, info in loc.fs.find(base, detail=True).items()}


def _mtime(info: dict[str, Any], default: float) -> float:
    m = info.get("mtime") or info.get("LastModified") or info.get("created")
    if m is None:
        return default
    return m.timestamp() if hasattr(m, "timestamp") else float(m)


def _native(loc: LakeLocation, uri: str) -> str:
    return uri if loc.is_local else uri.split("://", 1)[-1]


def _rm(loc: LakeLocation, path: str) -> None:
    try:
        loc.fs.rm(path)
    except FileNotFoundError:
        pass


@contextlib.contextmanager
def _lock(loc: LakeLocation) -> Iterator[None]:
    """One compaction at a time per local lake (flock on ROOT/.compact.lock; readers never look there)."""
    if not loc.is_local:
        yield
        return
    import fcntl

    os.makedirs(loc.root, exist_ok=True)
    with open(os.path.join(loc.root, ".compact.lock"), "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)

