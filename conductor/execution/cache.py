"""Content-addressed response cache on local disk (SQLite, WAL).

WHY: a rerun of a shard, or a re-score of an old run, must not pay twice. The
key is the sha256 of everything that determines a reply: provider, model,
endpoint, sampling settings, provider options, the rendered messages and the
sample index (so a GRPO group's independent samples stay independent). The
first stored reply wins, so every later reader sees the same text.

Modes: ``read_write`` (default), ``read_only`` (use hits, store nothing),
``write_only`` (refresh), ``replay`` (never call a provider: a miss is an
infrastructure failure ``cache_miss``). Safe with several writers, threads or
processes: WAL journal, a busy timeout, INSERT OR IGNORE; all SQLite work runs
on one thread per cache so the event loop never blocks on a lock.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import shutil
import sqlite3
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import orjson

from conductor.execution.sqlite_wal import connect, connect_wal
from conductor.files import atomic_path
from conductor.workers.providers.base import Completion, Message, ProviderError
from conductor.workers.secrets import redact

if TYPE_CHECKING:
    from conductor.workers.pool import Worker

CacheMode = Literal["read_write", "read_only", "write_only", "replay"]
MODES: tuple[str, ...] = ("read_write", "read_only", "write_only", "replay")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    key TEXT PRIMARY KEY,
    provider TEXT NOT NULL,
    model TEXT NOT NULL,
    text TEXT NOT NULL,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    finish_reason TEXT,
    created REAL NOT NULL,
    latency_s REAL
)"""
_COLUMNS = "key, provider, model, text, input_tokens, output_tokens, finish_reason, created, latency_s"


def _add_latency_column(conn: sqlite3.Connection) -> None:
    """Caches written before the ``latency_s`` column (2026-11-29) gain it, empty: their calls' seconds are unknown."""
    cols = {row[1] for row in conn.execute("PRAGMA table_info(responses)")}
    if "latency_s" not in cols:
        conn.execute("ALTER TABLE responses ADD COLUMN latency_s REAL")


def messages_hash(messages: list[Message]) -> str:
    """sha256 of the rendered messages (recorded on every call).

    >>> messages_hash([Message("user", "hi")]) == messages_hash([Message("user", "hi")])
    True
    """
    pairs = [[m.role, m.content] for m in messages]
    try:   # orjson writes the same bytes as json.dumps(ensure_ascii=False, compact) for lists of strings, 5x faster
        body = orjson.dumps(pairs)
    except TypeError:   # a lone surrogate: json's message, as before
        body = json.dumps(pairs, ensure_ascii=False, separators=(",", ":")).encode()
    return hashlib.sha256(body).hexdigest()


MANIFEST_URL_OPTION = "manifest_base_url"


def cache_key(worker: Worker, messages: list[Message], sample_index: int = 0) -> str:
    """The content address of one call; the worker's *name* is not part of it.

    >>> from conductor.workers.pool import Worker
    >>> a = Worker(name="a", provider="openai", model="m")
    >>> b = Worker(name="b", provider="openai", model="m")
    >>> cache_key(a, [Message("user", "q")]) == cache_key(b, [Message("user", "q")])
    True
    >>> cache_key(a, [Message("user", "q")], 0) == cache_key(a, [Message("user", "q")], 1)
    False
    """
    options = dict(worker.options)
    # an embedded server's URL carries a port that changes every run: key on the manifest's embedded:// URL
    base_url = options.pop(MANIFEST_URL_OPTION, None) or worker.base_url or ""
    body = {
        "provider": worker.provider, "model": worker.model, "base_url": base_url,
        "sampling": worker.sampling.model_dump(mode="json"), "options": options,
        "messages": [[m.role, m.content] for m in messages], "sample": sample_index,
    }
    if worker.sandbox is not None:   # a code-running worker's limits change what it prints
        body["sandbox"] = worker.sandbox.model_dump(mode="json")
    raw = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(raw.encode()).hexdigest()


