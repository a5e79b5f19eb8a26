"""What the three providers' wire formats share: settings, request state, faults, replies and batches.

Each provider module (``openai``, ``anthropic``, ``google``) registers a ``Wire`` here: how its error,
success and malformed bodies look. ``Req`` is one parsed request, whatever the route; ``Batch`` one batch of
any provider, whose requests finish evenly across ``batch_delay_s``.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import math
import random
import re
import time
import uuid
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from aiohttp import web

_FAULT_RE = re.compile(r"\[\[fault:([a-z0-9]+)(?:\*(\d+))?\]\]")
ROUTES = ("openai", "anthropic", "gemini")


@dataclass
class EmulatorConfig:
    latency_s: float = 0.0              # added to every reply
    latency_jitter_s: float = 0.0       # uniform extra in [0, jitter]
    rpm: float | None = None            # enforce requests/min per model (429 beyond it)
    rpm_burst_s: float = 2.0            # seconds of requests the enforcing bucket may burst
    retry_after_s: float = 0.2          # Retry-After sent with fault 429s
    hang_s: float = 3600.0              # how long a hang lasts
    api_key: str | None = None          # when set, other keys get 401 (the body echoes the key, as real APIs partly do)
    scripted: list[dict[str, str]] = field(default_factory=list)   # [{"match": substr, "reply": text, "model"?: m}]
    faults: list[dict[str, Any]] = field(default_factory=list)     # [{"kind","route"?,"match"?,"count"?,"p"?}]
    seed: int = 0
    reply_prefix: str = ""              # prepended to echo replies (e.g. to make them long)
    cached_input_fraction: float = 0.0  # share of prompt tokens reported as prompt-cache reads
    batch_delay_s: float = 0.0          # a batch's processing time; its requests finish evenly across it
    batch_window_s: float | None = None # a batch expires this long after creation (unfinished requests expire)
    batch_error_p: float = 0.0          # each batched request fails (HTTP 500 in its result) with this probability
    stream_delay_s: float = 0.0         # a streamed reply (stream: true) waits this long before each piece
    stream_pause_after: int | None = None   # a streamed reply stops after this many pieces until released
                                        # (``Emulator.release_streams``, POST /_emulator/release): lets a test see
                                        # what its client has received while the reply is provably unfinished


@dataclass
class Req:
    route: str
    model: str
    text: str          # all message text concatenated (what faults and scripts match)
    system: str
    max_tokens: int | None
    thinking: bool
    key: str | None
    body_hash: str
    stream: bool = False       # the client asked for a streamed reply (server-sent events)
    include_usage: bool = False   # OpenAI's stream_options.include_usage


class _Bucket:
    """Server-side enforcement of an RPM limit, to prove clients stay under it."""

    def __init__(self, rpm: float, burst_s: float):
        self.rate = rpm / 60.0
        self.cap = max(1.0, self.rate * burst_s)
        self.tokens = self.cap
        self.t = time.monotonic()

    def take(self) -> float:
        now = time.monotonic()
        self.tokens = min(self.cap, self.tokens + (now - self.t) * self.rate)
        self.t = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


class EmulatorState:
    def __init__(self, config: EmulatorConfig | None = None):
        self.config = config or EmulatorConfig()
        self.reset()

    def reset(self) -> None:
        self.counts: Counter[str] = Counter()
        self.seen: Counter[str] = Counter()        # body hash -> times seen (for [[fault:x*N]])
        self.recent: deque[dict[str, Any]] = deque(maxlen=64)
        self.buckets: dict[str, _Bucket] = {}
        self.rng = random.Random(self.config.seed)
        self.in_flight = 0
        self.max_in_flight = 0
        self.plan_used: Counter[int] = Counter()
        self.first_arrival: float | None = None    # time.monotonic() of the first/last request since reset
        self.last_arrival: float | None = None
        self.arrivals: deque[float] = deque(maxlen=200_000)   # every arrival time (rate measurements)
        self.files: dict[str, tuple[str, str, bytes]] = {}     # id -> (filename, purpose, content)
        self.batches: dict[str, Batch] = {}
        self.batch_seen: Counter[str] = Counter()              # request body hash -> batch submissions
        self.stream_gate = asyncio.Event()                     # set: paused streams go on (and new ones do not pause)
        self.streams_paused = 0                                # streamed replies that reached the pause point
        self.streams_finished = 0                              # streamed replies whose last piece was sent

    def configure(self, patch: dict[str, Any]) -> None:
        names = {f.name for f in fields(EmulatorConfig)}
        bad = sorted(set(patch) - names)
        if bad:
            raise ValueError(f"unknown emulator settings: {bad}")
        cfg = asdict(self.config)
        cfg.update(patch)
        self.config = EmulatorConfig(**cfg)
        self.buckets.clear()
        self.rng = random.Random(self.config.seed)
        self.plan_used.clear()

    # -------------------------------------------------------- fault choice
    def fault_for(self, req: Req) -> str | None:
        self.seen[req.body_hash] += 1
        m = _FAULT_RE.search(req.text)
        if m:
            kind, n = m.group(1), m.group(2)
            if n is None or self.seen[req.body_hash] <= int(n):
                return kind
        for i, rule in enumerate(self.config.faults):
            if rule.get("route") not in (None, req.route):
                continue
            if rule.get("match") and rule["match"] not in req.text:
                continue
            if "count" in rule and self.plan_used[i] >= int(rule["count"]):
                continue
            if self.rng.random() >= float(rule.get("p", 1.0)):
                continue
            self.plan_used[i] += 1
            return str(rule["kind"])
        if self.config.rpm:
            b = self.buckets.get(req.model)
            if b is None:
                b = self.buckets[req.model] = _Bucket(self.config.rpm, self.config.rpm_burst_s)
            wait = b.take()
            if wait > 0:
                self.counts[f"{req.route}:rpm_exceeded"] += 1
                return f"429@{wait:.3f}"
        return None

    def reply_text(self, req: Req) -> str:
        for s in self.config.scripted:
            if s.get("match", "") in req.text and s.get("model", req.model) == req.model:
                return s["reply"]
        digest = hashlib.sha256((req.system + "\x1e" + req.text).encode()).hexdigest()[:12]
        return f"{self.config.reply_prefix}reply from {req.model} to {digest}"


# ------------------------------------------------------------ wire formats

def tokens(text: str) -> int:
    return max(1, len(text) // 4)


@dataclass(frozen=True)
class Usage:
    """A success reply's token counts and finish, computed once for every provider's body."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int         # prompt-cache reads, reported each provider's way
    truncated: bool            # cut at the request's max tokens
    created: int               # unix seconds


