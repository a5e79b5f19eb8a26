"""The server's own time per request, measured as gateways measure themselves: total minus the time spent
waiting on models (the workers' replies and the conductor's generation: conductor/execution/upstream.py).

``OverheadTiming`` is a pure ASGI middleware (a ``BaseHTTPMiddleware`` would run the app in another task and
lose the request's clock). On every response it adds ``x-conductor-overhead-ms``: the server's own time up to
the response's headers, which for an ordinary request is the whole request (LiteLLM's
``x-litellm-overhead-duration-ms`` is the same figure). A stream's headers leave before its workflow runs, so
there the header covers the time to the first byte; the histogram ``conductor_serve_overhead_seconds`` (on
``GET /metrics``) observes every request, streams included, when its last byte is sent.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from conductor.execution.upstream import UPSTREAM, UpstreamClock

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from conductor.serve.metrics import Metrics

OVERHEAD_HEADER = "x-conductor-overhead-ms"
_HEADER = OVERHEAD_HEADER.encode()
# the label of each path in the histogram (anything else: "other", so a scan of random paths adds no series)
ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/responses": "responses", "/v1/models": "models",
             "/health": "health", "/metrics": "metrics"}


class OverheadTiming:
    """Per request: an ``UpstreamClock`` for the tasks it spawns, the header on its response, the histogram."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        clock = UpstreamClock()
        token = UPSTREAM.set(clock)

        async def timed_send(message: Message) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                own_ms = (time.perf_counter() - t0 - clock.waited()) * 1000
                message["headers"] = [*message.get("headers", ()), (_HEADER, b"%.3f" % own_ms)]
            elif kind == "http.response.body" and not message.get("more_body", False):
                self.metrics.observe_overhead(ENDPOINTS.get(scope["path"], "other"),
                                              time.perf_counter() - t0 - clock.waited())
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            UPSTREAM.reset(token)
