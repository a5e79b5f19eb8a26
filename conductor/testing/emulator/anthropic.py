"""The Anthropic wire format: messages, and Message Batches with JSONL results.

Routes: ``POST /v1/messages`` (base_url = root); ``POST /v1/messages/batches``,
``GET /v1/messages/batches/{id}[/results]``, ``POST /v1/messages/batches/{id}/cancel``.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter
from typing import Any

from aiohttp import web

from conductor.testing.emulator.core import (
    WIRES,
    Batch,
    BatchRoutes,
    EmulatorState,
    Req,
    StreamEvents,
    Usage,
    Wire,
    batch_item,
    error_body,
    iso,
    new_id,
    sse,
)

ROUTE = "anthropic"
_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _flat(c: Any) -> str:
    if isinstance(c, str):
        return c
    return "".join(b.get("text", "") for b in c or [] if isinstance(b, dict))


def parse_request(body: dict[str, Any], headers: Any) -> Req:
    texts = [_flat(m.get("content")) for m in body.get("messages") or []]
    thinking = (body.get("thinking") or {}).get("type") == "enabled"
    return Req(ROUTE, str(body.get("model", "")), "\n".join(texts), _flat(body.get("system") or ""),
               body.get("max_tokens"), thinking,
               headers.get("x-api-key") or headers.get("Authorization", "").removeprefix("Bearer ") or None, "",
               stream=bool(body.get("stream")))


def _error(status: int, message: str) -> dict[str, Any]:
    etype = {429: "rate_limit_error", 401: "authentication_error", 400: "invalid_request_error",
             529: "overloaded_error"}.get(status, "api_error")
    return {"type": "error", "error": {"type": etype, "message": message}}


def _success(req: Req, text: str, u: Usage) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if req.thinking:
        content.append({"type": "thinking", "thinking": "thinking...", "signature": "emulator"})
    content.append({"type": "text", "text": text})
    usage: dict[str, Any] = {"input_tokens": u.input_tokens - u.cached_tokens, "output_tokens": u.output_tokens}
    if u.cached_tokens:
        usage["cache_read_input_tokens"] = u.cached_tokens
    return {"id": f"msg_{u.created}", "type": "message", "role": "assistant", "model": req.model,
            "content": content, "stop_reason": "max_tokens" if u.truncated else "end_turn",
            "stop_sequence": None, "usage": usage}


def _stream(req: Req, pieces: list[str], u: Usage) -> StreamEvents:
    """Messages streaming: message_start, (a thinking block), the text block's deltas, message_delta with the
    stop reason and output tokens, message_stop."""
    body = _success(req, "", u)
    start = {**body, "content": [], "stop_reason": None, "usage": {**body["usage"], "output_tokens": 1}}
    head = [sse({"type": "message_start", "message": start}, "message_start")]
    block = 0
    if req.thinking:
        head += [sse({"type": "content_block_start", "index": 0,
                      "content_block": {"type": "thinking", "thinking": "", "signature": ""}}, "content_block_start"),
                 sse({"type": "content_block_delta", "index": 0,
                      "delta": {"type": "thinking_delta", "thinking": "thinking..."}}, "content_block_delta"),
                 sse({"type": "content_block_delta", "index": 0,
                      "delta": {"type": "signature_delta", "signature": "emulator"}}, "content_block_delta"),
                 sse({"type": "content_block_stop", "index": 0}, "content_block_stop")]
        block = 1
    head.append(sse({"type": "content_block_start", "index": block, "content_block": {"type": "text", "text": ""}},
                    "content_block_start"))
    text = [sse({"type": "content_block_delta", "index": block, "delta": {"type": "text_delta", "text": p}},
                "content_block_delta") for p in pieces]
    tail = [sse({"type": "content_block_stop", "index": block}, "content_block_stop"),
            sse({"type": "message_delta", "delta": {"stop_reason": body["stop_reason"], "stop_sequence": None},
                 "usage": {"output_tokens": u.output_tokens}}, "message_delta"),
            sse({"type": "message_stop"}, "message_stop")]
    return StreamEvents(head, text, tail)


WIRES[ROUTE] = Wire(_error, _success, {"type": "message", "content": "nope"}, key_header="x-api-key",
                    stream=_stream)


# ------------------------------------------------------------------ message batches

def batch_view(b: Batch, base: str) -> dict[str, Any]:
    now = time.monotonic()
    ended = b.ended(now)
    c = b.counts() if ended else Counter()
    status = "ended" if ended else ("canceling" if b.cancelled_at != math.inf else "in_progress")
    return {"id": b.id, "type": "message_batch", "processing_status": status,
            "request_counts": {"processing": 0 if ended else len(b.items), "succeeded": c["ok"], "errored": c["error"],
                               "canceled": c["cancelled"], "expired": c["expired"]},
            "created_at": iso(b.created_wall), "expires_at": iso(b.created_wall + 86400),
            "ended_at": iso(b.wall(b.end())) if ended else None, "archived_at": None,
            "cancel_initiated_at": iso(b.wall(b.cancelled_at)) if b.cancelled_at != math.inf else None,
            "results_url": f"{base}/v1/messages/batches/{b.id}/results" if ended else None}


def batch_results(b: Batch) -> bytes:
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


def batch_create(state: EmulatorState, body: dict[str, Any], headers: Any) -> tuple[int, dict[str, Any] | Batch]:
    reqs = body.get("requests")
    if not isinstance(reqs, list) or not reqs:
        return 400, _error(400, "requests: a non-empty list is required")
    seen: set[str] = set()
    items = []
    for i, r in enumerate(reqs):
        cid = str(r.get("custom_id", ""))
        if not _CUSTOM_ID.match(cid) or cid in seen:
            return 400, _error(400, f"requests.{i}.custom_id: must be unique and match ^[a-zA-Z0-9_-]{{1,64}}$")
        seen.add(cid)
        params = r.get("params") or {}
        items.append(batch_item(state, cid, parse_request(params, headers), params))
    b = Batch(new_id(state, "msgbatch_"), ROUTE, "", items, state.config)
    state.batches[b.id] = b
    return 200, b


class AnthropicBatchRoutes(BatchRoutes):
    route = ROUTE

    def register(self, app: web.Application) -> None:
        r = app.router
        r.add_post("/v1/messages/batches", self.create)
        r.add_get("/v1/messages/batches/{bid}", self.get)
        r.add_get("/v1/messages/batches/{bid}/results", self.results)
        r.add_post("/v1/messages/batches/{bid}/cancel", self.cancel_batch)

    @staticmethod
    def base_of(request: web.Request) -> str:
        return f"{request.scheme}://{request.host}"

    async def create(self, request: web.Request) -> web.StreamResponse:
        async def go() -> web.StreamResponse:
            status, out = batch_create(self.state, await request.json(), request.headers)
            if isinstance(out, Batch):
                return web.json_response(batch_view(out, self.base_of(request)))
            return web.json_response(out, status=status)
        return await self.guarded(request, "create", go)

    async def get(self, request: web.Request) -> web.StreamResponse:
        async def go() -> web.StreamResponse:
            b = self.batch(request.match_info["bid"])
            if isinstance(b, web.Response):
                return b
            return web.json_response(batch_view(b, self.base_of(request)))
        return await self.guarded(request, "retrieve", go)

    async def results(self, request: web.Request) -> web.StreamResponse:
        async def go() -> web.StreamResponse:
            b = self.batch(request.match_info["bid"])
            if isinstance(b, web.Response):
                return b
            if not b.ended(time.monotonic()):
                return web.json_response(error_body(ROUTE, 400, "batch has not ended"), status=400)
            return web.Response(body=batch_results(b), content_type="application/binary")
        return await self.guarded(request, "results", go)

    async def cancel_batch(self, request: web.Request) -> web.StreamResponse:
        async def go() -> web.StreamResponse:
            b = self.batch(request.match_info["bid"])
            if isinstance(b, web.Response):
                return b
            self.cancel(b)
            view = batch_view(b, self.base_of(request))
            if view["processing_status"] == "ended" and b.reason() == "cancelled":
                view.update(processing_status="canceling", results_url=None)
            return web.json_response(view)
        return await self.guarded(request, "cancel", go)
