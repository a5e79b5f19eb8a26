"""The ASGI app (Starlette; run by uvicorn): routes, authentication, per-key limits, errors, streaming.

The only module of ``conductor.serve`` that imports the web framework.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from conductor.serve import render
from conductor.serve.auth import Admission, ClientLimiter, KeyStore, check_keyless
from conductor.serve.body import parse_json, read_capped
from conductor.serve.config import ServeConfig
from conductor.serve.engine import Model, ServeEngine
from conductor.serve.errors import APIError, internal
from conductor.serve.metrics import CONTENT_TYPE, Metrics
from conductor.serve.requests import TRACE_HEADER, ServeRequest, parse_chat, parse_responses
from conductor.serve.stream import AnswerStream
from conductor.serve.timing import OverheadTiming
from conductor.workers.secrets import redact

if TYPE_CHECKING:
    from conductor.run.pipeline import RunSpec

log = logging.getLogger("conductor.serve")
KEEPALIVE_S = 10.0          # an SSE comment while a long workflow runs, so proxies keep the stream open


class _Once:
    """Release a request's model and key admission exactly once, whoever gets there first."""

    def __init__(self, server: Server, model: Model, adm: Admission):
        self.server, self.model, self.adm, self.done = server, model, adm, False

    async def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        self.model.release()
        await self.server.clients.release(self.adm)


class _Stream(StreamingResponse):
    """A stream that releases its request's holds even if the client leaves before the first chunk (an
    async generator never started never runs its ``finally``)."""

    def __init__(self, content: AsyncIterator[bytes], release: _Once, **kw: Any):
        super().__init__(content, **kw)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._release()


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status_code=status, headers=headers, media_type="application/json")


