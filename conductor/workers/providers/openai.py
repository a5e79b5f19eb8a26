"""OpenAI chat completions, and any server that speaks them (vLLM, llama.cpp, others).

Registers three manifest providers:
- ``openai``: the official API (key from ``api_key_env``, default OPENAI_API_KEY);
  ``reasoning_effort`` is sent where set, and then temperature/top_p are left out
  because reasoning models reject them.
- ``openai_compatible``: any server at ``base_url``; key optional.
- ``local``: a llama.cpp (or similar) server on this machine at ``base_url``.
Parameters the official API lacks go through ``extra_body``: ``top_k`` and the
Qwen3 ``chat_template_kwargs.enable_thinking`` switch. SDK retries are off: the
executor owns retries so it can count them and honour rate limits globally.
Replies, whole and streamed, are posted on aiohttp directly with the SDK's URL,
headers and error texts (``DirectPost``, for its cost per call and per streamed
chunk); the SDK client says what to send and is the tests' oracle.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson

from conductor import __version__
from conductor.workers.pool import Worker
from conductor.workers.providers.base import Completion, Message, ProviderError, TextSink, register_provider
from conductor.workers.providers.shared import LoopBoundClose, estimate_tokens, status_error, with_prefill
from conductor.workers.providers.sse import EventStream
from conductor.workers.secrets import get_key, redact
from conductor.workers.startup import StartError, start_before_request

_NO_KEY = "no-key-needed"


def sdk_error_text(status: int, body: bytes) -> str:
    """The text the SDK gives an error reply (``APIStatusError``): the status, and the body's error message
    when it has one.

    >>> sdk_error_text(429, b'{"error": {"message": "Rate limit reached", "type": "requests"}}')
    'Error code: 429 - Rate limit reached'
    >>> sdk_error_text(502, b'<html>bad gateway</html>')
    'Error code: 502'
    """
    text = f"Error code: {status}"
    try:
        data = json.loads(body)
    except ValueError:
        return text
    message = _message(data.get("error", data)) if isinstance(data, dict) else None
    return f"{text} - {message}" if message else text


def _message(error: Any) -> str | None:
    """An error object's non-empty ``message``, as the SDK reads it, or None."""
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) and message else None


class DirectPost:
    """A chat completion, whole or streamed, posted on aiohttp itself with the request the SDK would send, its
    failures classified as ``classify`` classifies the SDK's.

    WHY not the SDK: per call it builds its request options (a pydantic model, a deep copy), its headers and URL
    (httpx's parser), an httpx request, and its aiohttp transport turns that into an aiohttp request and the
    reply back into an httpx response; a stream adds a pydantic model per chunk. To the emulator on loopback
    (``bench/upstream_call.py``; docs/serving.md, "Eighth look"): a whole call 0.621 ms of CPU through the SDK's
    ``post``, 0.192 here, 0.183 for a bare aiohttp post; a 300-chunk stream 29.6 ms through its typed stream, 2.6
    here. Every remote worker call of a served request or a batch run paid the first; every served stream, the
    second. What the SDK decides is kept: the base URL it resolved (``OPENAI_BASE_URL`` included), its key,
    organization and project headers, and the text of its errors (``sdk_error_text``); tests/test_openai_direct.py
    holds this path and the SDK's to the same result (reply, deltas or error), fault by fault, against the
    emulator.
    """

    def __init__(self, client: Any, timeout_s: float):
        self.url = str(client.base_url).rstrip("/") + "/chat/completions"
        sdk = {**client.auth_headers, **client.default_headers}
        self.headers = {k: v for k, v in sdk.items() if isinstance(v, str) and not k.lower().startswith("x-stainless")}
        self.headers["User-Agent"] = f"conductor/{__version__}"
        self.timeout_s = timeout_s
        self.session: Any = None     # opened on the loop of the first call

    def _session(self) -> Any:
        if self.session is None:
            import aiohttp  # the providers extra; imported on first use

            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=1000, keepalive_timeout=5.0),   # the SDK's limits
                headers=self.headers, timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self.session

    async def send(self, body: dict[str, Any], who: str) -> bytes:
        """The reply's body, or a ProviderError (an error status, a timeout, a lost connection)."""
        with _classified(who):
            async with self._session().post(self.url, data=orjson.dumps(body)) as reply:
                raw: bytes = await reply.read()
                if reply.status >= 400:
                    raise _status_error(reply, raw, who)
                return raw

    async def stream(self, body: dict[str, Any], who: str, on_chunk: Callable[[dict[str, Any]], None]) -> None:
        """Post a streamed request; each chunk's JSON goes to ``on_chunk`` as its event completes, up to
        ``data: [DONE]`` or the end of the body. An error event raises as the SDK's ``APIError`` is classified."""
        with _classified(who):
            async with self._session().post(self.url, data=orjson.dumps(body)) as reply:
                if reply.status >= 400:
                    raise _status_error(reply, await reply.read(), who)
                events = EventStream()
                async for piece in reply.content.iter_any():
                    for event in events.feed(piece):
                        if event.data.startswith("[DONE]"):
                            return
                        chunk = _stream_chunk(event.data, who)    # named or not, as the SDK reads chat streams
                        if chunk is not None:
                            on_chunk(chunk)

    async def aclose(self) -> None:
        if self.session is not None:
            await self.session.close()


