"""The OpenAI providers' non-streaming call goes out on aiohttp itself (``DirectPost``), not through the SDK's
``client.post``; the SDK stays the oracle. Fault by fault against the loopback emulator, the real ``openai``
SDK's post (classified by ``classify``, as the provider did before) and the direct post give the same reply or
the same ProviderError: kind, text, status and Retry-After. The requests they send carry the same body and the
same headers, the SDK's telemetry headers aside. One difference, on purpose: a refused connection is a "server"
failure ("connection failed"), where the SDK's aiohttp transport maps it to a connect timeout; both are retried."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx
import pytest

from conductor.workers.providers.base import Completion, Message, ProviderError, make_provider
from conductor.workers.providers.openai import OpenAIChat
from conductor.workers.providers.shared import classify
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


def _outcome(coro: Any) -> Completion | tuple[str, str, float | None, int | None]:
    async def go() -> Any:
        try:
            return await coro
        except ProviderError as e:
            return e.kind, str(e), e.retry_after, e.status
    return asyncio.run(go())


def _both(w: Any, text: str) -> tuple[Any, Any]:
    async def go() -> tuple[Any, Any]:
        p = make_provider(w)
        assert isinstance(p, OpenAIChat)
        try:
            out = []
            for call in (p.complete, lambda m: _sdk(p, m)):
                try:
                    out.append(await call([Message("user", text)]))
                except ProviderError as e:
                    out.append((e.kind, str(e), e.retry_after, e.status))
            return out[0], out[1]
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


def test_a_refused_connection_is_a_server_failure_and_a_hang_a_timeout(emu) -> None:
    with socket.socket() as s:         # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gone = worker(emu, "gone", "openai_compatible", base_url=f"http://127.0.0.1:{port}/v1")
    direct, sdk = _both(gone, "hello")
    assert direct[0] == "server" and "connection failed (ClientConnectorError)" in direct[1]
    assert sdk[0] == "timeout"      # the SDK's aiohttp transport reports a refused connection as a ConnectTimeout
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
