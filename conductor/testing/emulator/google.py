"""The Gemini wire format (google-genai): generateContent, and batch mode with inlined requests and responses.

Routes: ``POST /v1beta/models/{model}:generateContent`` (http_options base_url = root);
``POST /v1beta/models/{model}:batchGenerateContent``, ``GET /v1beta/batches/{id}``, ``POST /v1beta/batches/{id}:cancel``
(also under /v1, the SDK's default API version).
"""

from __future__ import annotations

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

ROUTE = "gemini"
_BATCH_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch"
_GRPC = {"error": (13, "Internal error encountered."), "expired": (4, "The batch expired before this request ran."),
         "cancelled": (1, "The batch was cancelled before this request ran.")}


def parse_request(model: str, body: dict[str, Any], headers: Any) -> Req:
    texts = ["".join(p.get("text", "") for p in c.get("parts") or []) for c in body.get("contents") or []]
    si = body.get("systemInstruction") or body.get("system_instruction") or {}
    system = "".join(p.get("text", "") for p in si.get("parts") or []) if isinstance(si, dict) else ""
    gen = body.get("generationConfig") or {}
    tc = gen.get("thinkingConfig") or gen.get("thinking_config") or {}
    budget = tc.get("thinkingBudget", tc.get("thinking_budget"))   # proto JSON accepts both spellings
    return Req(ROUTE, model, "\n".join(texts), system, gen.get("maxOutputTokens"),
               bool(budget), headers.get("x-goog-api-key"), "")


def _error(status: int, message: str) -> dict[str, Any]:
    st = {429: "RESOURCE_EXHAUSTED", 401: "UNAUTHENTICATED", 400: "INVALID_ARGUMENT",
          503: "UNAVAILABLE"}.get(status, "INTERNAL")
    return {"error": {"code": status, "message": message, "status": st}}


def _success(req: Req, text: str, u: Usage) -> dict[str, Any]:
    thoughts = 8 if req.thinking else 0
    usage = {"promptTokenCount": u.input_tokens, "candidatesTokenCount": u.output_tokens,
             "totalTokenCount": u.input_tokens + u.output_tokens + thoughts}
    if thoughts:
        usage["thoughtsTokenCount"] = thoughts
    if u.cached_tokens:
        usage["cachedContentTokenCount"] = u.cached_tokens
    return {"candidates": [{"content": {"parts": [{"text": text}], "role": "model"},
                            "finishReason": "MAX_TOKENS" if u.truncated else "STOP", "index": 0}],
            "usageMetadata": usage, "modelVersion": req.model}


def _stream(req: Req, pieces: list[str], u: Usage) -> StreamEvents:
    """streamGenerateContent?alt=sse: one GenerateContentResponse per piece, the finish reason and the full
    usage on the last (an empty piece when the reply is empty)."""
    whole = _success(req, "", u)
    chunks = pieces or [""]
    events = []
    for i, p in enumerate(chunks):
        cand: dict[str, Any] = {"content": {"parts": [{"text": p}], "role": "model"}, "index": 0}
        last = i == len(chunks) - 1
        if last:
            cand["finishReason"] = whole["candidates"][0]["finishReason"]
        usage = whole["usageMetadata"] if last else {"promptTokenCount": u.input_tokens}
        events.append(sse({"candidates": [cand], "usageMetadata": usage, "modelVersion": req.model}))
    return StreamEvents([], events, [])


WIRES[ROUTE] = Wire(_error, _success, {"candidates": "nope", "usageMetadata": []}, key_header="x-goog-api-key",
                    stream=_stream)


# ------------------------------------------------------------------ batch mode

def _responses(b: Batch) -> list[dict[str, Any]]:
    out = []
    for it in b.items:
        o = b.outcome(it)
        entry: dict[str, Any] = {"response": it.reply} if o == "ok" else {
            "error": {"code": _GRPC[o][0], "message": _GRPC[o][1]}}
        if it.metadata is not None:
            entry["metadata"] = it.metadata
        out.append(entry)
    return out


