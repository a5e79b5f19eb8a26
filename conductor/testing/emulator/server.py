"""The emulator's HTTP server: the chat routes of the three providers, their batch routes, the control routes,
and ``Emulator``, the server on a background thread for tests (``main``: the command line)."""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import json
import math
import threading
import time
from collections import Counter
from dataclasses import asdict
from typing import Any

from aiohttp import web

from conductor.testing.emulator import anthropic, google, openai
from conductor.testing.emulator.core import (
    WIRES,
    EmulatorConfig,
    EmulatorState,
    Req,
    bad_schema,
    error_body,
    pieces_of,
    reply_usage,
    success_body,
)


def make_app(state: EmulatorState) -> web.Application:
    async def handle(request: web.Request, route: str, model: str | None = None,
                     stream: bool = False) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return web.json_response(error_body(route, 400, "request body is not JSON"), status=400)
        req = (google.parse_request(model or "", body, request.headers) if route == "gemini"
               else anthropic.parse_request(body, request.headers) if route == "anthropic"
               else openai.parse_request(body, request.headers))
        req.body_hash = hashlib.sha256(raw).hexdigest()
        req.stream = req.stream or stream
        now = time.monotonic()
        state.first_arrival = state.first_arrival if state.first_arrival is not None else now
        state.last_arrival = now
        state.arrivals.append(now)
        state.counts[route] += 1
        state.recent.append({"route": route, "model": req.model, "body": body, "headers": dict(request.headers)})
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            return await _respond(state, req, route, request)
        finally:
            state.in_flight -= 1

    async def openai_chat(request: web.Request) -> web.StreamResponse:
        return await handle(request, "openai")

    async def anthropic_messages(request: web.Request) -> web.StreamResponse:
        return await handle(request, "anthropic")

    gemini_batches = google.GeminiBatchRoutes(state)
    openai_batches = openai.OpenAIBatchRoutes(state)

    async def gemini_models(request: web.Request) -> web.StreamResponse:
        model, _, method = request.match_info["tail"].partition(":")
        if method == "batchGenerateContent":
            return await gemini_batches.create(request, model)
        if method not in ("generateContent", "streamGenerateContent"):
            return web.json_response(error_body("gemini", 404, f"unsupported method {method!r}"), status=404)
        return await handle(request, "gemini", model, stream=method == "streamGenerateContent")

    async def stats(_: web.Request) -> web.Response:
        first, last = state.first_arrival, state.last_arrival
        span = last - first if first is not None and last is not None else 0.0
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

    async def batch_get(request: web.Request) -> web.StreamResponse:
        """``GET /v1/batches/{id}``: OpenAI's path, and Gemini's under the SDK's default v1 API."""
        found = state.batches.get(request.match_info["bid"])
        if found is not None and found.route == "gemini":
            return await gemini_batches.get_id(request, found.id)
        return await openai_batches.get(request)

    async def batches(_: web.Request) -> web.Response:
        now = time.monotonic()
        return web.json_response([b.summary(now) for b in state.batches.values()])

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", openai_chat)
    app.router.add_post("/chat/completions", openai_chat)
    app.router.add_post("/v1/messages", anthropic_messages)
    app.router.add_post("/v1beta/models/{tail}", gemini_models)
    app.router.add_post("/v1/models/{tail}", gemini_models)
    app.router.add_get("/_emulator/stats", stats)
    app.router.add_get("/_emulator/requests", recent)
    app.router.add_get("/_emulator/arrivals", arrivals)
    app.router.add_post("/_emulator/config", config)
    app.router.add_post("/_emulator/reset", reset)
    app.router.add_post("/_emulator/release", functools.partial(_release, state))
    app.router.add_get("/_emulator/batches", batches)
    app.router.add_get("/v1/batches/{bid}", batch_get)
    openai_batches.register(app)
    anthropic.AnthropicBatchRoutes(state).register(app)
    gemini_batches.register(app)
    return app


