"""A local provider emulator: OpenAI, Anthropic and Gemini wire formats on 127.0.0.1.

WHY: tests and benchmarks must drive the *real* SDK clients (openai, anthropic,
google-genai) through real HTTP, including the failures real providers produce
(429 with Retry-After, 5xx, hangs, malformed bodies), without any network.

Routes (what the SDKs call):
  POST /v1/chat/completions                  OpenAI chat completions (base_url .../v1)
  POST /v1/messages                          Anthropic messages (base_url = root)
  POST /v1beta/models/{model}:generateContent  Gemini (http_options base_url = root)
Control:
  GET  /_emulator/stats     request counts per route and outcome
  GET  /_emulator/requests  the last request bodies (to check what an SDK sent)
  GET  /_emulator/arrivals  monotonic arrival time of every request (rate measurements)
  POST /_emulator/config    merge settings (see ``EmulatorConfig``)
  POST /_emulator/reset     zero the counters and fault state

Replies are echo-style by default and deterministic: ``reply from <model> to
<digest of the messages>``, so equal inputs give equal outputs and a test can
check that parallel and sequential execution saw the same messages. Scripted
replies match a substring of the prompt. Faults come from a fault plan in the
config or from magic text in the prompt: ``[[fault:429]]``, ``[[fault:500]]``,
``[[fault:hang]]``, ``[[fault:malformed]]``, ``[[fault:badschema]]``,
``[[fault:empty]]``, ``[[fault:401]]``, ``[[fault:400]]``; ``[[fault:429*2]]``
fails the first two requests with that exact body and then succeeds.

Run: ``python -m conductor.emulator --port 8765 --latency 0.05 --rpm 6000``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import re
import threading
import time
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
    scripted: list[dict[str, str]] = field(default_factory=list)   # [{"match": substr, "reply": text}]
    faults: list[dict[str, Any]] = field(default_factory=list)     # [{"kind","route"?,"match"?,"count"?,"p"?}]
    seed: int = 0
    reply_prefix: str = ""              # prepended to echo replies (e.g. to make them long)


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
            if s.get("match", "") in req.text:
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


def _success_body(req: _Req, text: str) -> dict[str, Any]:
    in_tok = _tokens(req.system + req.text)
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
        return {"id": f"msg_{created}", "type": "message", "role": "assistant", "model": req.model,
                "content": content, "stop_reason": "max_tokens" if truncated else "end_turn",
                "stop_sequence": None, "usage": {"input_tokens": in_tok, "output_tokens": out_tok}}
    if req.route == "gemini":
        thoughts = 8 if req.thinking else 0
        usage = {"promptTokenCount": in_tok, "candidatesTokenCount": out_tok,
                 "totalTokenCount": in_tok + out_tok + thoughts}
        if thoughts:
            usage["thoughtsTokenCount"] = thoughts
        return {"candidates": [{"content": {"parts": [{"text": text}], "role": "model"},
                                "finishReason": "MAX_TOKENS" if truncated else "STOP", "index": 0}],
                "usageMetadata": usage, "modelVersion": req.model}
    return {"id": f"chatcmpl-{created}", "object": "chat.completion", "created": created, "model": req.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "length" if truncated else "stop"}],
            "usage": {"prompt_tokens": in_tok, "completion_tokens": out_tok, "total_tokens": in_tok + out_tok}}


def _bad_schema(route: str) -> dict[str, Any]:
    return {"anthropic": {"type": "message", "content": "nope"},
            "gemini": {"candidates": "nope", "usageMetadata": []},
            "openai": {"object": "chat.completion", "choices": [{"index": 0, "message": None}]}}[route]


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
        return web.json_response(_success_body(req, text))
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

    def start(self) -> "Emulator":
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

    def _call(self, fn: Any) -> Any:
        """Run ``fn`` on the server loop so state is never touched from two threads."""
        assert self._loop is not None, "emulator not started"
        fut: "asyncio.Future[Any]" = asyncio.run_coroutine_threadsafe(_wrap(fn), self._loop)
        return fut.result(10)

    def stop(self) -> None:
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = None

    def __enter__(self) -> "Emulator":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


async def _wrap(fn: Any) -> Any:
    return fn()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m conductor.emulator", description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--latency", type=float, default=0.0, help="seconds added to every reply")
    ap.add_argument("--jitter", type=float, default=0.0, help="uniform extra latency in [0, jitter]")
    ap.add_argument("--rpm", type=float, default=None, help="enforce this requests/min per model (429 beyond)")
    ap.add_argument("--rpm-burst", type=float, default=2.0, help="seconds of requests the enforced limit may burst")
    ap.add_argument("--config", default=None, help="JSON file with EmulatorConfig fields (faults, scripted, ...)")
    args = ap.parse_args(argv)
    cfg = EmulatorConfig(latency_s=args.latency, latency_jitter_s=args.jitter, rpm=args.rpm, rpm_burst_s=args.rpm_burst)
    state = EmulatorState(cfg)
    if args.config:
        with open(args.config, encoding="utf-8") as f:
            state.configure(json.load(f))
    print(f"provider emulator on http://127.0.0.1:{args.port}", flush=True)
    web.run_app(make_app(state), host="127.0.0.1", port=args.port, access_log=None, print=None, backlog=1024)


if __name__ == "__main__":
    main()
