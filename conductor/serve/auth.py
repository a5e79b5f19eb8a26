"""API keys (kept only as SHA-256 hashes) and per-key rate limits through the project's shared limiter.

Keys come from an environment variable (``name=key,name2=key2``; a bare key is named by its hash) and/or a
secrets file of lines ``name sha256:<hex>`` (``conductor serve-key NAME`` writes one). Clear keys never stay in
memory after start-up and never reach a log: a request is known by its key's name.

Per-key limits use the executor's buckets (``conductor.execution.ratelimit``): in this process, or in the
SQLite store of ``conductor.execution.shared_limits`` so several replicas on one machine share one quota per
key. Over the limit a request is refused at once (429 with Retry-After), never queued.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from conductor.serve.errors import APIError, auth_error, rate_limited

if TYPE_CHECKING:
    from conductor.execution.ratelimit import KeyLimiter
    from conductor.execution.shared_limits import Lease, SQLiteKey, SQLiteLimits


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def check_keyless(host: str | None, content_type: str | None, post: bool) -> None:
    """A server without API keys answers loopback clients only: ``Host`` must name a loopback address (a web
    page elsewhere cannot reach it through DNS rebinding), and a POST body must be declared JSON (a cross-site
    form or ``text/plain`` POST, which a browser sends without asking, would run a billed workflow). With
    keys, the key is the check (a browser cannot attach one cross-site).

    >>> check_keyless("127.0.0.1:8000", "application/json; charset=utf-8", post=True)
    >>> try:
    ...     check_keyless("evil.example:8000", "application/json", post=True)
    ... except APIError as e:
    ...     print(e.status, e.code)
    403 host_not_allowed
    """
    name = (host or "").strip().lower()
    if name.startswith("["):             # [::1]:8000
        name = name[1:].partition("]")[0]
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    if name not in LOOPBACK_HOSTS:
        raise APIError(403, "invalid_request_error", "host_not_allowed",
                       f"Host {host!r}: this server has no API keys, so it answers loopback names only "
                       "(127.0.0.1, localhost, [::1]); configure keys to serve other names")
    media = (content_type or "").partition(";")[0].strip().lower()
    if post and media != "application/json":
        raise APIError(415, "invalid_request_error", "unsupported_media_type",
                       f"Content-Type {content_type or '(none)'!r}: send the body as application/json")


def hash_key(key: str) -> str:
    """SHA-256 hex digest: what is stored and compared instead of the key.

    >>> hash_key("abc")[:12]
    'ba7816bf8f01'
    """
    return hashlib.sha256(key.encode()).hexdigest()


def new_key_line(name: str) -> tuple[str, str]:
    """(a fresh key, the secrets-file line that stores its hash)."""
    key = "cnd-" + secrets.token_urlsafe(32)
    return key, f"{name} sha256:{hash_key(key)}"


class KeyStore:
    """name by key hash; ``open`` when no key is configured (a warning at start-up says so)."""

    def __init__(self, hashed: dict[str, str]):
        self._by_hash = dict(hashed)       # sha256 hex -> name

    @property
    def open(self) -> bool:
        return not self._by_hash

    def __len__(self) -> int:
        return len(self._by_hash)

    @classmethod
    def load(cls, env_name: str | None, keys_file: str | None) -> KeyStore:
        hashed: dict[str, str] = {}
        raw = os.environ.get(env_name, "") if env_name else ""
        for item in (p.strip() for p in raw.split(",")):
            if not item:
                continue
            name, sep, key = item.partition("=")
            if not sep:
                name, key = "", item
            digest = hash_key(key.strip())
            hashed[digest] = name.strip() or f"key-{digest[:8]}"
        if keys_file:
            path = Path(keys_file).expanduser()
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
            except OSError as e:
                raise ValueError(f"keys file {path}: cannot read: {e.strerror or e}") from None
            for i, line in enumerate(lines, 1):
                line = line.split("#", 1)[0].strip()
                if not line:
                    continue
                parts = line.split()
                if len(parts) != 2 or not parts[1].startswith("sha256:") or len(parts[1]) != 71:
                    raise ValueError(f"keys file {path}:{i}: expected 'NAME sha256:<64 hex digits>' "
                                     "(store hashes, never keys; `conductor serve-key NAME` writes a line)")
                hashed[parts[1][7:].lower()] = parts[0]
        return cls(hashed)

    def identify(self, authorization: str | None) -> str:
        """The key's name for an ``Authorization: Bearer <key>`` header, or a 401 APIError."""
        if self.open:
            return "anonymous"
        if not authorization:
            raise auth_error("no API key: send 'Authorization: Bearer <key>'")
        scheme, _, key = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise auth_error("malformed Authorization header: expected 'Bearer <key>'")
        digest = hash_key(key.strip())
        for known, name in self._by_hash.items():   # constant time per comparison
            if hmac.compare_digest(known, digest):
                return name
        raise auth_error("incorrect API key")


