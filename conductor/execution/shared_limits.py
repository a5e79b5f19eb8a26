"""Rate limits shared by processes: one provider quota, however many processes or machines spend it.

WHY: a flow fanned out over Dask, Ray or several Prefect workers runs one
executor per process; with in-process buckets each would spend the full RPM/TPM
on its own. A store all of them consult holds the quota instead:

* ``sqlite:PATH`` (``SQLiteLimits``): every process on one machine. The request
  and token buckets (the same arithmetic as ``ratelimit.Bucket``), the Retry-After
  pause and the concurrency slots of each key are rows in one SQLite file; every
  admission is one ``BEGIN IMMEDIATE`` transaction, so processes serialise on
  SQLite's own file lock. Tokens are taken by weight (one row per bucket, not per
  token) and the unused part of a reservation is refunded. A slot is a lease row
  with the holder's pid and an expiry: a process killed mid-call frees its slots.
* ``prefect`` (``PrefectLimits``): every machine talking to one Prefect server.
  Requests and tokens are Prefect global concurrency limits with slot decay
  (``rate_limit``: the server's own token bucket, weighted by tokens), the
  concurrency cap a plain global concurrency limit held for the call.

Not pyrate-limiter's SQLiteBucket: it stores one row per unit of weight (a call
reserving 4,096 tokens inserts 4,096 rows), cannot refund an unused reservation,
and has no shared concurrency cap.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, NamedTuple, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, PlainSerializer, WithJsonSchema
from pydantic_core import PydanticCustomError

from conductor.execution.ratelimit import Bucket, bucket_shapes, check_pause
from conductor.execution.sqlite_wal import connect_wal

if TYPE_CHECKING:
    from conductor.execution.ratelimit import SharedLimits
    from conductor.workers.pool import Limits

_T = TypeVar("_T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS bucket (key TEXT NOT NULL, kind TEXT NOT NULL, level REAL NOT NULL, t REAL NOT NULL,
                                   PRIMARY KEY (key, kind));
CREATE TABLE IF NOT EXISTS pause (key TEXT PRIMARY KEY, until REAL NOT NULL);
CREATE TABLE IF NOT EXISTS lease (id TEXT PRIMARY KEY, key TEXT NOT NULL, pid INTEGER NOT NULL,
                                  expires REAL NOT NULL);
CREATE INDEX IF NOT EXISTS lease_key ON lease (key, expires);
"""


