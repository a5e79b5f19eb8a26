"""Batch handles and collected results on local disk (SQLite, WAL), so a killed run never pays twice.

WHY: a batch can take hours; a run killed while polling (kill -9, a lost node) must resume polling the
batches it already created, not submit their requests again. Every request is named by its custom id, the
response-cache key of the call (``conductor.execution.cache.cache_key``), so a rerun that makes the same call finds
it: first among collected results, then among the members of a batch still open. A batch is recorded the
moment its create call returns; results are recorded, with each member's outcome, in one transaction
before anyone waiting on them is woken.

Tables: ``batches`` (id, adapter, group, the worker as JSON, status submitted|collected, the wave of the
process that created it), ``members``
(custom id, batch, position, outcome), ``results`` (custom id -> text, usage, finish reason). Reply text
is redacted, as in the response cache; the worker JSON holds the key's variable *name*, never a key.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from conductor.execution.cache import close_confined
from conductor.execution.sqlite_wal import connect_wal
from conductor.workers.secrets import redact

T = TypeVar("T")

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS batches (
        batch_id TEXT PRIMARY KEY, adapter TEXT NOT NULL, group_key TEXT NOT NULL, worker TEXT NOT NULL,
        status TEXT NOT NULL, n INTEGER NOT NULL, created REAL NOT NULL, ended REAL, final_status TEXT,
        wave INTEGER NOT NULL DEFAULT 0)""",
    """CREATE TABLE IF NOT EXISTS members (
        custom_id TEXT NOT NULL, batch_id TEXT NOT NULL, position INTEGER NOT NULL, outcome TEXT,
        PRIMARY KEY (batch_id, custom_id))""",
    "CREATE INDEX IF NOT EXISTS members_by_id ON members(custom_id)",
    """CREATE TABLE IF NOT EXISTS results (
        custom_id TEXT PRIMARY KEY, batch_id TEXT NOT NULL, text TEXT NOT NULL, input_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL, cached_input_tokens INTEGER NOT NULL, finish_reason TEXT,
        created REAL NOT NULL)""",
)


@dataclass(frozen=True)
class StoredResult:
    custom_id: str
    batch_id: str
    text: str
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int
    finish_reason: str | None


@dataclass(frozen=True)
class OpenBatch:
    """A batch created but not yet collected: what a resumed run needs to poll it."""

    batch_id: str
    adapter: str
    group_key: str
    worker_json: str
    custom_ids: tuple[str, ...]


