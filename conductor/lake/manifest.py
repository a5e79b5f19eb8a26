"""Compacted files: what each one holds and supersedes, and which files a reader may use.

Compaction (``compact.py``) merges many small shard files of one partition into
``compact-<id>.parquet`` pairs (trajectories + calls with one write_id). The
trajectories file's own Parquet footer is the manifest: ``conductor.shards``
lists the shard ids whose rows it holds, ``conductor.replaces`` the compacted
files it supersedes. The footer commits with the file (one atomic rename), so
there is no separate manifest to keep consistent with the data.

The visibility rule every reader applies, per (kind, run_id):
* a compacted file named in the ``replaces`` of another compacted file is hidden;
* a shard file ``shard-<id>.parquet`` is hidden while a visible compacted file
  lists ``<id>`` (its rows live there now).
So the moment a compacted file commits, its rows replace the shards' rows at
once: a reader sees the old files or the new one, never both, never neither,
and files a crash left behind stay hidden until the next compaction deletes them.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conductor.lake.storage import LakeLocation

log = logging.getLogger("conductor.lake")

METADATA_SHARDS_KEY = b"conductor.shards"       # JSON list of shard ids held by a compacted file
METADATA_REPLACES_KEY = b"conductor.replaces"   # JSON list of compacted file names it supersedes
COMPACT_PREFIX = "compact-"
SHARD_PREFIX = "shard-"

RunKey = tuple[str, str]                         # (kind, run_id)


def is_compacted(name: str) -> bool:
    """A compacted file's name.

    >>> is_compacted("compact-3fa2.parquet"), is_compacted("shard-00017.parquet")
    (True, False)
    """
    return name.startswith(COMPACT_PREFIX) and name.endswith(".parquet")


def compacted_name(*parts: str) -> str:
    """A deterministic name from what goes into the file: rerunning an interrupted compaction writes
    the same names again instead of adding files.

    >>> compacted_name("shard-1.parquet:ab", "shard-2.parquet:cd")
    'compact-5941ed9659af4312.parquet'
    """
    digest = hashlib.sha256("\x1f".join(sorted(parts)).encode()).hexdigest()[:16]
    return f"{COMPACT_PREFIX}{digest}.parquet"


def shard_id_of(name: str) -> str | None:
    """The shard id of a shard file name (None for other files).

    >>> shard_id_of("shard-00017.parquet")
    '00017'
    """
    if name.startswith(SHARD_PREFIX) and name.endswith(".parquet"):
        return name[len(SHARD_PREFIX):-len(".parquet")]
    return None


@dataclass(frozen=True)
class Manifest:
    shards: frozenset[str]
    replaces: frozenset[str]

    def metadata(self) -> dict[bytes, bytes]:
        return {METADATA_SHARDS_KEY: json.dumps(sorted(self.shards)).encode(),
                METADATA_REPLACES_KEY: json.dumps(sorted(self.replaces)).encode()}


def read_manifest(metadata: dict[bytes, bytes] | None) -> Manifest:
    """The manifest in a compacted file's footer metadata (empty when absent)."""
    md = metadata or {}
    return Manifest(frozenset(json.loads(md.get(METADATA_SHARDS_KEY, b"[]"))),
                    frozenset(json.loads(md.get(METADATA_REPLACES_KEY, b"[]"))))


@dataclass
class Visibility:
    """The hidden files of some runs, from the manifests of their compacted trajectories files."""

    hidden_compacted: set[tuple[RunKey, str]]
    hidden_shards: set[tuple[RunKey, str]]
    visible: dict[tuple[RunKey, str], Manifest]    # visible compacted file -> its manifest

    def hides(self, run: RunKey, name: str) -> bool:
        if is_compacted(name):
            return (run, name) in self.hidden_compacted
        sid = shard_id_of(name)
        return sid is not None and (run, sid) in self.hidden_shards

    def holder(self, run: RunKey, shard_id: str) -> str | None:
        """The visible compacted file that holds a shard's rows, if any."""
        for (r, name), m in self.visible.items():
            if r == run and shard_id in m.shards:
                return name
        return None


def visibility(compacted: Iterable[tuple[RunKey, str, Manifest]]) -> Visibility:
    """Apply the rule to every compacted trajectories file present: (run, file name, manifest).

    >>> v = visibility([(("answer", "r"), "compact-a.parquet", Manifest(frozenset({"1", "2"}), frozenset())),
    ...                 (("answer", "r"), "compact-b.parquet", Manifest(frozenset({"1", "2", "3"}),
    ...                                                               frozenset({"compact-a.parquet"})))])
    >>> v.hides(("answer", "r"), "compact-a.parquet"), v.hides(("answer", "r"), "shard-3.parquet")
    (True, True)
    >>> v.hides(("answer", "r"), "shard-4.parquet"), v.holder(("answer", "r"), "1")
    (False, 'compact-b.parquet')
    """
    items = list(compacted)
    replaced = {(run, r) for run, _, m in items for r in m.replaces}
    visible = {(run, name): m for run, name, m in items if (run, name) not in replaced}
    shards = {(run, sid) for (run, _), m in visible.items() for sid in m.shards}
    return Visibility(replaced, shards, visible)


def run_of(path: str) -> RunKey | None:
    """(kind, run_id) from a file path's Hive segments.

    >>> run_of("/lake/trajectories/kind=answer/date=2026-11-21/run_id=r1/shard-1.parquet")
    ('answer', 'r1')
    """
    values = dict(seg.split("=", 1) for seg in path.split("/")[:-1] if "=" in seg)
    if "kind" in values and "run_id" in values:
        return values["kind"], values["run_id"]
    return None


def compacted_files(loc: LakeLocation, kind: str | None = None, run_id: str | None = None) -> list[str]:
    """Paths of the compacted trajectories files present (committed), optionally of one kind/run."""
    loc.fs.invalidate_cache(loc.path("trajectories"))
    pattern = loc.path("trajectories", f"kind={kind or '*'}", "date=*", f"run_id={run_id or '*'}",
                       f"{COMPACT_PREFIX}*.parquet")
    return sorted(loc.glob(pattern))


def load_visibility(loc: LakeLocation, kind: str | None = None, run_id: str | None = None,
                    footers: dict[str, dict[bytes, bytes] | None] | None = None) -> Visibility:
    """The visibility of a lake's (or one run's) files, from its compacted files' footers.

    ``footers``: a cache of footer metadata by path, filled as files are read.
    """
    import pyarrow.parquet as pq

    cache = footers if footers is not None else {}
    found = []
    for path in compacted_files(loc, kind, run_id):
        run = run_of(path)
        if run is None:
            continue
        if path not in cache:
            try:
                with loc.fs.open(path, "rb") as fh:
                    cache[path] = pq.read_metadata(fh).metadata
            except FileNotFoundError:
                continue          # replaced and deleted by a compaction since the listing
            except Exception as e:  # noqa: BLE001 - an unreadable footer: the reader reports it as corrupt
                log.warning("lake: cannot read the manifest of %s: %s", loc.uri(path), str(e).splitlines()[0])
                continue
        found.append((run, path.rsplit("/", 1)[1], read_manifest(cache[path])))
    return visibility(found)