class SQLiteLimits:
    """Buckets, pauses and concurrency leases of every limit key in one SQLite file (one machine).

    All SQLite work runs on one thread per store, so the event loop never blocks on
    the file lock. ``poll_s``: how often a waiter re-checks when every slot is taken.
    """

    def __init__(self, path: str | Path, poll_s: float = 0.05, lease_margin_s: float = 30.0):
        self.path = str(path)
        self.spec = f"sqlite:{self.path}"
        self.poll_s = poll_s
        self.lease_margin_s = lease_margin_s
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shared-limits")
        self._local = threading.local()
        self._pool.submit(self._conn).result()          # create the schema now: errors surface here

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect_wal(self.path, busy_timeout_s=60.0)
            conn.executescript(_SCHEMA)
            self._local.conn = conn
        return conn

    async def run(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def transact(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run ``fn(conn, now, *args)`` in one write transaction (other processes wait on the file lock)."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            out = fn(conn, time.time(), *args)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return out

    def key(self, name: str, limits: Limits, burst_s: float) -> SQLiteKey:
        return SQLiteKey(self, name, limits, burst_s)

    def close(self) -> None:
        def _close() -> None:
            conn = getattr(self._local, "conn", None)
            if conn is not None:
                conn.close()
                self._local.conn = None
        self._pool.submit(_close).result()
        self._pool.shutdown(wait=True)

    def __getstate__(self) -> dict[str, Any]:           # travels to Dask/Ray workers as its path
        return {"path": self.path, "poll_s": self.poll_s, "lease_margin_s": self.lease_margin_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["poll_s"], state["lease_margin_s"])  # type: ignore[misc]


class Lease(NamedTuple):
    """A held concurrency slot: its row id, and when (store clock, ``time.time()``) the call was admitted."""

    id: str
    at: float


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SQLiteKey:
    """One limit key in a ``SQLiteLimits`` store."""

    def __init__(self, store: SQLiteLimits, name: str, limits: Limits, burst_s: float):
        self.store = store
        self.name = name
        self.shapes = bucket_shapes(limits, burst_s)
        self.max_concurrency = limits.max_concurrency
        self.lease_s = limits.timeout_s + store.lease_margin_s    # a call never holds its slot longer

    # ---------------------------------------------------------------- inside one transaction
    def _bucket(self, conn: sqlite3.Connection, kind: str, now: float) -> Bucket:
        rate, cap = self.shapes[kind]
        b = Bucket(rate, cap)
        row = conn.execute("SELECT level, t FROM bucket WHERE key = ? AND kind = ?", (self.name, kind)).fetchone()
        if row is not None:
            b.level, b.t = min(cap, row[0]), row[1]
        b.wait_time(0, now)                                       # refill up to now
        return b

    @staticmethod
    def _save(conn: sqlite3.Connection, key: str, kind: str, b: Bucket) -> None:
        conn.execute("INSERT INTO bucket (key, kind, level, t) VALUES (?, ?, ?, ?) "
                     "ON CONFLICT (key, kind) DO UPDATE SET level = excluded.level, t = excluded.t",
                     (key, kind, b.level, b.t))

    def _slots_in_use(self, conn: sqlite3.Connection, now: float) -> int:
        conn.execute("DELETE FROM lease WHERE key = ? AND expires <= ?", (self.name, now))
        n = conn.execute("SELECT count(*) FROM lease WHERE key = ?", (self.name,)).fetchone()[0]
        if n >= self.max_concurrency:                             # free the slots of killed processes
            dead = [pid for (pid,) in conn.execute("SELECT DISTINCT pid FROM lease WHERE key = ?", (self.name,))
                    if not _pid_alive(pid)]
            for pid in dead:
                conn.execute("DELETE FROM lease WHERE key = ? AND pid = ?", (self.name, pid))
            if dead:
                n = conn.execute("SELECT count(*) FROM lease WHERE key = ?", (self.name,)).fetchone()[0]
        return n

    def _try(self, conn: sqlite3.Connection, now: float, tokens: int) -> tuple[str, float, str | None]:
        """('paused', seconds left, None) | ('wait', seconds, None) | ('ok', now, lease id)."""
        row = conn.execute("SELECT until FROM pause WHERE key = ?", (self.name,)).fetchone()
        if row is not None and row[0] > now:
            return "paused", row[0] - now, None
        if self._slots_in_use(conn, now) >= self.max_concurrency:
            return "wait", self.store.poll_s, None
        need = {"rpm": 1, "tpm": tokens}
        buckets = {k: self._bucket(conn, k, now) for k in self.shapes if need[k]}
        wait = max((b.wait_time(need[k], now) for k, b in buckets.items()), default=0.0)
        if wait > 0:
            return "wait", wait, None
        for k, b in buckets.items():
            b.take(need[k], now)
            self._save(conn, self.name, k, b)
        lease = uuid.uuid4().hex
        conn.execute("INSERT INTO lease (id, key, pid, expires) VALUES (?, ?, ?, ?)",
                     (lease, self.name, os.getpid(), now + self.lease_s))
        return "ok", now, lease

    def _release(self, conn: sqlite3.Connection, now: float, lease: Lease | None, unused: int) -> None:
        if lease is not None:
            conn.execute("DELETE FROM lease WHERE id = ?", (lease.id,))
        if unused and "tpm" in self.shapes:
            b = self._bucket(conn, "tpm", now)
            b.refund(unused)
            self._save(conn, self.name, "tpm", b)

    def _pause(self, conn: sqlite3.Connection, now: float, seconds: float) -> None:
        if seconds > 0:
            conn.execute("INSERT INTO pause (key, until) VALUES (?, ?) "
                         "ON CONFLICT (key) DO UPDATE SET until = max(until, excluded.until)",
                         (self.name, now + seconds))
        if "rpm" in self.shapes:
            b = self._bucket(conn, "rpm", now)
            b.drain()
            self._save(conn, self.name, "rpm", b)

    async def try_acquire(self, tokens: int = 0) -> tuple[Lease | None, float]:
        """One attempt that never waits (a server refusing instead of queueing): (lease, 0.0) when admitted,
        else (None, seconds until an attempt may succeed)."""
        state, value, lease = await self.store.run(self.store.transact, self._try, tokens)
        return (Lease(lease, value), 0.0) if state == "ok" and lease is not None else (None, value)

    # ---------------------------------------------------------------- the SharedKey protocol
    async def acquire(self, tokens: int, pause_budget_s: float | None) -> tuple[Lease, float]:
        paused = 0.0
        while True:
            state, value, lease = await self.store.run(self.store.transact, self._try, tokens)
            if state == "ok" and lease is not None:
                return Lease(lease, value), paused
            if state == "paused":
                check_pause(self.name, value, None if pause_budget_s is None else pause_budget_s - paused)
                paused += value
            await asyncio.sleep(value)

    async def release(self, lease: Any, unused_tokens: int) -> None:
        await self.store.run(self.store.transact, self._release, lease, unused_tokens)

    async def pause(self, seconds: float) -> None:
        await self.store.run(self.store.transact, self._pause, seconds)


class PrefectLimits:
    """Limits shared by every machine that uses one Prefect server (``PREFECT_API_URL``).

    Per limit key: ``<prefix>:<key>:rpm`` and ``:tpm`` are global concurrency limits
    with slot decay (Prefect's server-side token bucket: ``limit`` = capacity,
    ``slot_decay_per_second`` = rate), acquired with ``rate_limit`` (tokens by
    weight; unused tokens are given back with a decrement); ``:slots`` is a
    global concurrency limit of ``max_concurrency`` held around the call. Each
    acquisition is a round trip to the API: fine for provider quotas of a few
    hundred calls per second, not for more. Retry-After pauses stay per process
    (they drain the shared request bucket). Prefect is imported only here.
    """

    def __init__(self, prefix: str = "conductor", lease_s: float = 300.0):
        self.prefix = prefix
        self.lease_s = lease_s
        self.spec = "prefect" if prefix == "conductor" else f"prefect:{prefix}"
        self._ready: set[str] = set()

    def key(self, name: str, limits: Limits, burst_s: float) -> PrefectKey:
        return PrefectKey(self, name, limits, burst_s)

    def name(self, key: str, part: str) -> str:
        raw = f"{self.prefix}:{key}:{part}"
        return "".join(c if c.isalnum() or c in ":-_.@" else "_" for c in raw)[-200:]

    async def ensure(self, name: str, limit: int, decay: float | None) -> None:
        """Create the global limit on first use (or bring its numbers up to date)."""
        if name in self._ready:
            return
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
        from prefect.exceptions import ObjectNotFound

        async with get_client() as client:
            try:
                current = await client.read_global_concurrency_limit_by_name(name)
            except ObjectNotFound:
                try:
                    await client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(
                        name=name, limit=limit, slot_decay_per_second=decay or 0.0))
                except Exception:  # noqa: BLE001 - another process created it first
                    await client.read_global_concurrency_limit_by_name(name)
            else:
                if current.limit != limit or (current.slot_decay_per_second or 0.0) != (decay or 0.0):
                    await client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(
                        limit=limit, slot_decay_per_second=decay or 0.0))
        self._ready.add(name)

    def __getstate__(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "lease_s": self.lease_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["prefix"], state["lease_s"])  # type: ignore[misc]