@contextmanager
def _classified(who: str) -> Iterator[None]:
    """A timeout or a lost connection inside, as the ProviderError ``classify`` makes of the SDK's."""
    import aiohttp

    try:
        yield
    except TimeoutError as e:     # before OSError, of which it is one
        raise ProviderError("timeout", f"{who}: timed out ({type(e).__name__})") from None
    except (aiohttp.ClientError, OSError) as e:
        raise ProviderError("server", f"{who}: connection failed ({type(e).__name__}): {redact(str(e))[:500]}") from None


def _status_error(reply: Any, raw: bytes, who: str) -> ProviderError:
    return status_error(reply.status, redact(sdk_error_text(reply.status, raw))[:500], reply.headers, who)


def _stream_chunk(data: str, who: str) -> dict[str, Any] | None:
    """A stream event's JSON: a chunk (a dict), None for anything else; an ``error`` in it raises (the SDK's
    ``APIError``, classified ``permanent``), as does JSON that does not parse (``malformed``)."""
    try:
        chunk = orjson.loads(data)          # per chunk: orjson, about a third of json's time
    except ValueError as e:
        raise ProviderError("malformed", f"{who}: malformed reply ({type(e).__name__}): {redact(str(e))[:500]}") from None
    if not isinstance(chunk, dict):
        return None
    if chunk.get("error"):
        text = _message(chunk["error"]) or "An error occurred during streaming"
        raise ProviderError("permanent", f"{who}: APIError: {redact(text)[:500]}")
    return chunk


