"""The OpenAI wire format: chat completions, and the Batch API over uploaded JSONL files.

Routes: ``POST /v1/chat/completions`` (also ``/chat/completions``); ``POST /v1/files``,
``GET /v1/files/{id}[/content]``, ``POST /v1/batches``, ``GET /v1/batches[/{id}]``, ``POST /v1/batches/{id}/cancel``.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from typing import Any

from aiohttp import web

from conductor.testing.emulator.core import (
    WIRES,
    Batch,
    BatchRoutes,
    EmulatorState,
    Item,
    Req,
    StreamEvents,
    Usage,
    Wire,
    batch_item,
    error_body,
    new_id,
    sse,
)

ROUTE = "openai"


def parse_request(body: dict[str, Any], headers: Any) -> Req:
    msgs = body.get("messages") or []
    texts = [m.get("content") if isinstance(m.get("content"), str) else json.dumps(m.get("content"))
             for m in msgs if m.get("role") != "system"]
    system = "\n".join(str(m.get("content")) for m in msgs if m.get("role") == "system")
    auth = headers.get("Authorization", "")
    extra = body.get("chat_template_kwargs") or {}
    options = body.get("stream_options") or {}
    return Req(ROUTE, str(body.get("model", "")), "\n".join(texts), system,
               body.get("max_completion_tokens") or body.get("max_tokens"),
               bool(extra.get("enable_thinking")) or bool(body.get("reasoning_effort")),
               auth.removeprefix("Bearer ") or None, "", stream=bool(body.get("stream")),
               include_usage=isinstance(options, dict) and bool(options.get("include_usage")))


def _error(status: int, message: str) -> dict[str, Any]:
    etype = {429: "rate_limit_error", 401: "invalid_request_error", 400: "invalid_request_error"}.get(status, "server_error")
    return {"error": {"message": message, "type": etype, "code": None, "param": None}}


def _success(req: Req, text: str, u: Usage) -> dict[str, Any]:
    usage = _usage(u)
    return {"id": f"chatcmpl-{u.created}", "object": "chat.completion", "created": u.created, "model": req.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "length" if u.truncated else "stop"}],
            "usage": usage}


def _usage(u: Usage) -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": u.input_tokens, "completion_tokens": u.output_tokens,
                             "total_tokens": u.input_tokens + u.output_tokens}
    if u.cached_tokens:
        usage["prompt_tokens_details"] = {"cached_tokens": u.cached_tokens}
    return usage


def _stream(req: Req, pieces: list[str], u: Usage) -> StreamEvents:
    """Chat completion chunks: the role, one per piece, the finish; the usage chunk (empty choices) when
    ``stream_options.include_usage``; then ``[DONE]``."""
    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return sse({"id": f"chatcmpl-{u.created}", "object": "chat.completion.chunk", "created": u.created,
                    "model": req.model, "choices": choices, **extra})

    def delta(d: dict[str, Any], finish: str | None = None) -> list[dict[str, Any]]:
        return [{"index": 0, "delta": d, "finish_reason": finish}]

    tail = [chunk(delta({}, "length" if u.truncated else "stop"))]
    if req.include_usage:
        tail.append(chunk([], usage=_usage(u)))
    return StreamEvents([chunk(delta({"role": "assistant", "content": ""}))],
                        [chunk(delta({"content": p})) for p in pieces], [*tail, b"data: [DONE]\n\n"])


WIRES[ROUTE] = Wire(_error, _success, {"object": "chat.completion", "choices": [{"index": 0, "message": None}]},
                    stream=_stream)


# ------------------------------------------------------------------ files + batches

def batch_view(state: EmulatorState, b: Batch) -> dict[str, Any]:
    now = time.monotonic()
    ended = b.ended(now)
    status = "in_progress"
    out_id = err_id = None
    if b.extra.get("errors"):
        status = "failed"
    elif ended:
        status = b.reason()
        out_id, err_id = _output_files(state, b)
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


def _output_line(b: Batch, i: int, it: Item) -> tuple[bool, dict[str, Any]]:
    """(succeeded, the line of the output or error file) for one request of an ended batch."""
    line: dict[str, Any] = {"id": f"batch_req_{b.id}_{i}", "custom_id": it.custom_id, "response": None, "error": None}
    o = b.outcome(it)
    if o == "ok":
        line["response"] = {"status_code": 200, "request_id": f"req_{i}", "body": it.reply}
        return True, line
    if o == "error":
        line["response"] = {"status_code": 500, "request_id": f"req_{i}",
                            "body": _error(500, "The server had an error processing your request")}
    else:
        code = "batch_expired" if o == "expired" else "batch_cancelled"
        line["error"] = {"code": code, "message": f"This request was not executed: the batch was {o}."}
    return False, line


def _output_files(state: EmulatorState, b: Batch) -> tuple[str | None, str | None]:
    """Write the output and error JSONL files once the batch has ended (ids are stable)."""
    if b.output_files is None:
        out: list[dict[str, Any]] = []
        err: list[dict[str, Any]] = []
        for i, it in enumerate(b.items):
            ok, line = _output_line(b, i, it)
            (out if ok else err).append(line)
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


def batch_create(state: EmulatorState, body: dict[str, Any], headers: Any) -> tuple[int, dict[str, Any]]:
    fid = body.get("input_file_id")
    if fid not in state.files:
        return 404, _error(404, f"No such File object: {fid}")
    endpoint = body.get("endpoint", "")
    items: list[Item] = []
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
        items.append(batch_item(state, cid, parse_request(inner, headers), inner))
    if len(models) > 1:
        errors.append({"code": "model_mismatch", "message": "every request in a batch must use the same model",
                       "line": None})
    b = Batch(new_id(state, "batch_"), ROUTE, models.pop() if len(models) == 1 else "", items, state.config,
              endpoint=endpoint, input_file_id=fid, metadata=body.get("metadata"), errors=errors)
    state.batches[b.id] = b
    return 200, batch_view(state, b)


def _file_view(fid: str, f: tuple[str, str, bytes]) -> dict[str, Any]:
    return {"id": fid, "object": "file", "bytes": len(f[2]), "created_at": int(time.time()), "filename": f[0],
            "purpose": f[1], "status": "processed"}


class OpenAIBatchRoutes(BatchRoutes):
    """Files and batches. ``GET /v1/batches/{id}`` is shared with Gemini's v1 API: the server dispatches it."""

    route = ROUTE

    def register(self, app: web.Application) -> None:
        r = app.router
        r.add_post("/v1/files", self.file_upload)
        r.add_get("/v1/files/{fid}", self.file_get)
        r.add_get("/v1/files/{fid}/content", self.file_content)
        r.add_post("/v1/batches", self.create)
        r.add_get("/v1/batches", self.list)
        r.add_post("/v1/batches/{bid}/cancel", self.cancel_batch)

    def _no_file(self, fid: str) -> web.Response:
        return web.json_response(error_body(ROUTE, 404, f"No such File object: {fid}"), status=404)

    async def file_upload(self, request: web.Request) -> web.StreamResponse:
        async def go() -> web.StreamResponse:
            form = await request.post()
            f = form.get("file")
            if not isinstance(f, web.FileField):
                return web.json_response(error_body(ROUTE, 400, "file: required"), status=400)
            fid = new_id(self.state, "file-")
            self.state.files[fid] = (f.filename or "upload.jsonl", str(form.get("purpose", "")), f.file.read())
            return web.json_response(_file_view(fid, self.state.files[fid]))
        return await self.guarded(request, "file_upload", go)

    async def file_get(self, request: web.Request) -> web.StreamResponse:
        fid = request.match_info["fid"]
        if fid not in self.state.files:
            return self._no_file(fid)
        return web.json_response(_file_view(fid, self.state.files[fid]))

    async def file_content(self, request: web.Request) -> web.StreamResponse:
        async def go() -> web.StreamResponse:
            fid = request.match_info["fid"]
            if fid not in self.state.files:
                return self._no_file(fid)
            return web.Response(body=self.state.files[fid][2], content_type="application/octet-stream")
        return await self.guarded(request, "file_content", go)

    async def create(self, request: web.Request) -> web.StreamResponse:
        async def go() -> web.StreamResponse:
            status, body = batch_create(self.state, await request.json(), request.headers)
            return web.json_response(body, status=status)
        return await self.guarded(request, "create", go)

    async def get(self, request: web.Request) -> web.StreamResponse:
        async def go() -> web.StreamResponse:
            b = self.batch(request.match_info["bid"])
            return b if isinstance(b, web.Response) else web.json_response(batch_view(self.state, b))
        return await self.guarded(request, "retrieve", go)

    async def list(self, request: web.Request) -> web.StreamResponse:
        data = [batch_view(self.state, b) for b in reversed(list(self.state.batches.values())) if b.route == ROUTE]
        return web.json_response({"object": "list", "data": data, "has_more": False,
                                  "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None})

    async def cancel_batch(self, request: web.Request) -> web.StreamResponse:
        async def go() -> web.StreamResponse:
            b = self.batch(request.match_info["bid"])
            if isinstance(b, web.Response):
                return b
            self.cancel(b)
            view = batch_view(self.state, b)
            if view["status"] == "cancelled":
                view["status"] = "cancelling"          # what the real API answers to the cancel call itself
            return web.json_response(view)
        return await self.guarded(request, "cancel", go)