class PrefectKey:
    """One limit key as Prefect global concurrency limits."""

    def __init__(self, store: PrefectLimits, name: str, limits: Limits, burst_s: float):
        self.store = store
        self.shapes = bucket_shapes(limits, burst_s)
        self.max_concurrency = limits.max_concurrency
        self.names = {part: store.name(name, part) for part in ("rpm", "tpm", "slots")}

    async def acquire(self, tokens: int, pause_budget_s: float | None) -> tuple[AsyncExitStack, float]:
        from prefect.concurrency.asyncio import concurrency, rate_limit

        await self.store.ensure(self.names["slots"], self.max_concurrency, None)
        for part in self.shapes:
            rate, cap = self.shapes[part]
            await self.store.ensure(self.names[part], max(1, int(cap)), rate)
        stack = AsyncExitStack()
        await stack.enter_async_context(concurrency(self.names["slots"], occupy=1, strict=True,
                                                    lease_duration=self.store.lease_s))
        try:
            if "rpm" in self.shapes:
                await rate_limit(self.names["rpm"], occupy=1, strict=True)
            if "tpm" in self.shapes and tokens:
                await rate_limit(self.names["tpm"], occupy=tokens, strict=True)
        except BaseException:
            await stack.aclose()
            raise
        return stack, 0.0

    async def release(self, lease: Any, unused_tokens: int) -> None:
        if lease is not None:
            await lease.aclose()
        if unused_tokens > 0 and "tpm" in self.shapes:
            from prefect.client.orchestration import get_client

            async with get_client() as client:
                await client.release_concurrency_slots(names=[self.names["tpm"]], slots=unused_tokens,
                                                       occupancy_seconds=0.0)

    async def pause(self, seconds: float) -> None:
        """Spend the shared request burst: every process slows down at once (the pause itself stays local)."""
        if "rpm" not in self.shapes:
            return
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

        async with get_client() as client:
            await client.update_global_concurrency_limit(
                self.names["rpm"], GlobalConcurrencyLimitUpdate(active_slots=max(1, int(self.shapes["rpm"][1]))))