class ResponseCache:
    def __init__(self, path: str | Path, mode: CacheMode = "read_write", busy_timeout_s: float = 60.0):
        if mode not in MODES:
            raise ValueError(f"cache mode {mode!r}: expected one of {', '.join(MODES)}")
        self.path = Path(path)
        self.mode = mode
        self.hits = 0
        self.misses = 0
        self.writes = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="response-cache")
        self._local = threading.local()
        self._busy_ms = int(busy_timeout_s * 1000)
        try:
            self._pool.submit(self._conn).result()   # create the file and schema now: fail early
        except sqlite3.Error as e:
            self._pool.shutdown(wait=False)
            raise ValueError(f"{self.path}: cannot open the response cache: {e}") from None

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self.mode != "replay" and self.mode != "read_only":
                conn = connect_wal(self.path, self._busy_ms / 1000)
                conn.execute(_SCHEMA)
                _add_latency_column(conn)
            else:
                conn = connect(self.path, self._busy_ms / 1000)
            self._local.conn = conn
        return conn

    # -- synchronous core (runs on the cache thread) --
    def _get(self, key: str) -> Completion | None:
        conn = self._conn()
        try:
            row = conn.execute(f"SELECT text, input_tokens, output_tokens, finish_reason, {self._latency(conn)} "
                               "FROM responses WHERE key=?", (key,)).fetchone()
        except sqlite3.OperationalError as e:
            if "no such table" in str(e):
                return None
            raise
        if row is None:
            return None
        return Completion(row[0], int(row[1]), int(row[2]), row[3], None if row[4] is None else float(row[4]))

    def _latency(self, conn: sqlite3.Connection) -> str:
        """The latency column's expression: NULL in a read-only cache written before the column existed."""
        found = getattr(self._local, "latency_expr", None)
        if found is None:
            cols = {row[1] for row in conn.execute("PRAGMA table_info(responses)")}
            found = self._local.latency_expr = "latency_s" if "latency_s" in cols or not cols else "NULL"
        return str(found)

    def _put(self, key: str, provider: str, model: str, c: Completion) -> None:
        self._conn().execute(
            f"INSERT OR IGNORE INTO responses ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?)",
            (key, provider, model, redact(c.text), c.input_tokens, c.output_tokens, c.finish_reason, time.time(),
             c.latency_s))

    # -- async API (used by the executor) --
    async def get(self, key: str) -> Completion | None:
        if self.mode == "write_only":
            return None
        hit = await asyncio.get_running_loop().run_in_executor(self._pool, self._get, key)
        if hit is None:
            self.misses += 1
        else:
            self.hits += 1
        return hit

    async def put(self, key: str, worker: Worker, completion: Completion) -> None:
        if self.mode in ("read_only", "replay"):
            return
        await asyncio.get_running_loop().run_in_executor(
            self._pool, self._put, key, worker.provider, worker.model, completion)
        self.writes += 1

    # -- synchronous API (callers outside the event loop, e.g. the conductor's own generations) --
    def lookup(self, key: str) -> Completion | None:
        """A stored reply, or None; never counts towards the worker-call hit statistics."""
        return None if self.mode == "write_only" else self._pool.submit(self._get, key).result()

    def store(self, key: str, provider: str, model: str, completion: Completion) -> None:
        if self.mode not in ("read_only", "replay"):
            self._pool.submit(self._put, key, provider, model, completion).result()

    def miss_error(self, worker: Worker) -> ProviderError:
        return ProviderError("cache_miss", f"worker {worker.name}: no cached reply in {self.path.name} "
                             "and the cache is in replay mode (no provider calls)")

    def count(self) -> int:
        return self._pool.submit(lambda: self._conn().execute("SELECT COUNT(*) FROM responses").fetchone()[0]).result()

    def close(self) -> None:
        close_confined(self._pool, self._local)


def close_confined(pool: ThreadPoolExecutor, local: threading.local) -> None:
    """Close a SQLite connection that lives on ``pool``'s one thread (``local.conn``), then stop the pool.

    Shared by the response cache and the batch store: SQLite connections must be closed on their own thread.
    """
    def _close() -> None:
        conn = getattr(local, "conn", None)
        if conn is not None:
            conn.close()
            local.conn = None
    try:
        pool.submit(_close).result()
    except RuntimeError:  # interpreter shutdown already stopped the pool; every write was committed
        return
    pool.shutdown(wait=True)


def copy_responses(src: str | Path, dest: str | Path, busy_timeout_s: float = 60.0) -> int:
    """Add to the cache ``dest`` every reply stored in ``src`` (a cache file, or one gzipped) that ``dest`` lacks.

    WHY: a temperature-0 call paid on one machine need not be paid again on another: a learning run carried to
    a new machine, a probe seeded from a run. As in the cache itself, the first stored reply wins (a key
    ``dest`` already holds keeps its reply). Returns how many replies were added; raises ``ValueError`` with
    one line naming ``src`` when it is missing or not a response cache.
    """
    src = Path(src)
    if not src.is_file():
        raise ValueError(f"{src}: no such response cache")
    with tempfile.TemporaryDirectory() as tmp:
        plain = src
        if src.suffix == ".gz":
            plain = Path(tmp, "src.sqlite")
            try:
                with gzip.open(src) as f, plain.open("wb") as out:
                    shutil.copyfileobj(f, out)
            except (OSError, EOFError) as e:
                raise ValueError(f"{src}: not a gzipped response cache ({e})") from None
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        conn = connect_wal(str(dest), busy_timeout_s)
        try:
            conn.execute(_SCHEMA)
            _add_latency_column(conn)
            conn.execute("ATTACH DATABASE ? AS src", (str(plain),))
            before = conn.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
            src_cols = {row[1] for row in conn.execute("PRAGMA src.table_info(responses)")}
            latency = "latency_s" if "latency_s" in src_cols else "NULL"
            conn.execute(f"INSERT OR IGNORE INTO responses ({_COLUMNS}) SELECT key, provider, model, text, "
                         f"input_tokens, output_tokens, finish_reason, created, {latency} FROM src.responses")
            added = conn.execute("SELECT COUNT(*) FROM responses").fetchone()[0] - before
            conn.execute("DETACH DATABASE src")
        except sqlite3.DatabaseError as e:
            raise ValueError(f"{src}: not a response cache ({e})") from None
        finally:
            conn.close()
    return int(added)


def export_responses(src: str | Path, dest_gz: str | Path) -> int:
    """A consistent gzipped snapshot of the cache ``src`` (safe while a run writes to it), written atomically;
    returns how many replies it holds. Read back with ``copy_responses``."""
    if not Path(src).is_file():
        raise ValueError(f"{src}: no such response cache")
    dest_gz = Path(dest_gz)
    dest_gz.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        snap = Path(tmp, "snap.sqlite")
        live, copy = connect(str(src), 60.0), sqlite3.connect(snap)
        try:
            live.backup(copy)
            n = copy.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
        except sqlite3.DatabaseError as e:
            raise ValueError(f"{src}: not a response cache ({e})") from None
        finally:
            live.close()
            copy.close()
        with snap.open("rb") as f, atomic_path(dest_gz, suffix=".part") as part, \
                gzip.open(part, "wb", compresslevel=9) as out:
            shutil.copyfileobj(f, out)
    return int(n)
