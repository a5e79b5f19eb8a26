"""Servers that start on a worker's first request, handed in by whoever reserved them.

A worker's server may be reserved but not started yet (``local/servers.py``: ``EmbeddedServers.reserve``), so a
rerun served from the response cache, or a run that never routes to that worker, loads no model. The runtime
that reserves the server registers how to start it here, keyed by the URL the worker calls
(``on_first_request``); a provider calls ``start_before_request(url)`` before it sends. So ``workers/`` never
imports ``local/``: a provider calls a URL and is told, at most, how to wake what answers it.
"""

from __future__ import annotations

from collections.abc import Callable

Start = Callable[[], None]   # blocking (a model load and its health check), thread-safe; raises StartError

_STARTS: dict[str, Start] = {}


class StartError(RuntimeError):
    """A server that would not start (the model would not load): infrastructure, not the workflow's fault."""


def on_first_request(url: str, start: Start) -> None:
    """Call ``start`` before any request to ``url`` (every time: ``start`` is a no-op once its server runs)."""
    _STARTS[url] = start


def forget(url: str) -> None:
    """The server behind ``url`` is gone (stopped with its owner): nothing to start any more."""
    _STARTS.pop(url, None)


def start_before_request(url: str | None) -> None:
    """Start the server registered for ``url``, if any; a no-op for any other URL.

    Blocking: call it off the event loop (``asyncio.to_thread``).

    >>> started = []
    >>> on_first_request("http://127.0.0.1:9/v1", lambda: started.append(1))
    >>> start_before_request("http://127.0.0.1:9/v1"); start_before_request("http://elsewhere/v1"); started
    [1]
    >>> forget("http://127.0.0.1:9/v1"); start_before_request("http://127.0.0.1:9/v1"); started
    [1]
    """
    start = _STARTS.get(url or "")
    if start is not None:
        start()