@dataclass
class Admission:
    key: str
    lease: tuple[SQLiteKey, Lease] | None = None     # a slot in the shared store; None: counted in this process


class ClientLimiter:
    """Requests per minute and requests in flight per API key; refuse (429) instead of queueing.

    ``burst_s``: a key may send this many seconds' worth of its per-minute rate at once (an application
    opening many concurrent requests is normal), then the sustained rate applies."""

    def __init__(self, rpm: float | None, concurrency: int, store: str | None = None, burst_s: float = 10.0):
        from conductor.execution.shared_limits import SQLiteLimits, open_shared
        from conductor.workers.pool import Limits

        self.limits = Limits(requests_per_minute=rpm, max_concurrency=max(1, concurrency), timeout_s=600.0)
        self.burst_s = burst_s
        shared = open_shared(store)
        if shared is not None and not isinstance(shared, SQLiteLimits):
            raise ValueError(f"client limits {store!r}: use 'local' or 'sqlite:PATH' (a refusal must not wait)")
        self.shared: SQLiteLimits | None = shared
        self._local: dict[str, KeyLimiter] = {}
        self._shared_keys: dict[str, SQLiteKey] = {}

    def _key_limiter(self, key: str) -> KeyLimiter:
        from conductor.execution.ratelimit import KeyLimiter

        lim = self._local.get(key)
        if lim is None:
            lim = self._local[key] = KeyLimiter(f"serve/client/{key}", self.limits, self.burst_s)
        return lim

    async def admit(self, key: str) -> Admission:
        if self.shared is not None:
            skey = self._shared_keys.get(key)
            if skey is None:
                skey = self._shared_keys[key] = self.shared.key(f"serve/client/{key}", self.limits, self.burst_s)
            lease, wait = await skey.try_acquire()
            if lease is None:
                raise self._refusal(key, wait)
            return Admission(key, (skey, lease))
        lim = self._key_limiter(key)
        if lim.in_flight >= lim.max_concurrency:
            raise rate_limited(f"API key {key!r}: {lim.max_concurrency} requests already in flight", 1.0)
        now = time.monotonic()
        if lim.rpm is not None:
            wait = lim.rpm.wait_time(1, now)
            if wait > 0:
                raise self._refusal(key, wait)
            lim.rpm.take(1, now)
        lim.in_flight += 1
        return Admission(key)

    def _refusal(self, key: str, wait: float) -> APIError:
        rpm = self.limits.requests_per_minute
        what = f"{rpm:g} requests per minute" if rpm else "its concurrency limit"
        return rate_limited(f"API key {key!r} is over its limit of {what}; retry after {wait:.1f} s", wait)

    async def release(self, adm: Admission) -> None:
        if adm.lease is not None:
            skey, lease = adm.lease
            try:
                await skey.release(lease, 0)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a lease that cannot be freed expires on its own
                pass
            return
        lim = self._local.get(adm.key)
        if lim is not None:
            lim.in_flight -= 1

    def close(self) -> None:
        close = getattr(self.shared, "close", None)
        if close is not None:
            close()