def batch_view(b: Batch) -> dict[str, Any]:
    now = time.monotonic()
    ended = b.ended(now)
    state_name = {"completed": "BATCH_STATE_SUCCEEDED", "expired": "BATCH_STATE_EXPIRED",
                  "cancelled": "BATCH_STATE_CANCELLED"}[b.reason()] if ended else "BATCH_STATE_RUNNING"
    c = b.counts() if ended else Counter()
    meta: dict[str, Any] = {
        "@type": _BATCH_TYPE, "name": f"batches/{b.id}", "model": f"models/{b.model}",
        "displayName": b.extra.get("display_name", ""), "createTime": iso(b.created_wall),
        "updateTime": iso(b.wall(min(now, b.end()))), "state": state_name,
        "batchStats": {"requestCount": str(len(b.items)), "successfulRequestCount": str(c["ok"]),
                       "failedRequestCount": str(len(b.items) - c["ok"]) if ended else "0",
                       "pendingRequestCount": "0" if ended else str(len(b.items))}}
    if ended:
        meta["endTime"] = iso(b.wall(b.end()))
        meta["output"] = {"inlinedResponses": {"inlinedResponses": _responses(b)}}
    return {"name": f"batches/{b.id}", "metadata": meta, "done": ended}


def batch_create(state: EmulatorState, model: str, body: dict[str, Any], headers: Any) -> tuple[int, dict[str, Any]]:
    batch = body.get("batch") or {}
    reqs = (((batch.get("inputConfig") or {}).get("requests") or {}).get("requests"))
    if not isinstance(reqs, list) or not reqs:
        return 400, _error(400, "batch.inputConfig.requests.requests: a non-empty list is required")
    items = []
    for i, r in enumerate(reqs):
        inner = r.get("request") or {}
        cid = str((r.get("metadata") or {}).get("custom_id", i))
        items.append(batch_item(state, cid, parse_request(model, inner, headers), inner, r.get("metadata")))
    b = Batch(new_id(state, "gb"), ROUTE, model, items, state.config, display_name=batch.get("displayName", ""))
    state.batches[b.id] = b
    return 200, batch_view(b)


class GeminiBatchRoutes(BatchRoutes):
    """Create goes through the models/{model}:batchGenerateContent route (``create``, called by the server's
    model route); ``GET /v1/batches/{id}`` is shared with OpenAI: the server dispatches it to ``get_id``."""

    route = ROUTE

    def register(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/v1beta/batches/{tail}", self.get)
        for version in ("v1beta", "v1"):                     # the SDK's default API version is v1
            r.add_post(f"/{version}/batches/{{tail}}", self.cancel_batch)

    async def create(self, request: web.Request, model: str) -> web.StreamResponse:
        async def go() -> web.StreamResponse:
            try:
                body = await request.json()
            except ValueError:
                return web.json_response(error_body(ROUTE, 400, "request body is not JSON"), status=400)
            status, out = batch_create(self.state, model, body, request.headers)
            return web.json_response(out, status=status)
        return await self.guarded(request, "create", go)

    async def get(self, request: web.Request) -> web.StreamResponse:
        return await self.get_id(request, request.match_info["tail"])

    async def get_id(self, request: web.Request, bid: str) -> web.StreamResponse:
        async def go() -> web.StreamResponse:
            b = self.batch(bid)
            return b if isinstance(b, web.Response) else web.json_response(batch_view(b))
        return await self.guarded(request, "retrieve", go)

    async def cancel_batch(self, request: web.Request) -> web.StreamResponse:
        bid, _, method = request.match_info["tail"].partition(":")
        if method != "cancel":
            return web.json_response(error_body(ROUTE, 404, f"unsupported method {method!r}"), status=404)

        async def go() -> web.StreamResponse:
            b = self.batch(bid)
            if isinstance(b, web.Response):
                return b
            self.cancel(b)
            return web.json_response({})
        return await self.guarded(request, "cancel", go)