@dataclass(frozen=True)
class StreamEvents:
    """A streamed reply as server-sent events: ``head`` (before any text), one event per text piece, ``tail``
    (finish, usage, end); the server may pause between pieces."""

    head: list[bytes]
    pieces: list[bytes]
    tail: list[bytes]


@dataclass(frozen=True)
class Wire:
    """One provider's bodies: ``error(status, message)``, ``success(req, text, usage)``, a malformed reply
    that parses as JSON (``bad_schema``), where its key travels (``key_header``, else a bearer token), and
    its streamed reply (``stream(req, pieces, usage)``), the same text and usage as ``success`` in events."""

    error: Callable[[int, str], dict[str, Any]]
    success: Callable[[Req, str, Usage], dict[str, Any]]
    bad_schema: dict[str, Any]
    key_header: str | None = None
    stream: Callable[[Req, list[str], Usage], StreamEvents] | None = None


WIRES: dict[str, Wire] = {}


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent event carrying ``data`` as JSON.

    >>> sse({"a": 1}, "ping")
    b'event: ping\\ndata: {"a": 1}\\n\\n'
    """
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def pieces_of(text: str) -> list[str]:
    """A reply cut into word pieces, as a model emits it; joined they are the text.

    >>> pieces_of("one two  three"), pieces_of("")
    (['one ', 'two  ', 'three'], [])
    """
    return re.findall(r"\s*\S+\s*|\s+", text)


def error_body(route: str, status: int, message: str) -> dict[str, Any]:
    return WIRES[route].error(status, message)


def reply_usage(req: Req, text: str, cached_fraction: float = 0.0) -> tuple[str, Usage]:
    """The reply's text cut at the request's max tokens, and its usage (streamed or not, the same)."""
    in_tok = tokens(req.system + req.text)
    truncated = req.max_tokens is not None and tokens(text) > int(req.max_tokens)
    if truncated:
        text = text[: int(req.max_tokens or 0) * 4]
    return text, Usage(in_tok, tokens(text) if text else 0, int(in_tok * cached_fraction), truncated, int(time.time()))


def success_body(req: Req, text: str, cached_fraction: float = 0.0) -> dict[str, Any]:
    text, usage = reply_usage(req, text, cached_fraction)
    return WIRES[req.route].success(req, text, usage)


def bad_schema(route: str) -> dict[str, Any]:
    return WIRES[route].bad_schema


# ------------------------------------------------------------- batch APIs

BATCH_FAULT_RE = re.compile(r"\[\[batchfault:(error|expire)(?:\*(\d+))?\]\]")
_IDS = itertools.count(1)


@dataclass
class Item:
    custom_id: str
    req: Req
    fate: str                  # "ok" | "error" | "stuck" (never processed: it expires or is cancelled)
    due: float                 # monotonic time its processing finishes
    reply: dict[str, Any]      # the provider's success body (used when fate == "ok")
    metadata: dict[str, Any] | None = None


class Batch:
    """One batch: its requests finish evenly across ``batch_delay_s``; expiry or cancellation cuts off the rest.

    A request that is stuck (``[[batchfault:expire]]``) keeps the batch running until it expires: at
    ``batch_window_s`` if set, else at the end of the delay.
    """

    def __init__(self, bid: str, route: str, model: str, items: list[Item], cfg: EmulatorConfig, **extra: Any):
        self.id, self.route, self.model, self.items = bid, route, model, items
        self.extra = extra                       # endpoint, input_file_id, metadata, display_name, results_url
        self.created = time.monotonic()
        self.created_wall = time.time()
        n = max(len(items), 1)
        for i, it in enumerate(items):
            it.due = self.created + cfg.batch_delay_s * (i + 1) / n if it.fate != "stuck" else math.inf
        self.done_at = max((it.due for it in items), default=self.created)
        window = cfg.batch_window_s
        if window is None and self.done_at == math.inf:
            window = cfg.batch_delay_s
        self.expires_at = self.created + window if window is not None else math.inf
        self.cancelled_at = math.inf
        self.output_files: tuple[str | None, str | None] | None = None

    def end(self) -> float:
        return min(self.done_at, self.expires_at, self.cancelled_at)

    def ended(self, now: float) -> bool:
        return now >= self.end()

    def reason(self) -> str:
        """completed | expired | cancelled (for an ended batch)."""
        if self.done_at <= min(self.expires_at, self.cancelled_at):
            return "completed"
        return "cancelled" if self.cancelled_at <= self.expires_at else "expired"

    def outcome(self, it: Item) -> str:
        """ok | error | expired | cancelled, once the batch has ended."""
        if it.due <= self.end():
            return it.fate
        return "cancelled" if self.reason() == "cancelled" else "expired"

    def counts(self) -> Counter[str]:
        return Counter(self.outcome(it) for it in self.items)

    def wall(self, t: float) -> float:
        return self.created_wall + (t - self.created)

    def summary(self, now: float) -> dict[str, Any]:
        return {"id": self.id, "route": self.route, "model": self.model,
                "status": self.reason() if self.ended(now) else "in_progress",
                "custom_ids": [it.custom_id for it in self.items]}


def iso(t: float) -> str:
    import datetime as _dt

    return _dt.datetime.fromtimestamp(t, _dt.UTC).isoformat().replace("+00:00", "Z")


def batch_item(state: EmulatorState, custom_id: str, req: Req, body: Any, metadata: Any = None) -> Item:
    """Decide a request's fate (deterministic per body and submission count) and its reply."""
    h = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()
    state.batch_seen[h] += 1
    n = state.batch_seen[h]
    fate = "ok"
    m = BATCH_FAULT_RE.search(req.text)
    if m and (m.group(2) is None or n <= int(m.group(2))):
        fate = "error" if m.group(1) == "error" else "stuck"
    elif state.config.batch_error_p and random.Random(f"{state.config.seed}:{h}:{n}").random() < state.config.batch_error_p:
        fate = "error"
    reply = success_body(req, state.reply_text(req), state.config.cached_input_fraction) if fate == "ok" else {}
    state.recent.append({"route": req.route, "model": req.model, "body": body, "batch": True})
    return Item(custom_id, req, fate, 0.0, reply, metadata)


