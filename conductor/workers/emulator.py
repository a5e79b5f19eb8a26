"""A local provider emulator: OpenAI, Anthropic and Gemini wire formats on 127.0.0.1.

WHY: tests and benchmarks must drive the *real* SDK clients (openai, anthropic,
google-genai) through real HTTP, including the failures real providers produce
(429 with Retry-After, 5xx, hangs, malformed bodies), without any network.

Routes (what the SDKs call):
  POST /v1/chat/completions                  OpenAI chat completions (base_url .../v1)
  POST /v1/messages                          Anthropic messages (base_url = root)
  POST /v1beta/models/{model}:generateContent  Gemini (http_options base_url = root)
Batch APIs (processing delay, partial failures, expiry and cancellation; see ``_Batch``):
  POST /v1/files, GET /v1/files/{id}[/content], POST /v1/batches, GET /v1/batches[/{id}],
  POST /v1/batches/{id}/cancel                 OpenAI Batch API (JSONL input file, output/error files)
  POST /v1/messages/batches, GET /v1/messages/batches/{id}[/results], POST .../{id}/cancel
                                               Anthropic Message Batches (JSONL results)
  POST /v1beta/models/{model}:batchGenerateContent, GET /v1beta/batches/{id}, POST /v1beta/batches/{id}:cancel
                                               Gemini batch mode (inlined requests and responses; also
                                               under /v1, the SDK's default API version)
Control:
  GET  /_emulator/stats     request counts per route and outcome
  GET  /_emulator/requests  the last request bodies (to check what an SDK sent)
  GET  /_emulator/arrivals  monotonic arrival time of every request (rate measurements)
  POST /_emulator/config    merge settings (see ``EmulatorConfig``)
  POST /_emulator/reset     zero the counters and fault state (and forget batches and files)
  GET  /_emulator/batches   every batch created: id, route, status, custom ids

Replies are echo-style by default and deterministic: ``reply from <model> to
<digest of the messages>``, so equal inputs give equal outputs and a test can
check that parallel and sequential execution saw the same messages. Scripted
replies match a substring of the prompt. Faults come from a fault plan in the
config or from magic text in the prompt: ``[[fault:429]]``, ``[[fault:500]]``,
``[[fault:hang]]``, ``[[fault:malformed]]``, ``[[fault:badschema]]``,
``[[fault:empty]]``, ``[[fault:401]]``, ``[[fault:400]]``; ``[[fault:429*2]]``
fails the first two requests with that exact body and then succeeds. In batches, ``[[batchfault:error]]``
fails a request (HTTP 500 inside the results) and ``[[batchfault:expire]]`` leaves it unprocessed until its
batch expires; ``*N`` limits either to the request's first N submissions.

Run: ``python -m conductor.workers.emulator --port 8765 --latency 0.05 --rpm 6000``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import math
import random
import re
import threading
import time
import uuid
from collections import Counter, deque
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


@dataclass
class _Req:
    route: str
    model: str
    text: str          # all message text concatenated (what faults and scripts match)
    system: str
    max_tokens: int | None
    thinking: bool
    key: str | None
    body_hash: str


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
        self.batches: dict[str, _Batch] = {}
        self.batch_seen: Counter[str] = Counter()              # request body hash -> batch submissions

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
    def fault_for(self, req: _Req) -> str | None:
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

    def reply_text(self, req: _Req) -> str:
        for s in self.config.scripted:
            if s.get("match", "") in req.text and s.get("model", req.model) == req.model:
                return s["reply"]
        digest = hashlib.sha256((req.system + "\x1e" + req.text).encode()).hexdigest()[:12]
        return f"{self.config.reply_prefix}reply from {req.model} to {digest}"


# ------------------------------------------------------------ wire formats

def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


def _openai_req(body: dict[str, Any], headers: Any) -> _Req:
    msgs = body.get("messages") or []
    texts = [m.get("content") if isinstance(m.get("content"), str) else json.dumps(m.get("content"))
             for m in msgs if m.get("role") != "system"]
    system = "\n".join(str(m.get("content")) for m in msgs if m.get("role") == "system")
    auth = headers.get("Authorization", "")
    extra = body.get("chat_template_kwargs") or {}
    return _Req("openai", str(body.get("model", "")), "\n".join(texts), system,
                body.get("max_completion_tokens") or body.get("max_tokens"),
                bool(extra.get("enable_thinking")) or bool(body.get("reasoning_effort")),
                auth.removeprefix("Bearer ") or None, "")


def _anthropic_req(body: dict[str, Any], headers: Any) -> _Req:
    def flat(c: Any) -> str:
        if isinstance(c, str):
            return c
        return "".join(b.get("text", "") for b in c or [] if isinstance(b, dict))
    texts = [flat(m.get("content")) for m in body.get("messages") or []]
    thinking = (body.get("thinking") or {}).get("type") == "enabled"
    return _Req("anthropic", str(body.get("model", "")), "\n".join(texts), flat(body.get("system") or ""),
                body.get("max_tokens"), thinking,
                headers.get("x-api-key") or headers.get("Authorization", "").removeprefix("Bearer ") or None, "")


def _gemini_req(model: str, body: dict[str, Any], headers: Any) -> _Req:
    texts = ["".join(p.get("text", "") for p in c.get("parts") or []) for c in body.get("contents") or []]
    si = body.get("systemInstruction") or body.get("system_instruction") or {}
    system = "".join(p.get("text", "") for p in si.get("parts") or []) if isinstance(si, dict) else ""
    gen = body.get("generationConfig") or {}
    tc = gen.get("thinkingConfig") or gen.get("thinking_config") or {}
    budget = tc.get("thinkingBudget", tc.get("thinking_budget"))   # proto JSON accepts both spellings
    return _Req("gemini", model, "\n".join(texts), system, gen.get("maxOutputTokens"),
                bool(budget), headers.get("x-goog-api-key"), "")


def _error_body(route: str, status: int, message: str) -> dict[str, Any]:
    if route == "anthropic":
        etype = {429: "rate_limit_error", 401: "authentication_error", 400: "invalid_request_error",
                 529: "overloaded_error"}.get(status, "api_error")
        return {"type": "error", "error": {"type": etype, "message": message}}
    if route == "gemini":
        st = {429: "RESOURCE_EXHAUSTED", 401: "UNAUTHENTICATED", 400: "INVALID_ARGUMENT",
              503: "UNAVAILABLE"}.get(status, "INTERNAL")
        return {"error": {"code": status, "message": message, "status": st}}
    etype = {429: "rate_limit_error", 401: "invalid_request_error", 400: "invalid_request_error"}.get(status, "server_error")
    return {"error": {"message": message, "type": etype, "code": None, "param": None}}


def _success_body(req: _Req, text: str, cached_fraction: float = 0.0) -> dict[str, Any]:
    in_tok = _tokens(req.system + req.text)
    cached = int(in_tok * cached_fraction)          # prompt-cache reads, reported each provider's way
    truncated = req.max_tokens is not None and _tokens(text) > int(req.max_tokens)
    if truncated:
        text = text[: int(req.max_tokens) * 4]
    out_tok = _tokens(text) if text else 0
    created = int(time.time())
    if req.route == "anthropic":
        content: list[dict[str, Any]] = []
        if req.thinking:
            content.append({"type": "thinking", "thinking": "thinking...", "signature": "emulator"})
        content.append({"type": "text", "text": text})
        a_usage: dict[str, Any] = {"input_tokens": in_tok - cached, "output_tokens": out_tok}
        if cached:
            a_usage["cache_read_input_tokens"] = cached
        return {"id": f"msg_{created}", "type": "message", "role": "assistant", "model": req.model,
                "content": content, "stop_reason": "max_tokens" if truncated else "end_turn",
                "stop_sequence": None, "usage": a_usage}
    if req.route == "gemini":
        thoughts = 8 if req.thinking else 0
        usage = {"promptTokenCount": in_tok, "candidatesTokenCount": out_tok,
                 "totalTokenCount": in_tok + out_tok + thoughts}
        if thoughts:
            usage["thoughtsTokenCount"] = thoughts
        if cached:
            usage["cachedContentTokenCount"] = cached
        return {"candidates": [{"content": {"parts": [{"text": text}], "role": "model"},
                                "finishReason": "MAX_TOKENS" if truncated else "STOP", "index": 0}],
                "usageMetadata": usage, "modelVersion": req.model}
    o_usage: dict[str, Any] = {"prompt_tokens": in_tok, "completion_tokens": out_tok, "total_tokens": in_tok + out_tok}
    if cached:
        o_usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return {"id": f"chatcmpl-{created}", "object": "chat.completion", "created": created, "model": req.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "length" if truncated else "stop"}],
            "usage": o_usage}


def _bad_schema(route: str) -> dict[str, Any]:
    return {"anthropic": {"type": "message", "content": "nope"},
            "gemini": {"candidates": "nope", "usageMetadata": []},
            "openai": {"object": "chat.completion", "choices": [{"index": 0, "message": None}]}}[route]


# ------------------------------------------------------------- batch APIs

_BATCH_FAULT_RE = re.compile(r"\[\[batchfault:(error|expire)(?:\*(\d+))?\]\]")
_IDS = itertools.count(1)
_ANTHROPIC_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_GEMINI_BATCH_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch"


@dataclass
class _Item:
    custom_id: str
    req: _Req
    fate: str                  # "ok" | "error" | "stuck" (never processed: it expires or is cancelled)
    due: float                 # monotonic time its processing finishes
    reply: dict[str, Any]      # the provider's success body (used when fate == "ok")
    metadata: dict[str, Any] | None = None


class _Batch:
    """One batch: its requests finish evenly across ``batch_delay_s``; expiry or cancellation cuts off the rest.

    A request that is stuck (``[[batchfault:expire]]``) keeps the batch running until it expires: at
    ``batch_window_s`` if set, else at the end of the delay.
    """

    def __init__(self, bid: str, route: str, model: str, items: list[_Item], cfg: EmulatorConfig, **extra: Any):
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

    def outcome(self, it: _Item) -> str:
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


def _iso(t: float) -> str:
    import datetime as _dt

    return _dt.datetime.fromtimestamp(t, _dt.UTC).isoformat().replace("+00:00", "Z")


def _batch_item(state: EmulatorState, custom_id: str, req: _Req, body: Any, metadata: Any = None) -> _Item:
    """Decide a request's fate (deterministic per body and submission count) and its reply."""
    h = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()
    state.batch_seen[h] += 1
    n = state.batch_seen[h]
    fate = "ok"
    m = _BATCH_FAULT_RE.search(req.text)
    if m and (m.group(2) is None or n <= int(m.group(2))):
        fate = "error" if m.group(1) == "error" else "stuck"
    elif state.config.batch_error_p and random.Random(f"{state.config.seed}:{h}:{n}").random() < state.config.batch_error_p:
        fate = "error"
    reply = _success_body(req, state.reply_text(req), state.config.cached_input_fraction) if fate == "ok" else {}
    state.recent.append({"route": req.route, "model": req.model, "body": body, "batch": True})
    return _Item(custom_id, req, fate, 0.0, reply, metadata)


