"""What a rerun may skip: the trajectories of a run already committed intact to the lake.

Resume is keyed by content, not by file layout: a flow asks which trajectory ids of a run are committed
(the ids hash the question, its content and the settings that change answers; ``RunSpec.trajectory_ids``)
and redoes every question that has none, whatever shard size wrote the others. Rows that failed on
infrastructure do not count as done, so a rerun retries them. A shard whose files are damaged (an
unreadable trajectories file, or a calls file that is missing, unreadable or from another write) is moved
aside under a hidden name, which every reader ignores, and its questions are redone. The hidden temp files
of shard writes a killed writer left in the run's partitions (``.shard-….parquet.<hex>.tmp``) are removed.

This module is the one place that decides "done"; lake compaction extends ``run_files``/``committed``.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from conductor.lake.schema import METADATA_WRITE_KEY
from conductor.lake.storage import LakeLocation, check_key, open_location

log = logging.getLogger("conductor.lake")


@dataclass
class RunState:
    """A run's committed trajectory ids, split by outcome, and the shard files found damaged."""

    done: set[str] = field(default_factory=set)       # committed, not infra-failed
    failed: set[str] = field(default_factory=set)     # committed, infra-failed (a rerun retries them)
    damaged: list[str] = field(default_factory=list)  # shard files moved aside (their questions are redone)
    failed_rows: dict[str, int] = field(default_factory=dict)   # infra-failed rows kept per id (attempts so far)

    def attempt_key(self, ids: Sequence[str]) -> str:
        """What a retried question adds to its shard key: the attempt number, so the retry's shard gets a name
        of its own and the failed attempts stay in the lake as history instead of being overwritten.

        >>> s = RunState(failed={"t1"}, failed_rows={"t1": 2})
        >>> s.attempt_key(["t1"]).endswith("retry2"), s.attempt_key(["t2"])
        (True, '')
        """
        if not any(t in self.failed for t in ids):
            return ""
        return f"\x1eretry{max(self.failed_rows.get(t, 0) for t in ids)}"


def run_files(loc: LakeLocation, table: str, kind: str, run_id: str) -> list[str]:
    """Visible Parquet files of one table for (kind, run_id), any date."""
    pattern = loc.path(table, f"kind={check_key('kind', kind)}", "date=*", f"run_id={check_key('run_id', run_id)}",
                       "*.parquet")
    loc.fs.invalidate_cache(loc.path(table))
    return sorted(p for p in loc.fs.glob(pattern) if not p.rsplit("/", 1)[-1].startswith((".", "_")))


def committed(lake_root: str | LakeLocation, kind: str, run_id: str, *, repair: bool = True,
              storage_options: dict[str, Any] | None = None) -> RunState:
    """The trajectory ids of ``run_id`` committed intact; with ``repair`` damaged shards are moved aside."""
    loc = open_location(lake_root, storage_options)
    state = RunState()
    if repair:
        remove_orphan_temps(loc, kind, run_id)
    for traj_path in run_files(loc, "trajectories", kind, run_id):
        calls_path = _calls_twin(loc, traj_path)
        try:
            ids, failed = _read_shard(loc, traj_path, calls_path)
        except _Damaged as e:
            log.warning("lake: shard %s is damaged (%s); its questions will be redone", loc.uri(traj_path), e)
            if repair:
                _move_aside(loc, traj_path, calls_path)
            state.damaged.append(loc.uri(traj_path))
            continue
        for tid, bad in zip(ids, failed):
            (state.failed if bad else state.done).add(tid)
            if bad:
                state.failed_rows[tid] = state.failed_rows.get(tid, 0) + 1
    state.failed -= state.done   # a later successful attempt wins
    return state


