"""Server-sent events read from a byte stream that arrives in arbitrary pieces: the wire of every streamed reply.

The event-stream format (WHATWG HTML, "Interpreting an event stream"): lines end in ``\\n``, ``\\r\\n`` or ``\\r``
(a ``\\r\\n`` may be split across two pieces); a line ``field: value`` (one space after the colon dropped) adds to
the event being built: ``data`` lines are joined with ``\\n``, ``event`` names it; a line starting with ``:`` is a
comment; a blank line ends the event, which is dispatched only if it has data. ``id`` and ``retry`` are read and
dropped: a worker call is never resumed. The OpenAI SDK's decoder (``openai._streaming.SSEDecoder``) is the oracle
in tests/test_sse.py: the same events, data and names, for any stream cut anywhere.

WHY not the SDK's: its stream turns each event into a pydantic model; the provider reads the JSON itself
(conductor/workers/providers/openai.py, ``DirectPost.stream``), and this decoder is all of the SDK's stream it needs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Event:
    """One dispatched event: its name (None when unnamed) and its data."""

    name: str | None
    data: str


class EventStream:
    """Feed it the body's pieces as they arrive; each ``feed`` returns the events those pieces completed.

    >>> s = EventStream()
    >>> s.feed(b'data: {"a": 1}\\n\\nda'), s.feed(b'ta: x\\r'), s.feed(b'\\n: note\\r\\nevent: error\\ndata:y\\n\\n')
    ([Event(name=None, data='{"a": 1}')], [], [Event(name='error', data='x\\ny')])
    >>> s.feed(b'event: error\\ndata: {}\\n\\ndata: [DONE]\\n\\n')
    [Event(name='error', data='{}'), Event(name=None, data='[DONE]')]
    >>> s.feed(b'id: 7\\n\\ndata: last')     # no data: nothing to dispatch; an unended event is never dispatched
    []
    """

    def __init__(self) -> None:
        self._rest = b""           # the start of a line whose end has not arrived
        self._after_cr = False     # the last piece ended in \r: a \n opening the next one belongs to it
        self._name: str | None = None
        self._data: list[str] = []

    def feed(self, piece: bytes) -> list[Event]:
        if not piece:
            return []
        if self._after_cr and piece[:1] == b"\n":
            piece = piece[1:]
        lines = (self._rest + piece).splitlines(keepends=True)
        self._rest = lines.pop() if lines and not lines[-1].endswith((b"\n", b"\r")) else b""
        self._after_cr = bool(lines) and not self._rest and lines[-1].endswith(b"\r")
        events: list[Event] = []
        for line in lines:
            event = self._line(line.rstrip(b"\r\n").decode("utf-8"))
            if event is not None:
                events.append(event)
        return events

    def _line(self, line: str) -> Event | None:
        if not line:
            event = Event(self._name, "\n".join(self._data)) if self._data else None
            self._name, self._data = None, []
            return event
        if line[0] == ":":
            return None
        field, _, value = line.partition(":")
        if value[:1] == " ":
            value = value[1:]
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._name = value
        return None