class Server:
    """State shared by the routes: engine, keys, client limits, metrics."""

    def __init__(self, config: ServeConfig, engine: ServeEngine | None = None):
        self.config = config
        self.engine = engine or ServeEngine(config)
        self.keys = KeyStore.load(config.api_keys_env, config.keys_file)
        self.clients = ClientLimiter(config.key_rpm, config.key_concurrency, config.client_limits)
        self.metrics = Metrics()
        self.engine.on_outcome.append(self.metrics.outcome)
        self.started = time.time()

    # ------------------------------------------------------------------ plumbing
    def error(self, e: APIError, endpoint: str, t0: float) -> Response:
        self.metrics.errors.inc((e.type, e.code))
        self._count(endpoint, e.status, t0)
        return _json(e.body(), e.status, e.headers())

    def _count(self, endpoint: str, status: int, t0: float) -> None:
        self.metrics.requests.inc((endpoint, str(status)))
        self.metrics.latency.observe((endpoint,), time.perf_counter() - t0)

    async def body(self, request: Request) -> Any:
        raw = await read_capped(request.stream(), request.headers.get("content-length"), self.config.max_body_bytes)
        return parse_json(raw)

    def authenticate(self, request: Request) -> str:
        """The key's name; without keys, only a loopback Host and (for a POST) a JSON body get through."""
        if self.keys.open:
            check_keyless(request.headers.get("host"), request.headers.get("content-type"),
                          request.method == "POST")
        return self.keys.identify(request.headers.get("authorization"))

    # ------------------------------------------------------------------ routes
    async def chat(self, request: Request) -> Response:
        return await self._answer(request, "chat")

    async def responses(self, request: Request) -> Response:
        return await self._answer(request, "responses")

    async def _answer(self, request: Request, endpoint: str) -> Response:
        t0 = time.perf_counter()
        adm: Admission | None = None
        model: Model | None = None
        try:
            key = self.authenticate(request)
            body = await self.body(request)
            parse = parse_chat if endpoint == "chat" else parse_responses
            req = parse(body, max_n=self.config.max_n, max_chars=self.config.max_input_chars,
                        trace_header=request.headers.get(TRACE_HEADER))
            model = (await self.engine.resolve(req.model)).acquire()   # held until answered (hot reload)
            spec = self.engine.spec_for(req, model)    # bad controls are refused before anything runs
            adm = await self.clients.admit(key)
            if req.stream:
                release = _Once(self, model, adm)
                resp = _Stream(self._stream(req, model, spec, release, t0), release, media_type="text/event-stream",
                               headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
                adm = model = None                     # released by the stream when it ends
                return resp
            self.metrics.in_flight.inc()
            try:
                out = await self.engine.run(req, model, spec)
            finally:
                self.metrics.in_flight.dec()
            make = render.chat_completion if endpoint == "chat" else render.response_object
            payload, headers = make(out, req, req.controls.trace)
            headers["Server-Timing"] = (f"workflow;dur={out.seconds * 1000:.2f}, "
                                        f"total;dur={(time.perf_counter() - t0) * 1000:.2f}")
            self._count(endpoint, 200, t0)
            return _json(payload, 200, headers)
        except APIError as e:
            return self.error(e, endpoint, t0)
        except ClientDisconnect:
            self._count(endpoint, 499, t0)
            return Response(status_code=499)
        except Exception as e:  # noqa: BLE001 - never a stack trace to the client
            log.error("%s request failed: %s", endpoint, redact(f"{type(e).__name__}: {e}"))
            return self.error(internal(), endpoint, t0)
        finally:
            if model is not None:
                model.release()
            if adm is not None:
                await self.clients.release(adm)

    async def _stream(self, req: ServeRequest, model: Model, spec: RunSpec, release: _Once,
                      t0: float) -> AsyncIterator[bytes]:
        rid = self.engine.request_id()     # the id of the stream's chunks, its lake row and its trace
        cid = f"chatcmpl-{rid}"
        created = int(time.time())
        model_name = model.model_id
        status = 200
        self.metrics.in_flight.inc()
        answer = AnswerStream(req.n, self.engine.answer_depth(spec, model), req.stop, req.max_tokens)
        task = asyncio.create_task(self.engine.run(req, model, spec, answer=answer, request_id=rid))
        try:
            first = render.chunk(cid, model_name, created, [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                              "logprobs": None, "finish_reason": None}
                                                             for i in range(req.n)])
            yield b"data: " + orjson.dumps(first) + b"\n\n"
            async for piece in self._live(task, answer, cid, model_name, created):
                yield piece
            try:
                out = task.result()
                tail = render.stream_tail(out, req, req.controls.trace, cid, created, answer)
            except APIError as e:
                status = e.status
                self.metrics.errors.inc((e.type, e.code))
                yield b"data: " + orjson.dumps(e.body()) + b"\n\n"
                yield b"data: [DONE]\n\n"
                return
            except Exception as e:  # noqa: BLE001
                status = 500
                log.error("stream failed: %s", redact(f"{type(e).__name__}: {e}"))
                err = internal()
                self.metrics.errors.inc((err.type, err.code))
                yield b"data: " + orjson.dumps(err.body()) + b"\n\n"
                yield b"data: [DONE]\n\n"
                return
            for c in tail:
                yield b"data: " + orjson.dumps(c) + b"\n\n"
            yield b"data: [DONE]\n\n"
        finally:
            if not task.done():            # the client went away: stop the workflow
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
                status = 499
            self.metrics.in_flight.dec()
            self._count("chat", status, t0)
            await release()

    @staticmethod
    async def _live(task: asyncio.Task[Any], answer: AnswerStream, cid: str, model_name: str,
                    created: int) -> AsyncIterator[bytes]:
        """While the workflow runs: the answer's text as the last step produces it (``AnswerStream``), and an
        SSE comment every ``KEEPALIVE_S`` of silence."""
        while not task.done():
            wake = asyncio.ensure_future(answer.changed.wait())
            done, _ = await asyncio.wait({task, wake}, timeout=KEEPALIVE_S, return_when=asyncio.FIRST_COMPLETED)
            if not wake.done():
                wake.cancel()
            if not done:
                yield b": working\n\n"
                continue
            for i, text in answer.pending():
                c = render.chunk(cid, model_name, created, [{"index": i, "delta": {"content": text},
                                                             "logprobs": None, "finish_reason": None}])
                yield b"data: " + orjson.dumps(c) + b"\n\n"
            pause = answer.pause_s()
            if pause:
                await asyncio.wait({task}, timeout=pause)

    async def models(self, request: Request) -> Response:
        t0 = time.perf_counter()
        try:
            self.authenticate(request)
        except APIError as e:
            return self.error(e, "models", t0)
        pool = self.engine.live.pool.id if self.engine.live is not None else None
        ids = self.engine.model_ids()
        for cid in await asyncio.to_thread(self.engine.registered):
            if f"conductor@{cid}" not in ids:
                ids.append(f"conductor@{cid}")
        data = [{"id": i, "object": "model", "created": int(self.started), "owned_by": "conductor", "pool": pool}
                for i in ids]
        self._count("models", 200, t0)
        return _json({"object": "list", "data": data})

    async def health(self, request: Request) -> Response:
        """200 ``ok``; 503 ``unhealthy`` while served rows cannot be written to the lake (they are kept for a
        retry, and counted as lost past the retry queue); ``registry_error`` while the champion registry
        cannot be read (the last good champion keeps serving)."""
        e = self.engine
        w = e.writer
        failing = w is not None and w.failing
        lake = None if w is None else {"rows_written": w.rows_written, "shards": w.shards_written,
                                       "errors": w.errors, "rows_pending": w.rows_pending,
                                       "rows_lost": w.rows_lost, "last_error": w.last_error}
        return _json({"status": "unhealthy" if failing else "ok",
                      "pool": e.live.pool.id if e.live is not None else None,
                      "champion": e.champion.checkpoint_id if e.champion else None,
                      "default": e.default.checkpoint_id if e.default else None,
                      "champion_reloads": e.reloads, "registry_error": e.registry_error,
                      "uptime_s": round(time.time() - self.started, 1),
                      "batches": {"conductor_batches": e.batcher.batches, "prompts": e.batcher.prompts},
                      "lake": lake}, 503 if failing else 200)

    async def metrics_text(self, request: Request) -> Response:
        self.metrics.champion_reloads.set(self.engine.reloads)
        w = self.engine.writer
        if w is not None:
            self.metrics.lake_rows.set(w.rows_written)
            self.metrics.lake_errors.set(w.errors)
            self.metrics.lake_rows_lost.set(w.rows_lost)
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)