class BatchStore:
    """One SQLite file; all work on one thread per store so the event loop never blocks on a lock."""

    def __init__(self, path: str | Path, busy_timeout_s: float = 60.0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-store")
        self._local = threading.local()
        self._busy_s = busy_timeout_s
        try:
            self._pool.submit(self._conn).result()
        except sqlite3.Error as e:
            self._pool.shutdown(wait=False)
            raise ValueError(f"{self.path}: cannot open the batch store: {e}") from None

    @staticmethod
    def beside(cache_path: str | Path) -> Path:
        """Where a run's batch store lives: next to its response cache (``cache.sqlite`` -> ``cache.batches.sqlite``).

        >>> str(BatchStore.beside("runs/x/cache.sqlite"))
        'runs/x/cache.batches.sqlite'
        """
        p = Path(cache_path)
        return p.with_name(f"{p.stem}.batches.sqlite")

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect_wal(self.path, self._busy_s)
            for stmt in _SCHEMA:
                conn.execute(stmt)
            self._local.conn = conn
        return conn

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` on the store thread from synchronous code (tests, reports)."""
        return self._pool.submit(fn, *args).result()

    # ---------------------------------------------------- synchronous core
    def record_batch(self, batch_id: str, adapter: str, group_key: str, worker_json: str,
                     custom_ids: Sequence[str], wave: int = 0) -> None:
        c = self._conn()
        with _tx(c):
            c.execute("INSERT OR IGNORE INTO batches (batch_id, adapter, group_key, worker, status, n, created, wave) "
                      "VALUES (?,?,?,?,?,?,?,?)", (batch_id, adapter, group_key, worker_json, "submitted",
                                                   len(custom_ids), time.time(), wave))
            c.executemany("INSERT OR IGNORE INTO members (custom_id, batch_id, position) VALUES (?,?,?)",
                          [(cid, batch_id, i) for i, cid in enumerate(custom_ids)])

    def lookup(self, custom_id: str) -> tuple[StoredResult | None, OpenBatch | None]:
        """The collected result for this call, else the open batch it belongs to (one consistent read)."""
        c = self._conn()
        with _tx(c):
            res = self._result(c, custom_id)
            if res is not None:
                return res, None
            row = c.execute("SELECT b.batch_id FROM members m JOIN batches b ON b.batch_id = m.batch_id "
                            "WHERE m.custom_id = ? AND b.status = 'submitted' LIMIT 1", (custom_id,)).fetchone()
            return None, (self._open(c, row[0]) if row else None)

    def result(self, custom_id: str) -> StoredResult | None:
        return self._result(self._conn(), custom_id)

    def open_batches(self) -> list[OpenBatch]:
        c = self._conn()
        with _tx(c):
            ids = [r[0] for r in c.execute("SELECT batch_id FROM batches WHERE status = 'submitted' ORDER BY created")]
            return [self._open(c, b) for b in ids]

    def attempts(self, custom_id: str) -> int:
        """How many batches this call has been submitted in (by any process)."""
        return int(self._conn().execute("SELECT COUNT(*) FROM members WHERE custom_id = ?", (custom_id,)).fetchone()[0])

    def attempts_of(self, custom_ids: Sequence[str]) -> dict[str, int]:
        c = self._conn()
        return {k: int(c.execute("SELECT COUNT(*) FROM members WHERE custom_id = ?", (k,)).fetchone()[0])
                for k in custom_ids}

    def record_results(self, batch_id: str, final_status: str, outcomes: dict[str, str],
                       results: Sequence[StoredResult]) -> None:
        """Collect a batch: every member's outcome, every success's reply, and the batch closed, atomically."""
        c = self._conn()
        now = time.time()
        with _tx(c):
            c.executemany("INSERT OR IGNORE INTO results VALUES (?,?,?,?,?,?,?,?)",
                          [(r.custom_id, r.batch_id, redact(r.text), r.input_tokens, r.output_tokens,
                            r.cached_input_tokens, r.finish_reason, now) for r in results])
            c.executemany("UPDATE members SET outcome = ? WHERE batch_id = ? AND custom_id = ?",
                          [(o, batch_id, cid) for cid, o in outcomes.items()])
            c.execute("UPDATE batches SET status = 'collected', ended = ?, final_status = ? WHERE batch_id = ?",
                      (now, final_status, batch_id))

    def batches(self) -> list[dict[str, Any]]:
        """Every batch recorded (for reports and tests)."""
        cols = ("batch_id", "adapter", "status", "n", "final_status", "wave", "created", "ended")
        cur = self._conn().execute(f"SELECT {', '.join(cols)} FROM batches ORDER BY created")
        return [dict(zip(cols, r)) for r in cur]

    def submissions(self) -> dict[str, int]:
        """custom id -> number of batches it was submitted in."""
        return {r[0]: int(r[1]) for r in self._conn().execute("SELECT custom_id, COUNT(*) FROM members GROUP BY custom_id")}

    @staticmethod
    def _result(c: sqlite3.Connection, custom_id: str) -> StoredResult | None:
        row = c.execute("SELECT custom_id, batch_id, text, input_tokens, output_tokens, cached_input_tokens, "
                        "finish_reason FROM results WHERE custom_id = ?", (custom_id,)).fetchone()
        return StoredResult(row[0], row[1], row[2], int(row[3]), int(row[4]), int(row[5]), row[6]) if row else None

    @staticmethod
    def _open(c: sqlite3.Connection, batch_id: str) -> OpenBatch:
        b = c.execute("SELECT adapter, group_key, worker FROM batches WHERE batch_id = ?", (batch_id,)).fetchone()
        ids = tuple(r[0] for r in c.execute("SELECT custom_id FROM members WHERE batch_id = ? ORDER BY position",
                                            (batch_id,)))
        return OpenBatch(batch_id, b[0], b[1], b[2], ids)

    def close(self) -> None:
        close_confined(self._pool, self._local)


class _tx:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error) on an autocommit connection."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self.conn.execute("ROLLBACK" if exc_type else "COMMIT")
