"""What every SDK-backed provider needs: error classification, message shaping, closing the client.

WHY one place: the retry loop only understands ``ProviderError.kind``; every
SDK raises its own exception classes, so each provider funnels them through
``classify`` here, and every message is redacted before it leaves.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from conductor.trajectory import ErrorKind
from conductor.workers.providers.base import Message, ProviderError
from conductor.workers.secrets import redact


def retry_after_from_headers(headers: Any) -> float | None:
    """Seconds to wait from Retry-After / retry-after-ms (seconds or an HTTP date).

    >>> retry_after_from_headers({"retry-after": "1.5"})
    1.5
    >>> retry_after_from_headers({"retry-after-ms": "250"})
    0.25
    >>> retry_after_from_headers({}) is None
    True
    """
    if not headers:
        return None
    get = headers.get
    ms = get("retry-after-ms") or get("Retry-After-Ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    ra = get("retry-after") or get("Retry-After")
    if not ra:
        return None
    try:
        return max(0.0, float(ra))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(ra)
            return max(0.0, when.timestamp() - time.time())
        except (TypeError, ValueError):
            return None


def kind_for_status(status: int) -> ErrorKind:
    """Map an HTTP status to a ProviderError kind.

    >>> [kind_for_status(s) for s in (429, 503, 529, 401, 400, 408)]
    ['rate_limited', 'server', 'server', 'auth', 'permanent', 'timeout']
    """
    if status == 429:
        return "rate_limited"
    if status in (408, 504):
        return "timeout"
    if status >= 500:
        return "server"
    if status in (401, 403):
        return "auth"
    return "permanent"


def status_error(status: int, detail: str, headers: Any, who: str) -> ProviderError:
    """The ProviderError for an HTTP error reply: its kind from the status, its wait from Retry-After.

    >>> e = status_error(429, "Error code: 429 - slow down", {"retry-after": "2"}, "worker w")
    >>> (e.kind, str(e), e.retry_after, e.status)
    ('rate_limited', 'worker w: HTTP 429: Error code: 429 - slow down', 2.0, 429)
    """
    return ProviderError(kind_for_status(status), f"{who}: HTTP {status}: {detail}",
                         retry_after=retry_after_from_headers(headers), status=status)


def classify(exc: BaseException, who: str) -> ProviderError:
    """Turn any SDK/transport exception into a redacted, classified ProviderError."""
    if isinstance(exc, ProviderError):
        return exc
    import httpx

    name = type(exc).__name__
    status = getattr(exc, "status_code", None) or getattr(exc, "code", None)
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    detail = redact(str(exc))[:500]
    if isinstance(exc, (asyncio.TimeoutError, httpx.TimeoutException)) or "Timeout" in name:
        return ProviderError("timeout", f"{who}: timed out ({name})")
    if isinstance(status, int) and status >= 400:
        return status_error(status, detail, headers, who)
    if isinstance(exc, (httpx.TransportError, ConnectionError)) or "Connect" in name or "Disconnect" in name:
        return ProviderError("server", f"{who}: connection failed ({name}): {detail}")
    if isinstance(exc, json.JSONDecodeError) or "Validation" in name or "Decode" in name:
        return ProviderError("malformed", f"{who}: malformed reply ({name}): {detail}")
    return ProviderError("permanent", f"{who}: {name}: {detail}")


def split_system(messages: list[Message], system_prompt: str | None) -> tuple[str | None, list[Message]]:
    """Pull system messages out (Anthropic and Gemini take them separately).

    >>> split_system([Message("system", "be brief"), Message("user", "hi")], None)
    ('be brief', [Message(role='user', content='hi')])
    """
    sys_parts = [system_prompt] if system_prompt else []
    sys_parts += [m.content for m in messages if m.role == "system"]
    rest = [m for m in messages if m.role != "system"]
    return ("\n\n".join(sys_parts) if sys_parts else None), rest


def with_prefill(messages: list[Message], prefill: str | None) -> list[Message]:
    """Append the worker's assistant prefill unless the messages already end with one."""
    if not prefill or (messages and messages[-1].role == "assistant"):
        return messages
    return [*messages, Message("assistant", prefill)]


def estimate_tokens(text: str) -> int:
    """Rough token count (4 chars/token) for limits and for servers that omit usage.

    >>> estimate_tokens("abcdefgh")
    2
    """
    return max(1, len(text) // 4) if text else 0


class LoopBoundClose:
    """Closes an async SDK client on the event loop that used it, before that loop closes.

    WHY: an SDK client's connections belong to the loop they were opened on. The executor drops its providers
    when a shard's ``asyncio.run`` ends and builds new ones on the next loop; a client dropped unclosed is
    closed by the SDK's ``__del__`` on whatever loop runs at garbage collection, which fails with "Event loop
    is closed" and prints "Task exception was never retrieved" and a traceback on a successful run. ``arm()``
    (awaited on each call) starts an async generator parked on the running loop; ``asyncio.run`` closes open
    async generators (``loop.shutdown_asyncgens``) before it closes the loop, and the generator's ``finally``
    closes the client there. An explicit ``aclose()`` first makes that a no-op.
    """

    def __init__(self, close: Callable[[], Awaitable[None]]):
        self._close = close
        self._guard: AsyncIterator[None] | None = None   # held here: the loop keeps only a weak reference
        self.closed = False

    async def arm(self) -> None:
        if self._guard is None:
            self._guard = self._until_loop_shutdown()
            await anext(self._guard)

    async def _until_loop_shutdown(self) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            await self._close()