async def _respond(state: EmulatorState, req: Req, route: str, request: web.Request) -> web.StreamResponse:
    cfg = state.config
    if cfg.latency_s or cfg.latency_jitter_s:
        await asyncio.sleep(cfg.latency_s + state.rng.random() * cfg.latency_jitter_s)
    if cfg.api_key is not None and req.key != cfg.api_key:
        state.counts[f"{route}:401"] += 1
        return web.json_response(error_body(route, 401, f"Incorrect API key provided: {req.key}"), status=401)
    fault = state.fault_for(req)
    if fault is None or fault == "empty":
        text = "" if fault == "empty" else state.reply_text(req)
        state.counts[f"{route}:ok"] += 1
        if req.stream:
            return await _stream(state, req, text, request)
        return web.json_response(success_body(req, text, cfg.cached_input_fraction))
    state.counts[f"{route}:{fault.split('@')[0]}"] += 1
    if fault.startswith("429"):
        wait = float(fault.split("@")[1]) if "@" in fault else cfg.retry_after_s
        return web.json_response(error_body(route, 429, "Rate limit reached, retry later"), status=429,
                                 headers={"Retry-After": f"{max(wait, 0.001):.3f}"})
    if fault in ("500", "502", "503", "529"):
        return web.json_response(error_body(route, int(fault), "The server had an error"), status=int(fault))
    if fault in ("400", "401", "404"):
        msg = f"Incorrect API key provided: {req.key}" if fault == "401" else "invalid request"
        return web.json_response(error_body(route, int(fault), msg), status=int(fault))
    if fault == "hang":
        await asyncio.sleep(cfg.hang_s)
        return web.json_response(error_body(route, 504, "gateway timeout"), status=504)
    if fault == "malformed":
        return web.Response(body=b'{"choices": [ {"message": oops', content_type="application/json")
    if fault == "badschema":
        return web.json_response(bad_schema(route))
    return web.json_response(error_body(route, 400, f"unknown fault {fault!r}"), status=400)


async def _release(state: EmulatorState, _: web.Request) -> web.Response:
    """Paused streamed replies go on (``stream_pause_after``)."""
    state.stream_gate.set()
    return web.json_response({"paused": state.streams_paused, "finished": state.streams_finished})


async def _stream(state: EmulatorState, req: Req, text: str, request: web.Request) -> web.StreamResponse:
    """The reply as server-sent events, piece by piece (``stream_delay_s`` before each; paused after
    ``stream_pause_after`` pieces until released), with the same text and usage as the whole reply."""
    cfg = state.config
    wire = WIRES[req.route]
    assert wire.stream is not None
    text, usage = reply_usage(req, text, cfg.cached_input_fraction)
    events = wire.stream(req, pieces_of(text), usage)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    for e in events.head:
        await resp.write(e)
    for i, e in enumerate(events.pieces):
        if cfg.stream_pause_after is not None and i == cfg.stream_pause_after and not state.stream_gate.is_set():
            state.streams_paused += 1
            await asyncio.wait_for(state.stream_gate.wait(), cfg.hang_s)
        if cfg.stream_delay_s:
            await asyncio.sleep(cfg.stream_delay_s)
        await resp.write(e)
    state.streams_finished += 1
    for e in events.tail:
        await resp.write(e)
    await resp.write_eof()
    return resp


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

    def release_streams(self) -> None:
        """Let streamed replies paused at ``stream_pause_after`` go on (and later ones not pause)."""
        self._call(self.state.stream_gate.set)

    def streams(self) -> dict[str, int]:
        """Streamed replies that reached the pause point, and those whose last piece was sent."""
        return dict(self._call(lambda: {"paused": self.state.streams_paused, "finished": self.state.streams_finished}))

    def batches(self) -> list[dict[str, Any]]:
        """Every batch created since the last reset: id, route, model, status and custom ids in order."""
        return self._call(lambda: [b.summary(time.monotonic()) for b in self.state.batches.values()])

    def _call(self, fn: Any) -> Any:
        """Run ``fn`` on the server loop so state is never touched from two threads."""
        assert self._loop is not None, "emulator not started"
        fut = asyncio.run_coroutine_threadsafe(_wrap(fn), self._loop)
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
    ap = argparse.ArgumentParser(prog="python -m conductor.testing.emulator",
                                 description="The provider emulator (OpenAI, Anthropic, Gemini) on 127.0.0.1.")
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