def _new_id(state: EmulatorState, prefix: str) -> str:
    """Unique for the life of the process (as a provider's ids are), also across ``reset``."""
    return f"{prefix}{next(_IDS):06d}{uuid.uuid4().hex[:8]}"


# -- OpenAI: files + batches --

def _openai_batch_view(state: EmulatorState, b: _Batch) -> dict[str, Any]:
    now = time.monotonic()
    ended = b.ended(now)
    status = "in_progress"
    out_id = err_id = None
    if b.extra.get("errors"):
        status = "failed"
    elif ended:
        status = b.reason()
        out_id, err_id = _openai_output_files(state, b)
    elif b.cancelled_at != math.inf:
        status = "cancelling"
    c = b.counts() if ended else Counter()
    stamp = {"completed": "completed_at", "expired": "expired_at", "cancelled": "cancelled_at"}
    view: dict[str, Any] = {
        "id": b.id, "object": "batch", "endpoint": b.extra.get("endpoint"), "input_file_id": b.extra.get("input_file_id"),
        "completion_window": "24h", "status": status, "output_file_id": out_id, "error_file_id": err_id,
        "created_at": int(b.created_wall), "in_progress_at": int(b.created_wall),
        "expires_at": int(b.created_wall + 86400), "metadata": b.extra.get("metadata"), "model": b.model,
        "errors": {"object": "list", "data": b.extra["errors"]} if b.extra.get("errors") else None,
        "request_counts": {"total": len(b.items), "completed": c["ok"],
                           "failed": (len(b.items) - c["ok"]) if ended else 0}}
    if status in stamp:
        view[stamp[status]] = int(b.wall(b.end()))
    return view