def current_rows(frame: pl.LazyFrame) -> pl.LazyFrame:
    """One row per trajectory id, as ``committed`` counts them: a successful attempt wins over the failed ones a
    resumed run kept as history, and an id that only failed keeps one failed row. A reader that scores a run
    (``conductor compare``) must read it through this, or a question retried after a failure counts twice.

    >>> df = pl.LazyFrame({"trajectory_id": ["a", "a", "b", "c", "c"], "infra_failed": [True, False, True, True, True]})
    >>> current_rows(df).sort("trajectory_id").collect().rows()
    [('a', False), ('b', True), ('c', True)]
    """
    return frame.sort("infra_failed", maintain_order=True).unique("trajectory_id", keep="first", maintain_order=True)


# the temp name conductor/lake/writer.py's atomic_output gives a shard file while it is written; compacted
# files' temps are left alone (`conductor lake compact` may be writing them from another process)
_SHARD_TEMP = re.compile(r"^\.shard-[^/]*\.parquet\.[0-9a-f]{32}\.tmp$")


def remove_orphan_temps(loc: LakeLocation, kind: str, run_id: str) -> list[str]:
    """Remove the shard-write temp files of (kind, run_id) in both tables; return the paths removed.

    Called when a run is planned, before it writes anything: any such file then belongs to a writer that
    was killed (a shard's writes go to a fresh temp name, and a run has one writer at a time). Only local
    lakes have them (S3 objects are PUT directly).

    >>> _SHARD_TEMP.match(".shard-q-1.parquet." + "a" * 32 + ".tmp") is not None
    True
    >>> _SHARD_TEMP.match(".compact-1.parquet." + "a" * 32 + ".tmp") is None
    True
    """
    if not loc.is_local:
        return []
    removed = []
    for table in ("calls", "trajectories"):
        pattern = loc.path(table, f"kind={check_key('kind', kind)}", "date=*",
                           f"run_id={check_key('run_id', run_id)}", ".*.tmp")
        for path in loc.glob(pattern):
            if _SHARD_TEMP.match(path.rsplit("/", 1)[-1]):
                try:
                    loc.fs.rm(path)
                except OSError as e:
                    log.warning("lake: cannot remove orphaned temp file %s: %s", loc.uri(path), e)
                    continue
                removed.append(path)
                log.info("lake: removed %s, left by a killed writer", loc.uri(path))
    return removed


class _Damaged(Exception):
    pass


def _calls_twin(loc: LakeLocation, traj_path: str) -> str:
    rel = traj_path[len(loc.path("trajectories")):]
    return loc.path("calls") + rel


def _write_id(loc: LakeLocation, path: str, what: str) -> bytes | None:
    try:
        with loc.fs.open(path, "rb") as fh:
            meta = pq.read_metadata(fh)
    except FileNotFoundError:
        raise _Damaged(f"{what} file missing") from None
    except Exception as e:  # noqa: BLE001 - any unreadable footer means a damaged file
        raise _Damaged(f"{what} file unreadable: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return (meta.metadata or {}).get(METADATA_WRITE_KEY)


def _read_shard(loc: LakeLocation, traj_path: str, calls_path: str) -> tuple[list[str], list[bool]]:
    write_id = _write_id(loc, traj_path, "trajectories")
    if _write_id(loc, calls_path, "calls") != write_id:
        raise _Damaged("calls file belongs to another write")
    try:
        with loc.fs.open(traj_path, "rb") as fh:
            table = pq.read_table(fh, columns=["trajectory_id", "infra_failed"])
    except Exception as e:  # noqa: BLE001 - a footer that reads but pages that do not
        raise _Damaged(f"trajectories file unreadable: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return table.column("trajectory_id").to_pylist(), [bool(x) for x in table.column("infra_failed").to_pylist()]


def _move_aside(loc: LakeLocation, *paths: str) -> None:
    """Rename to a hidden name (kept for inspection, ignored by readers) so the shard can be rewritten."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for p in paths:
        directory, name = p.rsplit("/", 1)
        try:
            if loc.fs.exists(p):
                loc.fs.mv(p, f"{directory}/.{name}.damaged-{stamp}")
        except OSError as e:
            log.warning("lake: cannot move damaged %s aside: %s", loc.uri(p), e)
