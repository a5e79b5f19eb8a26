"""The OpenAI providers' non-streaming call goes out on aiohttp itself (``DirectPost``), not through the SDK's
``client.post``; the SDK stays the oracle. Fault by fault against the loopback emulator, the real ``openai``
SDK's post (classified by ``classify``, as the provider did before) and the direct post give the same reply or
the same ProviderError: kind, text, status and Retry-After. The requests they send carry the same body and the
same headers, the SDK's telemetry headers aside. Streams the same way: the same deltas, in the same pieces, and the same
Completion or error, the emulator's faults and a scripted server's odd streams (an error event mid-stream, a body
cut short, CRLF lines with comments)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx
import pytest
from aiohttp import web

from conductor.workers.pool import Worker
from conductor.workers.providers.base import Completion, Message, ProviderError, make_provider
from conductor.workers.providers.openai import OpenAIChat
from conductor.workers.providers.shared import classify, estimate_tokens
from tests.fixtures_emulator import FAKE_KEYS, emu, emulator, worker  # noqa: F401 - pytest fixtures

FAULTS = [None, "429", "500", "502", "503", "529", "400", "401", "404", "malformed", "badschema", "empty"]


async def _sdk(p: OpenAIChat, messages: list[Message]) -> Completion:
    """What ``OpenAIChat.complete`` did before the direct post: the SDK's ``client.post``, then ``classify``."""
    msgs = p._messages(messages)
    who = f"worker {p.worker.name}"
    try:
        raw = await p.client.post("/chat/completions", cast_to=httpx.Response,
                                  body={**p.body, "messages": [{"role": m.role, "content": m.content} for m in msgs]})
    except Exception as e:  # noqa: BLE001 - classified as the provider classifies
        raise classify(e, who) from None
    return p._reply(raw.content, msgs, who)


class Sink:
    def __init__(self) -> None:
        self.deltas: list[str] = []

    def delta(self, text: str) -> None:
        self.deltas.append(text)


async def _sdk_stream(p: OpenAIChat, messages: list[Message], sink: Sink) -> Completion:
    """What ``OpenAIChat.complete_stream`` did before the direct post: the SDK's typed stream, then ``classify``."""
    msgs = p._messages(messages)
    who = f"worker {p.worker.name}"
    parts: list[str] = []
    finish, usage = None, None
    try:
        stream = await p.client.chat.completions.create(  # type: ignore[call-overload]
            messages=[{"role": m.role, "content": m.content} for m in msgs], stream=True,
            stream_options={"include_usage": True}, **p.params)
        async with stream:
            async for chunk in stream:
                usage = chunk.usage or usage
                for choice in chunk.choices or ():
                    delta = choice.delta.content if choice.index == 0 and choice.delta else None
                    if delta:
                        parts.append(delta)
                        sink.delta(delta)
                    finish = choice.finish_reason or finish
    except Exception as e:  # noqa: BLE001 - classified as the provider classifies
        raise classify(e, who) from None
    text = "".join(parts)
    if usage is None:
        return Completion(text, estimate_tokens("".join(m.content for m in msgs)), estimate_tokens(text), finish)
    return Completion(text, usage.prompt_tokens, usage.completion_tokens, finish)


def _outcome(coro: Any) -> Completion | tuple[str, str, float | None, int | None]:
    async def go() -> Any:
        try:
            return await coro
        except ProviderError as e:
            return e.kind, str(e), e.retry_after, e.status
    return asyncio.run(go())


async def _pair(p: OpenAIChat, text: str, stream: bool) -> tuple[Any, Any]:
    """The direct call's outcome, then the SDK's: a Completion or (kind, text, retry_after, status); with ``stream``,
    each paired with the deltas its sink saw."""
    out = []
    for direct in (True, False):
        sink, msgs = Sink(), [Message("user", text)]
        call = ((p.complete_stream(msgs, sink) if direct else _sdk_stream(p, msgs, sink)) if stream
                else (p.complete(msgs) if direct else _sdk(p, msgs)))
        try:
            got: Any = await call
        except ProviderError as e:
            got = (e.kind, str(e), e.retry_after, e.status)
        out.append((got, sink.deltas) if stream else got)
    return out[0], out[1]