class OpenAIChat:
    def __init__(self, worker: Worker):
        import openai

        self.worker = worker
        self.official = worker.provider == "openai"
        if worker.provider == "local" and not worker.base_url:
            raise ProviderError("permanent", f"worker {worker.name}: local workers need base_url (the llama.cpp server)")
        env = worker.api_key_env or ("OPENAI_API_KEY" if self.official else None)
        key = get_key(env, worker.name) if env else _NO_KEY
        self.client = openai.AsyncOpenAI(api_key=key, base_url=worker.base_url, max_retries=0,
                                         timeout=worker.limits.timeout_s)   # what to send; DirectPost sends it
        self.direct = DirectPost(self.client, worker.limits.timeout_s)
        self.closing = LoopBoundClose(self._close)
        self.params = self._params()
        extra = self.params.get("extra_body") or {}
        self.body = {**{k: v for k, v in self.params.items() if k != "extra_body"}, **extra}   # as sent on the wire
        self._started = False

    def _params(self) -> dict[str, Any]:
        s = self.worker.sampling
        p: dict[str, Any] = {"model": self.worker.model}
        extra: dict[str, Any] = {}
        if self.official:
            p["max_completion_tokens"] = s.max_tokens
        else:
            p["max_tokens"] = s.max_tokens
        if s.reasoning_effort is not None:
            p["reasoning_effort"] = s.reasoning_effort
        if not (self.official and s.reasoning_effort is not None):
            p["temperature"] = s.temperature
            if s.top_p is not None:
                p["top_p"] = s.top_p
        if s.presence_penalty is not None:
            p["presence_penalty"] = s.presence_penalty
        if s.stop:
            p["stop"] = list(s.stop)
        if s.top_k is not None:
            extra["top_k"] = s.top_k
        if s.enable_thinking is not None:
            extra["chat_template_kwargs"] = {"enable_thinking": s.enable_thinking}
        if self.worker.options.get("continue_final_message") and s.assistant_prefill:
            extra.update(continue_final_message=True, add_generation_prompt=False)
        extra.update(self.worker.options.get("extra_body") or {})
        if extra:
            p["extra_body"] = extra
        return p

    async def _ensure_started(self) -> None:
        if self.worker.provider == "local" and not self._started:   # an embedded server reserved, not started
            try:   # the runtime that reserved the server handed its start in (workers/startup.py)
                await asyncio.to_thread(start_before_request, self.worker.base_url)
            except StartError as e:   # the model would not load: infrastructure, not the workflow's fault
                raise ProviderError("permanent", f"worker {self.worker.name}: {e}") from None
            self._started = True

    def _messages(self, messages: list[Message]) -> list[Message]:
        s = self.worker.sampling
        msgs = ([Message("system", s.system_prompt)] if s.system_prompt else []) + list(messages)
        return with_prefill(msgs, s.assistant_prefill)

    def _usage(self, usage: Any, msgs: list[Message], text: str, who: str) -> tuple[int, int]:
        """(input, output) tokens from a reply's ``usage`` (a dict when there is one)."""
        prompt_tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        if prompt_tokens is not None:
            return int(prompt_tokens), int(usage.get("completion_tokens") or 0)
        if self.official:
            raise ProviderError("malformed", f"{who}: reply has no usage")
        # some local servers omit usage: estimate so limits and cost stay meaningful
        return estimate_tokens("".join(m.content for m in msgs)), estimate_tokens(text)

    async def _prepare(self, messages: list[Message]) -> tuple[list[Message], dict[str, Any], str]:
        """Before a call: the server started, the client armed to close with the loop; the messages as sent, the
        request body and the name errors carry."""
        await self._ensure_started()
        await self.closing.arm()
        msgs = self._messages(messages)
        body = {**self.body, "messages": [{"role": m.role, "content": m.content} for m in msgs]}
        return msgs, body, f"worker {self.worker.name}"

    async def complete(self, messages: list[Message], *, sample_index: int = 0) -> Completion:
        msgs, body, who = await self._prepare(messages)
        return self._reply(await self.direct.send(body, who), msgs, who)

    def _reply(self, body: bytes, msgs: list[Message], who: str) -> Completion:
        """A chat completion's JSON read as plain data, not as the SDK's pydantic models (about 1 ms of CPU a
        call, docs/serving.md "Overhead"); the body sent is the one ``chat.completions.create`` would send (its
        ``extra_body`` merged in)."""
        try:
            data = json.loads(body)
        except ValueError:
            raise ProviderError("malformed", f"{who}: malformed reply (not JSON)") from None
        try:
            choice = data["choices"][0]
            text = choice["message"].get("content")
        except (AttributeError, IndexError, KeyError, TypeError):
            raise ProviderError("malformed", f"{who}: reply has no choices[0].message") from None
        if not isinstance(text, (str, type(None))):
            raise ProviderError("malformed", f"{who}: reply content is not text")
        text = text or ""
        usage = data.get("usage")
        in_tok, out_tok = self._usage(usage if isinstance(usage, dict) else None, msgs, text, who)
        finish = choice.get("finish_reason")
        return Completion(text, in_tok, out_tok, finish if isinstance(finish, str) else None)

    async def complete_stream(self, messages: list[Message], sink: TextSink, *, sample_index: int = 0) -> Completion:
        """``complete`` with ``stream: true`` (usage on the last chunk, ``stream_options.include_usage``): each
        content delta goes to ``sink`` as it arrives; the Completion is the one ``complete`` would return."""
        msgs, body, who = await self._prepare(messages)
        parts: list[str] = []
        finish: Any = None
        usage: Any = None

        def take(chunk: dict[str, Any]) -> None:
            nonlocal finish, usage
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or ():
                if not isinstance(choice, dict):
                    continue
                delta = choice.get("delta") if choice.get("index") == 0 else None
                text = delta.get("content") if isinstance(delta, dict) else None
                if text and isinstance(text, str):
                    parts.append(text)
                    sink.delta(text)
                finish = choice.get("finish_reason") or finish

        await self.direct.stream({**body, "stream": True, "stream_options": {"include_usage": True}}, who, take)
        text = "".join(parts)
        in_tok, out_tok = self._usage(usage, msgs, text, who)
        return Completion(text, in_tok, out_tok, finish if isinstance(finish, str) else None)

    async def _close(self) -> None:
        await self.direct.aclose()
        await self.client.close()

    async def aclose(self) -> None:
        await self.closing.aclose()


@register_provider("openai")
def _openai(worker: Worker) -> OpenAIChat:
    return OpenAIChat(worker)


@register_provider("openai_compatible")
def _compatible(worker: Worker) -> OpenAIChat:
    return OpenAIChat(worker)


@register_provider("local")
def _local(worker: Worker) -> OpenAIChat:
    return OpenAIChat(worker)