def _openai_output_files(state: EmulatorState, b: _Batch) -> tuple[str | None, str | None]:
    """Write the output and error JSONL files once the batch has ended (ids are stable)."""
    if b.output_files is None:
        out, err = [], []
        for i, it in enumerate(b.items):
            line: dict[str, Any] = {"id": f"batch_req_{b.id}_{i}", "custom_id": it.custom_id, "response": None,
                                    "error": None}
            o = b.outcome(it)
            if o == "ok":
                line["response"] = {"status_code": 200, "request_id": f"req_{i}", "body": it.reply}
                out.append(line)
                continue
            if o == "error":
                line["response"] = {"status_code": 500, "request_id": f"req_{i}",
                                    "body": _error_body("openai", 500, "The server had an error processing your request")}
            else:
                code = "batch_expired" if o == "expired" else "batch_cancelled"
                line["error"] = {"code": code, "message": f"This request was not executed: the batch was {o}."}
            err.append(line)
        ids: list[str | None] = []
        for kind, lines in (("out", out), ("err", err)):
            if not lines:
                ids.append(None)
                continue
            fid = f"file-{b.id}-{kind}"
            state.files[fid] = (f"{b.id}_{kind}.jsonl", "batch_output",
                                b"".join(json.dumps(x).encode() + b"\n" for x in lines))
            ids.append(fid)
        b.output_files = (ids[0], ids[1])
    return b.output_files