def _both(w: Any, text: str, stream: bool = False) -> tuple[Any, Any]:
    async def go() -> tuple[Any, Any]:
        p = make_provider(w)
        assert isinstance(p, OpenAIChat)
        try:
            return await _pair(p, text, stream)
        finally:
            await p.aclose()
    return asyncio.run(go())


@pytest.mark.parametrize("provider", ["openai", "openai_compatible"])
@pytest.mark.parametrize("fault", FAULTS)
def test_direct_post_answers_as_the_sdk_does(emu, provider: str, fault: str | None) -> None:
    w = worker(emu, "gpt", provider)
    text = "What is 6 * 7?" + (f" [[fault:{fault}]]" if fault else "")
    direct, sdk = _both(w, text)
    assert direct == sdk
    if fault in (None, "empty"):
        assert isinstance(direct, Completion) and (direct.text == "") == (fault == "empty")
    else:
        assert isinstance(direct, tuple)
        kind = {"429": "rate_limited", "400": "permanent", "404": "permanent", "401": "auth",
                "malformed": "malformed", "badschema": "malformed"}.get(fault, "server")
        assert direct[0] == kind
        assert FAKE_KEYS["EMU_OPENAI_KEY"] not in direct[1]      # the 401 names the key it was sent; redacted
    if fault == "429":
        assert direct[2] == pytest.approx(0.05)                  # the emulator's Retry-After, honoured


def test_direct_post_sends_the_sdks_body_and_headers(emu, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_ORG_ID", "org-emu")              # the SDK reads it; the direct post must send it
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-emu")
    w = worker(emu, "qwen", "openai", sampling={"top_k": 20, "reasoning_effort": "low", "stop": ["\n\n"]})
    direct, sdk = _both(w, "Name a prime. é")
    assert direct == sdk
    a, b = emu.requests()[-2:]
    assert a["body"] == b["body"] and a["body"]["top_k"] == 20 and a["body"]["messages"][-1]["content"].endswith("é")

    def kept(h: dict[str, str]) -> dict[str, str]:
        return {k.lower(): v for k, v in h.items()
                if not k.lower().startswith("x-stainless") and k.lower() not in ("user-agent", "content-length", "connection")}
    assert kept(a["headers"]) == kept(b["headers"])
    assert a["headers"]["Authorization"] == f"Bearer {FAKE_KEYS['EMU_OPENAI_KEY']}"
    assert a["headers"]["OpenAI-Organization"] == "org-emu" and a["headers"]["OpenAI-Project"] == "proj-emu"
    assert a["headers"]["User-Agent"].startswith("conductor/")
    assert not [k for k in a["headers"] if k.lower().startswith("x-stainless")]


def test_a_refused_connection_and_a_hang_are_classified_as_the_sdk_does(emu) -> None:
    with socket.socket() as s:         # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gone = worker(emu, "gone", "openai_compatible", base_url=f"http://127.0.0.1:{port}/v1")
    direct, sdk = _both(gone, "hello")
    assert direct[0] == sdk[0] == "server" and "connection failed (ClientConnectorError)" in direct[1]
    emu.configure(hang_s=5.0)
    slow = worker(emu, "slow", "openai_compatible", limits={"timeout_s": 0.3})
    direct, sdk = _both(slow, "hello [[fault:hang]]")
    assert direct[0] == sdk[0] == "timeout"


def test_the_direct_session_is_closed_with_its_loop(emu) -> None:
    p = make_provider(worker(emu, "gpt", "openai"))
    assert isinstance(p, OpenAIChat)
    reply = _outcome(p.complete([Message("user", "hello")]))    # no aclose: the loop's end closes both clients
    assert isinstance(reply, Completion)
    assert p.closing.closed and p.direct.session.closed and p.client.is_closed()


@pytest.mark.parametrize("fault", FAULTS)
def test_a_direct_stream_answers_as_the_sdks_stream_does(emu, fault: str | None) -> None:
    emu.configure(scripted=[{"match": "prime", "reply": "Two is the only even prime, and then three, five, seven."}])
    w = worker(emu, "gpt", "openai_compatible")
    (direct, deltas), (sdk, sdk_deltas) = _both(w, "Name a prime." + (f" [[fault:{fault}]]" if fault else ""), stream=True)
    assert direct == sdk and deltas == sdk_deltas
    if fault is None:
        assert isinstance(direct, Completion) and len(deltas) > 5 and "".join(deltas) == direct.text
        assert direct.text.startswith("Two is") and direct.finish_reason == "stop"
    a, b = emu.requests()[-2:]
    assert a["body"] == b["body"] and a["body"]["stream"] is True


def _scripted_server(body: bytes, *, cut: bool = False) -> Any:
    """A server that answers every chat completion with ``body`` as an event stream (``cut``: the connection is
    closed before the body ends)."""
    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        if cut:
            resp.headers["Content-Length"] = str(len(body) + 100)   # promises more than it sends
        await resp.prepare(request)
        for i in range(0, len(body), 7):                              # in small pieces, lines cut anywhere
            await resp.write(body[i:i + 7])
        if cut:
            assert request.transport is not None
            request.transport.close()
            return resp
        await resp.write_eof()
        return resp
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


def _chunk(text: str | None = None, finish: str | None = None, usage: dict[str, int] | None = None) -> bytes:
    import json
    choices = [] if text is None and finish is None else [
        {"index": 0, "delta": {"content": text} if text is not None else {}, "finish_reason": finish}]
    return json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": choices,
                       "usage": usage}).encode()


