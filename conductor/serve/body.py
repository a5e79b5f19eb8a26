"""Request bodies off the wire: read under the size cap, then parsed as JSON with a nesting limit.

WHY a module of its own: the body is the one input a client controls byte by byte, so both steps must be safe
for any bytes. Reading counts bytes as they arrive, so a body without a ``Content-Length``
(``Transfer-Encoding: chunked``) is refused with 413 as soon as it passes the cap, not after it has been
buffered whole. Parsing uses ``pydantic_core.from_json`` (jiter), which refuses nesting deeper than about 200
levels with an error, where orjson 3.8 recursed until the interpreter's C stack overflowed (a segfault that took
the server and its unflushed lake rows with it); it also refuses ``NaN`` / ``Infinity``, which are not JSON.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from pydantic_core import from_json

from conductor.serve.errors import APIError, invalid


def too_large(max_bytes: int, size: int | None = None) -> APIError:
    said = f"is {size:,} bytes" if size is not None else f"is over {max_bytes:,} bytes"
    return APIError(413, "invalid_request_error", "request_too_large",
                    f"the request body {said}; this server accepts at most {max_bytes:,}")


async def read_capped(chunks: AsyncIterator[bytes], declared: str | None, max_bytes: int) -> bytes:
    """The body from ``chunks`` (the ASGI stream), refused (413) from its declared length, or as soon as more than
    ``max_bytes`` have arrived; what is left unread is never buffered."""
    if declared is not None and declared.strip().isdigit() and int(declared) > max_bytes:
        raise too_large(max_bytes, int(declared))
    buf = bytearray()
    async for piece in chunks:
        buf += piece
        if len(buf) > max_bytes:
            raise too_large(max_bytes)
    return bytes(buf)


def parse_json(raw: bytes) -> Any:
    """JSON text -> Python values; 400 ``invalid_json`` for anything else, too deep a nesting included.

    >>> parse_json(b'{"n": [1, 2.5, "x", null]}')
    {'n': [1, 2.5, 'x', None]}
    >>> try:
    ...     parse_json(b"[" * 100_000)
    ... except APIError as e:
    ...     print(e.status, e.code, "recursion limit exceeded" in e.message)
    400 invalid_json True
    """
    try:
        return from_json(raw, allow_inf_nan=False, cache_strings="keys")
    except ValueError as e:
        raise invalid(f"the request body is not valid JSON ({e})", "invalid_json") from None