def new_id(state: EmulatorState, prefix: str) -> str:
    """Unique for the life of the process (as a provider's ids are), also across ``reset``."""
    return f"{prefix}{next(_IDS):06d}{uuid.uuid4().hex[:8]}"


def key_check(state: EmulatorState, route: str, request: web.Request) -> web.Response | None:
    """A 401 for a batch route called with the wrong key (when the emulator demands one)."""
    h = request.headers
    header = WIRES[route].key_header
    key = (h.get(header) if header else None) or h.get("Authorization", "").removeprefix("Bearer ") or None
    if state.config.api_key is not None and key != state.config.api_key:
        state.counts[f"{route}:401"] += 1
        return web.json_response(error_body(route, 401, "invalid API key"), status=401)
    return None


Handler = Callable[[], Awaitable[web.StreamResponse]]


class BatchRoutes:
    """What every provider's batch endpoints share; each handler counts ``<route>_batch:<op>`` and checks the key."""

    route = ""

    def __init__(self, state: EmulatorState):
        self.state = state

    def batch(self, bid: str) -> Batch | web.Response:
        b = self.state.batches.get(bid)
        if b is None or b.route != self.route:
            return web.json_response(error_body(self.route, 404, f"no batch {bid}"), status=404)
        return b

    async def guarded(self, request: web.Request, op: str, fn: Handler) -> web.StreamResponse:
        self.state.counts[f"{self.route}_batch:{op}"] += 1
        return key_check(self.state, self.route, request) or await fn()

    @staticmethod
    def cancel(b: Batch) -> None:
        if not b.ended(time.monotonic()):
            b.cancelled_at = time.monotonic()