class LimitsSpec(BaseModel):
    """Where a run's rate limits live, ``local | sqlite:PATH | prefect[:PREFIX]``, parsed once (``parse``) where a
    run configuration is read; ``str()`` is the canonical text.

    >>> LimitsSpec.parse("sqlite:~/l.sqlite"), LimitsSpec.parse("prefect").where, str(LimitsSpec.parse(" local "))
    (LimitsSpec('sqlite:~/l.sqlite'), None, 'local')
    >>> LimitsSpec.parse("redis:x")
    Traceback (most recent call last):
    ...
    ValueError: limits 'redis:x': expected 'local', 'sqlite:PATH' or 'prefect[:PREFIX]'
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    store: Literal["local", "sqlite", "prefect"]
    where: str | None = None    # sqlite: the file (``~`` expanded when opened); prefect: the limits' name prefix

    @classmethod
    def parse(cls, text: str | LimitsSpec) -> LimitsSpec:
        """The one parser of limits settings; ValueError (one line) for anything else."""
        if isinstance(text, LimitsSpec):
            return text
        raw = str(text).strip()
        store, _, rest = raw.partition(":")
        if raw in ("", "local"):
            return cls(store="local")
        if store == "sqlite" and rest.strip():
            return cls(store="sqlite", where=rest.strip())
        if store == "prefect":
            return cls(store="prefect", where=rest.strip() or None)
        raise ValueError(f"limits {text!r}: expected 'local', 'sqlite:PATH' or 'prefect[:PREFIX]'")

    @property
    def path(self) -> Path | None:
        """The SQLite file of a ``sqlite:`` store, ``~`` expanded; None for the others."""
        return Path(os.path.expanduser(self.where)) if self.store == "sqlite" and self.where else None

    def __str__(self) -> str:
        return self.store if self.where is None else f"{self.store}:{self.where}"

    def __repr__(self) -> str:
        return f"LimitsSpec({str(self)!r})"


def _limits_field(value: Any) -> Any:
    """A run configuration's ``limits`` text validates into the type (its message names the setting)."""
    if not isinstance(value, str):
        return value
    try:
        return LimitsSpec.parse(value)
    except ValueError as e:
        raise PydanticCustomError("limits", "{reason}", {"reason": str(e)}) from None


# A run configuration's field: text in YAML and on the command line, the type inside, the text when saved.
LimitsField = Annotated[LimitsSpec, BeforeValidator(_limits_field), PlainSerializer(str, return_type=str),
                        WithJsonSchema({"type": "string", "description": "local, sqlite:PATH or prefect"})]


def open_shared(spec: LimitsSpec | str | None) -> SharedLimits | None:
    """A store from its spec: None/``local`` (this process only), ``sqlite:PATH``, ``prefect[:PREFIX]``.

    >>> open_shared("local") is None
    True
    """
    limits = LimitsSpec.parse(spec) if spec is not None else LimitsSpec(store="local")
    match limits:
        case LimitsSpec(store="sqlite"):
            return SQLiteLimits(limits.path or "")
        case LimitsSpec(store="prefect", where=prefix):
            return PrefectLimits(prefix or "conductor")
    return None


def default_spec(cache_path: str | None, fans_out: bool) -> str | None:
    """The run's store when none is given: the SQLite file next to the response cache when the
    run fans out over processes (in-process runs keep their own buckets).

    >>> default_spec("/runs/a/cache.sqlite", True)
    'sqlite:/runs/a/limits.sqlite'
    >>> default_spec("/runs/a/cache.sqlite", False) is None
    True
    """
    if not fans_out:
        return None
    if cache_path and "://" not in cache_path:
        return f"sqlite:{Path(cache_path).expanduser().parent / 'limits.sqlite'}"
    from conductor.local.embedded import conductor_home

    return f"sqlite:{conductor_home() / 'limits.sqlite'}"