GC_GEN0_THRESHOLD = 20_000   # CPython's default is 700 allocations


def settle_heap() -> None:
    """After start-up: move every object alive now (modules, the pool, the conductor) out of the collector's reach
    and collect the youngest generation less often.

    A request allocates a few thousand short-lived objects; at the default gen-0 threshold of 700 the collector ran
    several times per request and, every tenth and hundredth time, walked the start-up heap again. ``gc.freeze``
    (what CPython's docs suggest for long-lived servers) keeps start-up objects out of every later collection;
    a larger gen-0 threshold lets short-lived objects die by reference count before a collection sees them.
    Measured on the bench's simulated pool under load: about 0.3 ms of server CPU per request (docs/serving.md)."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def create_app(config: ServeConfig, engine: ServeEngine | None = None) -> Front:
    """The app; the engine starts (pool, default conductor, champion) in the app's lifespan."""
    server = Server(config, engine)
    if server.keys.open:
        log.warning("conductor serve: no API keys configured (set $%s or --keys-file): every loopback client is "
                    "accepted (Host 127.0.0.1, localhost or [::1]; JSON bodies only)", config.api_keys_env)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if server.engine.live is None:
            await asyncio.to_thread(server.engine.start)
        await server.engine.astart()
        settle_heap()
        try:
            yield
        finally:
            await server.engine.aclose()
            await asyncio.to_thread(server.engine.close)
            server.clients.close()

    async def http_error(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        code = {404: "not_found", 405: "method_not_allowed"}.get(status, "http_error")
        err = APIError(status, "invalid_request_error", code,
                       f"{request.method} {request.url.path}: {getattr(exc, 'detail', 'error')}")
        return _json(err.body(), status)

    async def crash(request: Request, exc: Exception) -> Response:
        log.error("unhandled: %s", redact(f"{type(exc).__name__}: {exc}"))
        return _json(internal().body(), 500)

    routes = [Route("/v1/chat/completions", server.chat, methods=["POST"]),
              Route("/v1/responses", server.responses, methods=["POST"]),
              Route("/v1/models", server.models, methods=["GET"]),
              Route("/health", server.health, methods=["GET"]),
              Route("/metrics", server.metrics_text, methods=["GET"])]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: http_error, Exception: crash})
    app.state.server = server
    return Front(app, server)


class Front:
    """The ASGI app uvicorn runs. ``POST`` to the two answer routes goes straight to ``Server.chat`` /
    ``Server.responses``; everything else (the other routes, 404s, 405s, lifespan) goes through Starlette.

    WHY: the answer handlers already catch every error and answer it in OpenAI's shape, so Starlette's layers
    (error middleware, exception middleware, router, the request-response wrapper; three ``send`` wrappers)
    did nothing for them but cost about 5% of a request's CPU in process (docs/serving.md, "Seventh look"). The routes
    stay declared in Starlette too, so its router still answers them for any other method (405). Every
    response, either way, carries the server's own time (``OverheadTiming``, x-conductor-overhead-ms)."""

    def __init__(self, app: Starlette, server: Server):
        self.app = app
        self.state = app.state
        self._answer = {"/v1/chat/completions": server.chat, "/v1/responses": server.responses}
        self._timed = OverheadTiming(self._route, metrics=server.metrics)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._timed(scope, receive, send)

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self._answer.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if handler is None:
            await self.app(scope, receive, send)
            return
        response = await handler(Request(scope, receive))
        await response(scope, receive, send)
