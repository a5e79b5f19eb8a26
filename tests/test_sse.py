"""The event-stream decoder (conductor/workers/providers/sse.py) against the OpenAI SDK's own decoder as the oracle:
a corpus of the shapes servers send, then hypothesis: any stream of fields, comments and blank lines, with any of
the three line ends, cut into pieces anywhere (a \\r\\n split across two pieces included)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from openai._streaming import SSEDecoder

from conductor.workers.providers.sse import Event, EventStream


def ours(pieces: list[bytes]) -> list[tuple[str | None, str]]:
    s = EventStream()
    return [(e.name, e.data) for p in pieces for e in s.feed(p)]


def sdks_all(pieces: list[bytes]) -> list[tuple[str | None, str]]:
    return [(e.event, e.data) for e in SSEDecoder().iter_bytes(iter(pieces))]


CORPUS = [
    # an OpenAI chat stream: chunks, then [DONE]
    (b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\ndata: [DONE]\n\n',
     [(None, '{"choices":[{"index":0,"delta":{"content":"Hi"}}]}'), (None, "[DONE]")]),
    (b"data:no space\r\n\r\n", [(None, "no space")]),                         # the space is optional
    (b"data:  two spaces\n\n", [(None, " two spaces")]),                       # only one is dropped
    (b"data: a\ndata: b\n\n", [(None, "a\nb")]),                               # lines join with \n
    (b": keep-alive\n\ndata: x\r\rdata: y\r\n\r\n", [(None, "x"), (None, "y")]),   # comments; \r alone ends a line
    (b"event: error\ndata: {}\n\n", [("error", "{}")]),
    (b"event: ping\n\ndata: z\n\n", [(None, "z")]),                            # a name alone dispatches nothing
    (b"id: 3\nretry: 10\ndata: w\n\n", [(None, "w")]),
    (b"data\n\n", [(None, "")]),                                               # a field with no colon
    (b"data: \xc3\xa9t\xc3\xa9\n\n", [(None, "\u00e9t\u00e9")]),
    (b"data: unended", []),                                                    # never dispatched
]


def test_the_corpus_decodes_as_written_and_as_the_sdk_decodes_it() -> None:
    for raw, expected in CORPUS:
        assert ours([raw]) == expected, raw
        assert ours([raw[i:i + 1] for i in range(len(raw))]) == expected, raw     # byte by byte
        assert [e for e in sdks_all([raw]) if e[1] or e in expected] == expected, raw   # its name-only events aside


def test_an_event_is_returned_by_the_feed_that_completes_it() -> None:
    s = EventStream()
    assert s.feed(b"data: a\n") == [] and s.feed(b"\r") == [Event(None, "a")]
    assert s.feed(b"\n") == []                  # the \n of a \r\n split across pieces is not a second blank line
    assert s.feed(b"data: b\n\n") == [Event(None, "b")] and s.feed(b"") == []


_text = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=12)
_line = st.one_of(
    st.builds(lambda v: f"data: {v}", _text),
    st.builds(lambda v: f"data:{v}", _text),
    st.builds(lambda v: f"event: {v}", _text.filter(bool)),
    st.builds(lambda v: f": {v}", _text),
    st.builds(lambda v: f"id: {v}", _text.filter(lambda t: "\0" not in t)),
    st.builds(lambda v: f"retry: {v}", st.integers(0, 9999).map(str)),
    st.builds(lambda v: f"{v}: x", st.sampled_from(["other", "Data", "dat"])),
    st.just(""),
)


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.tuples(_line, st.sampled_from(["\n", "\r\n", "\r"])), max_size=25),
       cuts=st.lists(st.integers(0, 400), max_size=12))
def test_any_stream_cut_anywhere_decodes_as_the_sdk_decodes_it(lines: list[tuple[str, str]], cuts: list[int]) -> None:
    raw = "".join(line + end for line, end in lines).encode()
    at = sorted({c % (len(raw) + 1) for c in cuts} | {0, len(raw)})
    pieces = [raw[a:b] for a, b in zip(at, at[1:], strict=False)]
    theirs = sdks_all(pieces)
    mine = ours(pieces)
    assert mine == ours([raw])                 # the cuts change nothing
    # the SDK also dispatches events that carry no data line (a name, id or retry alone) as empty data; the
    # standard does not, and a chat stream has none: every event of ours is the SDK's, in order, and every
    # SDK event we leave out has empty data
    it = iter(theirs)
    for event in mine:
        for other in it:
            if other == event:
                break
            assert other[1] == "", (other, event)
        else:
            raise AssertionError(f"{event} not among the SDK's events {theirs}")
    assert all(d == "" for _, d in it)