STREAMS = {
    "crlf_comments_keepalive": (b": keep-alive\r\n\r\ndata: " + _chunk("Hel") + b"\r\n\r\n: ping\r\n\r\ndata: "
                                + _chunk("lo") + b"\r\n\r\ndata: " + _chunk(None, "stop") + b"\r\n\r\ndata: "
                                + _chunk(None, None, {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11})
                                + b"\r\n\r\ndata: [DONE]\r\n\r\n", False),
    "error_event_mid_stream": (b"data: " + _chunk("Par") + b"\n\ndata: "
                               + b'{"error": {"message": "The server had an error while processing your request.", '
                               + b'"type": "server_error"}}\n\n', False),
    "cut_short": (b"data: " + _chunk("Part") + b"\n\ndata: " + _chunk("ial"), True),
    "named_event_read": (b"event: ping\ndata: " + _chunk("Named") + b"\n\ndata: " + _chunk("Kept", "stop")
                            + b"\n\n", False),
    "no_done_no_usage": (b"data: " + _chunk("Whole") + b"\n\ndata: " + _chunk(None, "length") + b"\n\n", False),
}


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_odd_streams_end_as_the_sdks_do(name: str) -> None:
    body, cut = STREAMS[name]

    async def go() -> tuple[Any, Any]:
        runner = web.AppRunner(_scripted_server(body, cut=cut))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        w = Worker.model_validate({"name": "odd", "provider": "openai_compatible", "model": "m",
                                   "base_url": f"http://127.0.0.1:{port}/v1", "limits": {"timeout_s": 5}})
        p = make_provider(w)
        assert isinstance(p, OpenAIChat)
        try:
            return await _pair(p, "hello", stream=True)
        finally:
            await p.aclose()
            await runner.cleanup()

    (direct, deltas), (sdk, sdk_deltas) = asyncio.run(go())
    assert deltas == sdk_deltas
    if name == "cut_short":       # both a lost connection, in their own words
        assert direct[0] == sdk[0] == "server" and deltas == ["Part"]
    else:
        assert direct == sdk
    if name == "crlf_comments_keepalive":
        assert direct == Completion("Hello", 9, 2, "stop")
    if name == "named_event_read":
        assert deltas == ["Named", "Kept"]
    if name == "error_event_mid_stream":
        assert direct[0] == "permanent" and "APIError: The server had an error" in direct[1] and deltas == ["Par"]