def _openai_batch_create(state: EmulatorState, body: dict[str, Any], headers: Any) -> tuple[int, dict[str, Any]]:
    fid = body.get("input_file_id")
    if fid not in state.files:
        return 404, _error_body("openai", 404, f"No such File object: {fid}")
    endpoint = body.get("endpoint", "")
    items: list[_Item] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    models: set[str] = set()
    for n, raw in enumerate(state.files[fid][2].splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
            cid, url, inner = line["custom_id"], line["url"], line["body"]
        except (ValueError, KeyError, TypeError):
            errors.append({"code": "invalid_json_line", "message": "not a batch request line", "line": n})
            continue
        if cid in seen:
            errors.append({"code": "duplicate_custom_id", "message": f"custom_id {cid} repeats", "line": n})
        if url != endpoint:
            errors.append({"code": "mismatched_endpoint", "message": f"url {url} is not {endpoint}", "line": n})
        seen.add(cid)
        models.add(str(inner.get("model")))
        items.append(_batch_item(state, cid, _openai_req(inner, headers), inner))
    if len(models) > 1:
        errors.append({"code": "model_mismatch", "message": "every request in a batch must use the same model",
                       "line": None})
    b = _Batch(_new_id(state, "batch_"), "openai", models.pop() if len(models) == 1 else "", items, state.config,
               endpoint=endpoint, input_file_id=fid, metadata=body.get("metadata"), errors=errors)
    state.batches[b.id] = b
    return 200, _openai_batch_view(state, b)


# -- Anthropic: message batches --

def _anthropic_batch_view(b: _Batch, base: str) -> dict[str, Any]:
    now = time.monotonic()
    ended = b.ended(now)
    c = b.counts() if ended else Counter()
    status = "ended" if ended else ("canceling" if b.cancelled_at != math.inf else "in_progress")
    return {"id": b.id, "type": "message_batch", "processing_status": status,
            "request_counts": {"processing": 0 if ended else len(b.items), "succeeded": c["ok"], "errored": c["error"],
                               "canceled": c["cancelled"], "expired": c["expired"]},
            "created_at": _iso(b.created_wall), "expires_at": _iso(b.created_wall + 86400),
            "ended_at": _iso(b.wall(b.end())) if ended else None, "archived_at": None,
            "cancel_initiated_at": _iso(b.wall(b.cancelled_at)) if b.cancelled_at != math.inf else None,
            "results_url": f"{base}/v1/messages/batches/{b.id}/results" if ended else None}


def _anthropic_results(b: _Batch) -> bytes:
    lines = []
    for it in b.items:
        o = b.outcome(it)
        if o == "ok":
            result: dict[str, Any] = {"type": "succeeded", "message": it.reply}
        elif o == "error":
            result = {"type": "errored", "error": {"type": "error", "error": {"type": "api_error",
                                                                              "message": "Internal server error"}}}
        else:
            result = {"type": "canceled" if o == "cancelled" else "expired"}
        lines.append(json.dumps({"custom_id": it.custom_id, "result": result}).encode() + b"\n")
    return b"".join(lines)


def _anthropic_batch_create(state: EmulatorState, body: dict[str, Any], headers: Any) -> tuple[int, dict[str, Any] | _Batch]:
    reqs = body.get("requests")
    if not isinstance(reqs, list) or not reqs:
        return 400, _error_body("anthropic", 400, "requests: a non-empty list is required")
    seen: set[str] = set()
    items = []
    for i, r in enumerate(reqs):
        cid = str(r.get("custom_id", ""))
        if not _ANTHROPIC_CUSTOM_ID.match(cid) or cid in seen:
            return 400, _error_body("anthropic", 400, f"requests.{i}.custom_id: must be unique and match "
                                                      "^[a-zA-Z0-9_-]{1,64}$")
        seen.add(cid)
        params = r.get("params") or {}
        items.append(_batch_item(state, cid, _anthropic_req(params, headers), params))
    b = _Batch(_new_id(state, "msgbatch_"), "anthropic", "", items, state.config)
    state.batches[b.id] = b
    return 200, b


# -- Gemini: batch mode --

_GRPC = {"error": (13, "Internal error encountered."), "expired": (4, "The batch expired before this request ran."),
         "cancelled": (1, "The batch was cancelled before this request ran.")}


def _gemini_batch_view(b: _Batch) -> dict[str, Any]:
    now = time.monotonic()
    ended = b.ended(now)
    state_name = {"completed": "BATCH_STATE_SUCCEEDED", "expired": "BATCH_STATE_EXPIRED",
                  "cancelled": "BATCH_STATE_CANCELLED"}[b.reason()] if ended else "BATCH_STATE_RUNNING"
    c = b.counts() if ended else Counter()
    meta: dict[str, Any] = {
        "@type": _GEMINI_BATCH_TYPE, "name": f"batches/{b.id}", "model": f"models/{b.model}",
        "displayName": b.extra.get("display_name", ""), "createTime": _iso(b.created_wall),
        "updateTime": _iso(b.wall(min(now, b.end()))), "state": state_name,
        "batchStats": {"requestCount": str(len(b.items)), "successfulRequestCount": str(c["ok"]),
                       "failedRequestCount": str(len(b.items) - c["ok"]) if ended else "0",
                       "pendingRequestCount": "0" if ended else str(len(b.items))}}
    if ended:
        meta["endTime"] = _iso(b.wall(b.end()))
        responses = []
        for it in b.items:
            o = b.outcome(it)
            entry: dict[str, Any] = {"response": it.reply} if o == "ok" else {
                "error": {"code": _GRPC[o][0], "message": _GRPC[o][1]}}
            if it.metadata is not None:
                entry["metadata"] = it.metadata
            responses.append(entry)
        meta["output"] = {"inlinedResponses": {"inlinedResponses": responses}}
    return {"name": f"batches/{b.id}", "metadata": meta, "done": ended}


def _gemini_batch_create(state: EmulatorState, model: str, body: dict[str, Any], headers: Any) -> tuple[int, dict[str, Any]]:
    batch = body.get("batch") or {}
    reqs = (((batch.get("inputConfig") or {}).get("requests") or {}).get("requests"))
    if not isinstance(reqs, list) or not reqs:
        return 400, _error_body("gemini", 400, "batch.inputConfig.requests.requests: a non-empty list is required")
    items = []
    for i, r in enumerate(reqs):
        inner = r.get("request") or {}
        cid = str((r.get("metadata") or {}).get("custom_id", i))
        items.append(_batch_item(state, cid, _gemini_req(model, inner, headers), inner, r.get("metadata")))
    b = _Batch(_new_id(state, "gb"), "gemini", model, items, state.config, display_name=batch.get("displayName", ""))
    state.batches[b.id] = b
    return 200, _gemini_batch_view(b)


def _key_check(state: EmulatorState, route: str, request: web.Request) -> web.Response | None:
    """A 401 for a batch route called with the wrong key (when the emulator demands one)."""
    h = request.headers
    key = (h.get("x-goog-api-key") if route == "gemini" else h.get("x-api-key") if route == "anthropic" else None) \
        or h.get("Authorization", "").removeprefix("Bearer ") or None
    if state.config.api_key is not None and key != state.config.api_key:
        state.counts[f"{route}:401"] += 1
        return web.json_response(_error_body(route, 401, "invalid API key"), status=401)
    return None


class _BatchRoutes:
    """The three providers' batch endpoints; every handler counts ``<route>_batch:<op>`` and checks the key."""

    def __init__(self, state: EmulatorState):
        self.state = state

    def register(self, app: web.Application) -> None:
        r = app.router
        r.add_post("/v1/files", self.file_upload)
        r.add_get("/v1/files/{fid}", self.file_get)
        r.add_get("/v1/files/{fid}/content", self.file_content)
        r.add_post("/v1/batches", self.o_create)
        r.add_get("/v1/batches", self.o_list)
        r.add_get("/v1/batches/{bid}", self.o_get)
        r.add_post("/v1/batches/{bid}/cancel", self.o_cancel)
        r.add_post("/v1/messages/batches", self.a_create)
        r.add_get("/v1/messages/batches/{bid}", self.a_get)
        r.add_get("/v1/messages/batches/{bid}/results", self.a_results)
        r.add_post("/v1/messages/batches/{bid}/cancel", self.a_cancel)
        r.add_get("/v1beta/batches/{tail}", self.g_get)     # GET /v1/batches/{id} is shared with OpenAI (o_get)
        for version in ("v1beta", "v1"):                     # the SDK's default API version is v1
            r.add_post(f"/{version}/batches/{{tail}}", self.g_cancel)

    def batch(self, route: str, bid: str) -> _Batch | web.Response:
        b = self.state.batches.get(bid)
        if b is None or b.route != route:
            return web.json_response(_error_body(route, 404, f"no batch {bid}"), status=404)
        return b

    async def guarded(self, request: web.Request, route: str, op: str, fn: Any) -> web.StreamResponse:
        self.state.counts[f"{route}_batch:{op}"] += 1
        return _key_check(self.state, route, request) or await fn()

    @staticmethod
    def cancel(b: _Batch) -> None:
        if not b.ended(time.monotonic()):
            b.cancelled_at = time.monotonic()

    # -- OpenAI --
    async def file_upload(self, request: web.Request) -> web.StreamResponse:
        async def go() -> web.StreamResponse:
            form = await request.post()
            f = form.get("file")
            if not isinstance(f, web.FileField):
                return web.json_response(_error_body("openai", 400, "file: required"), status=400)
            fid = _new_id(self.state, "file-")
            self.state.files[fid] = (f.filename or "upload.jsonl", str(form.get("purpose", "")), f.file.read())
            return web.json_response(_file_view(fid, self.state.files[fid]))
        return await self.guarded(request, "openai", "file_upload", go)

    async def file_get(self, request: web.Request) -> web.StreamResponse:
        fid = request.match_info["fid"]
        if fid not in self.state.files:
            return web.json_response(_error_body("openai", 404, f"No such File object: {fid}"), status=404)
        return web.json_response(_file_view(fid, self.state.files[fid]))

    async def file_content(self, request: web.Request) -> web.StreamResponse:
        async def go() -> web.StreamResponse:
            fid = request.match_info["fid"]
            if fid not in self.state.files:
                return web.json_response(_error_body("openai", 404, f"No such File object: {fid}"), status=404)
            return web.Response(body=self.state.files[fid][2], content_type="application/octet-stream")
        return await self.guarded(request, "openai", "file_content", go)

    async def o_create(self, request: web.Request) -> web.StreamResponse:
        async def go() -> web.StreamResponse:
            status, body = _openai_batch_create(self.state, await request.json(), request.headers)
            return web.json_response(body, status=status)
        return await self.guarded(request, "openai", "create", go)

    async def o_get(self, request: web.Request) -> web.StreamResponse:
        found = self.state.batches.get(request.match_info["bid"])
        if found is not None and found.route == "gemini":   # Gemini's v1 API shares this path
            return await self._g_get(request, found.id)

        async def go() -> web.StreamResponse:
            b = self.batch("openai", request.match_info["bid"])
            return b if isinstance(b, web.Response) else web.json_response(_openai_batch_view(self.state, b))
        return await self.guarded(request, "openai", "retrieve", go)

    async def o_list(self, request: web.Request) -> web.StreamResponse:
        data = [_openai_batch_view(self.state, b) for b in reversed(list(self.state.batches.values()))
                if b.route == "openai"]
        return web.json_response({"object": "list", "data": data, "has_more": False,
                                  "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None})

    async def o_cancel(self, request: web.Request) -> web.StreamResponse:
        async def go() -> web.StreamResponse:
            b = self.batch("openai", request.match_info["bid"])
            if isinstance(b, web.Response):
                return b
            self.cancel(b)
            view = _openai_batch_view(self.state, b)
            if view["status"] == "cancelled":
                view["status"] = "cancelling"          # what the real API answers to the cancel call itself
            return web.json_response(view)
        return await self.guarded(request, "openai", "cancel", go)

    # -- Anthropic --
    @staticmethod
    def base_of(request: web.Request) -> str:
        return f"{request.scheme}://{request.host}"

    async def a_create(self, request: web.Request) -> web.StreamResponse:
        async def go() -> web.StreamResponse:
            status, out = _anthropic_batch_create(self.state, await request.json(), request.headers)
            if isinstance(out, _Batch):
                return web.json_response(_anthropic_batch_view(out, self.base_of(request)))
            return web.json_response(out, status=status)
        return await self.guarded(request, "anthropic", "create", go)

    async def a_get(self, request: web.Request) -> web.StreamResponse:
        async def go() -> web.StreamResponse:
            b = self.batch("anthropic", request.match_info["bid"])
            if isinstance(b, web.Response):
                return b
            return web.json_response(_anthropic_batch_view(b, self.base_of(request)))
        return await self.guarded(request, "anthropic", "retrieve", go)

    async def a_results(self, request: web.Request) -> web.StreamResponse:
        async def go() -> web.StreamResponse:
            b = self.batch("anthropic", request.match_info["bid"])
            if isinstance(b, web.Response):
                return b
            if not b.ended(time.monotonic()):
                return web.json_response(_error_body("anthropic", 400, "batch has not ended"), status=400)
            return web.Response(body=_anthropic_results(b), content_type="application/binary")
        return await self.guarded(request, "anthropic", "results", go)

    async def a_cancel(self, request: web.Request) -> web.StreamResponse:
        async def go() -> web.StreamResponse:
            b = self.batch("anthropic", request.match_info["bid"])
            if isinstance(b, web.Response):
                return b
            self.cancel(b)
            view = _anthropic_batch_view(b, self.base_of(request))
            if view["processing_status"] == "ended" and b.reason() == "cancelled":
                view.update(processing_status="canceling", results_url=None)
            return web.json_response(view)
        return await self.guarded(request, "anthropic", "cancel", go)

    # -- Gemini (create goes through the models/{model}:batchGenerateContent route) --
    async def g_get(self, request: web.Request) -> web.StreamResponse:
        return await self._g_get(request, request.match_info["tail"])

    async def _g_get(self, request: web.Request, bid: str) -> web.StreamResponse:
        async def go() -> web.StreamResponse:
            b = self.batch("gemini", bid)
            return b if isinstance(b, web.Response) else web.json_response(_gemini_batch_view(b))
        return await self.guarded(request, "gemini", "retrieve", go)

    async def g_cancel(self, request: web.Request) -> web.StreamResponse:
        bid, _, method = request.match_info["tail"].partition(":")
        if method != "cancel":
            return web.json_response(_error_body("gemini", 404, f"unsupported method {method!r}"), status=404)

        async def go() -> web.StreamResponse:
            b = self.batch("gemini", bid)
            if isinstance(b, web.Response):
                return b
            self.cancel(b)
            return web.json_response({})
        return await self.guarded(request, "gemini", "cancel", go)


def _file_view(fid: str, f: tuple[str, str, bytes]) -> dict[str, Any]:
    return {"id": fid, "object": "file", "bytes": len(f[2]), "created_at": int(time.time()), "filename": f[0],
            "purpose": f[1], "status": "processed"}


# ------------------------------------------------------------------ server

def make_app(state: EmulatorState) -> web.Application:
    async def handle(request: web.Request, route: str, model: str | None = None) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return web.json_response(_error_body(route, 400, "request body is not JSON"), status=400)
        req = (_gemini_req(model or "", body, request.headers) if route == "gemini"
               else _anthropic_req(body, request.headers) if route == "anthropic"
               else _openai_req(body, request.headers))
        req.body_hash = hashlib.sha256(raw).hexdigest()
        now = time.monotonic()
        state.first_arrival = state.first_arrival if state.first_arrival is not None else now
        state.last_arrival = now
        state.arrivals.append(now)
        state.counts[route] += 1
        state.recent.append({"route": route, "model": req.model, "body": body})
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            return await _respond(state, req, route)
        finally:
            state.in_flight -= 1

    async def openai(request: web.Request) -> web.StreamResponse:
        return await handle(request, "openai")

    async def anthropic(request: web.Request) -> web.StreamResponse:
        return await handle(request, "anthropic")

    async def gemini(request: web.Request) -> web.StreamResponse:
        model, _, method = request.match_info["tail"].partition(":")
        if method == "batchGenerateContent":
            async def create() -> web.StreamResponse:
                try:
                    body = await request.json()
                except ValueError:
                    return web.json_response(_error_body("gemini", 400, "request body is not JSON"), status=400)
                status, out = _gemini_batch_create(state, model, body, request.headers)
                return web.json_response(out, status=status)
            state.counts["gemini_batch:create"] += 1
            return _key_check(state, "gemini", request) or await create()
        if method != "generateContent":
            return web.json_response(_error_body("gemini", 404, f"unsupported method {method!r}"), status=404)
        return await handle(request, "gemini", model)

    async def stats(_: web.Request) -> web.Response:
        span = (state.last_arrival - state.first_arrival) if state.first_arrival is not None else 0.0
        return web.json_response({"counts": dict(state.counts), "max_in_flight": state.max_in_flight,
                                  "arrival_span_s": span})

    async def arrivals(_: web.Request) -> web.Response:
        return web.json_response(list(state.arrivals))

    async def recent(_: web.Request) -> web.Response:
        return web.json_response(list(state.recent))

    async def config(request: web.Request) -> web.Response:
        try:
            state.configure(await request.json())
        except (ValueError, TypeError) as e:
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response(asdict(state.config))

    async def reset(_: web.Request) -> web.Response:
        state.reset()
        return web.json_response({"ok": True})

    async def batches(_: web.Request) -> web.Response:
        now = time.monotonic()
        return web.json_response([b.summary(now) for b in state.batches.values()])

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", openai)
    app.router.add_post("/chat/completions", openai)
    app.router.add_post("/v1/messages", anthropic)
    app.router.add_post("/v1beta/models/{tail}", gemini)
    app.router.add_post("/v1/models/{tail}", gemini)
    app.router.add_get("/_emulator/stats", stats)
    app.router.add_get("/_emulator/requests", recent)
    app.router.add_get("/_emulator/arrivals", arrivals)
    app.router.add_post("/_emulator/config", config)
    app.router.add_post("/_emulator/reset", reset)
    app.router.add_get("/_emulator/batches", batches)
    _BatchRoutes(state).register(app)
    return app


async def _respond(state: EmulatorState, req: _Req, route: str) -> web.StreamResponse:
    cfg = state.config
    if cfg.latency_s or cfg.latency_jitter_s:
        await asyncio.sleep(cfg.latency_s + state.rng.random() * cfg.latency_jitter_s)
    if cfg.api_key is not None and req.key != cfg.api_key:
        state.counts[f"{route}:401"] += 1
        return web.json_response(_error_body(route, 401, f"Incorrect API key provided: {req.key}"), status=401)
    fault = state.fault_for(req)
    if fault is None or fault == "empty":
        text = "" if fault == "empty" else state.reply_text(req)
        state.counts[f"{route}:ok"] += 1
        return web.json_response(_success_body(req, text, cfg.cached_input_fraction))
    state.counts[f"{route}:{fault.split('@')[0]}"] += 1
    if fault.startswith("429"):
        wait = float(fault.split("@")[1]) if "@" in fault else cfg.retry_after_s
        return web.json_response(_error_body(route, 429, "Rate limit reached, retry later"), status=429,
                                 headers={"Retry-After": f"{max(wait, 0.001):.3f}"})
    if fault in ("500", "502", "503", "529"):
        return web.json_response(_error_body(route, int(fault), "The server had an error"), status=int(fault))
    if fault in ("400", "401", "404"):
        msg = f"Incorrect API key provided: {req.key}" if fault == "401" else "invalid request"
        return web.json_response(_error_body(route, int(fault), msg), status=int(fault))
    if fault == "hang":
        await asyncio.sleep(cfg.hang_s)
        return web.json_response(_error_body(route, 504, "gateway timeout"), status=504)
    if fault == "malformed":
        return web.Response(body=b'{"choices": [ {"message": oops', content_type="application/json")
    if fault == "badschema":
        return web.json_response(_bad_schema(route))
    return web.json_response(_error_body(route, 400, f"unknown fault {fault!r}"), status=400)


# ------------------------------------------------------- in-process handle

class Emulator:
    """The emulator on a background thread (for tests); ``base_url`` once started.

    >>> with Emulator() as emu:
    ...     emu.base_url.startswith("http://127.0.0.1:")
    True
    """

    def __init__(self, config: EmulatorConfig | None = None, port: int = 0):
        self.state = EmulatorState(config)
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Emulator:
        ready = threading.Event()
        err: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._start_site())
            except BaseException as e:  # pragma: no cover - surfaced to the caller
                err.append(e)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._shutdown())
            loop.close()

        self._thread = threading.Thread(target=run, name="provider-emulator", daemon=True)
        self._thread.start()
        ready.wait(10)
        if err:
            raise err[0]
        return self

    async def _shutdown(self) -> None:
        """Cancel requests still held (hangs), then close the server, without waiting out a hang."""
        me = asyncio.current_task()
        pending = [t for t in asyncio.all_tasks() if t is not me]
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()

    async def _start_site(self) -> None:
        self._runner = web.AppRunner(make_app(self.state), access_log=None, handle_signals=False,
                                     shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, backlog=1024)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def configure(self, **patch: Any) -> None:
        self._call(lambda: self.state.configure(patch))

    def reset(self) -> None:
        self._call(self.state.reset)

    def stats(self) -> dict[str, int]:
        return dict(self._call(lambda: Counter(self.state.counts)))

    def max_in_flight(self) -> int:
        """Most requests the server held at once since the last reset (proves concurrency caps)."""
        return int(self._call(lambda: self.state.max_in_flight))

    def requests(self) -> list[dict[str, Any]]:
        return self._call(lambda: list(self.state.recent))

    def batches(self) -> list[dict[str, Any]]:
        """Every batch created since the last reset: id, route, model, status and custom ids in order."""
        return self._call(lambda: [b.summary(time.monotonic()) for b in self.state.batches.values()])

    def _call(self, fn: Any) -> Any:
        """Run ``fn`` on the server loop so state is never touched from two threads."""
        assert self._loop is not None, "emulator not started"
        fut: asyncio.Future[Any] = asyncio.run_coroutine_threadsafe(_wrap(fn), self._loop)
        return fut.result(10)

    def stop(self) -> None:
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = None

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


async def _wrap(fn: Any) -> Any:
    return fn()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m conductor.workers.emulator", description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--latency", type=float, default=0.0, help="seconds added to every reply")
    ap.add_argument("--jitter", type=float, default=0.0, help="uniform extra latency in [0, jitter]")
    ap.add_argument("--rpm", type=float, default=None, help="enforce this requests/min per model (429 beyond)")
    ap.add_argument("--rpm-burst", type=float, default=2.0, help="seconds of requests the enforced limit may burst")
    ap.add_argument("--config", default=None, help="JSON file with EmulatorConfig fields (faults, scripted, ...)")
    args = ap.parse_args(argv)
    import socket
    import sys

    def usage(message: str) -> None:   # one line, exit 2, never a traceback
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)

    if not 0 <= args.port <= 65535:
        usage(f"--port {args.port}: must be between 0 and 65535")
    for flag, value in (("--latency", args.latency), ("--jitter", args.jitter), ("--rpm-burst", args.rpm_burst)):
        if not math.isfinite(value) or value < 0:
            usage(f"{flag} {value}: must be a finite number >= 0")
    if args.rpm is not None and (not math.isfinite(args.rpm) or args.rpm <= 0):
        usage(f"--rpm {args.rpm}: must be a finite number > 0")
    cfg = EmulatorConfig(latency_s=args.latency, latency_jitter_s=args.jitter, rpm=args.rpm, rpm_burst_s=args.rpm_burst)
    state = EmulatorState(cfg)
    if args.config:
        try:
            with open(args.config, encoding="utf-8") as f:
                settings = json.load(f)
            if not isinstance(settings, dict):
                raise ValueError("expected a JSON object of emulator settings")
            state.configure(settings)
        except OSError as e:
            usage(f"{args.config}: cannot read ({e.strerror or e})")
        except UnicodeDecodeError:
            usage(f"{args.config}: not UTF-8 text")
        except json.JSONDecodeError as e:
            usage(f"{args.config}:{e.lineno}: not valid JSON ({e.msg})")
        except (TypeError, ValueError) as e:
            usage(f"{args.config}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)   # bound here, so a busy port is one line
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", args.port))
    except OSError as e:
        sock.close()
        print(f"error: cannot listen on 127.0.0.1:{args.port}: {e.strerror or e} (pick another --port)", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"provider emulator on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    # SIGTERM/SIGINT stop it at once: held requests (hang faults) are cancelled, not waited out
    web.run_app(make_app(state), sock=sock, access_log=None, print=None, backlog=1024, shutdown_timeout=0.5)


if __name__ == "__main__":
    main()
