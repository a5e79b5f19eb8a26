"""The served answer streamed as it is produced: what of a reply still being written may be sent now.

WHY a module of its own: the executor streams the last step's reply of a workflow's final round into a sink
(``conductor.execution.executor.ANSWER_STREAM``), but the client must get exactly the text the non-streamed
response would hold (``render.answer_of``: the executor's key redaction, then the request's ``stop`` and
``max_tokens`` cuts), and what was sent cannot be taken back. So a chunk only ever carries text that nothing
coming later can change: the tail that could still become a stop sequence, or a key that redaction would
rewrite, is held back until it can no longer change or the reply is complete. At the end the server compares
what it sent with the finished answer and sends the rest (``ChoiceStream.finish``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from conductor.workers.secrets import redact

_SPACES = " \t\n\r\f\v"


def _before_last_word(text: str) -> int:
    """Where the last word starts (with a ``bearer`` before it): a key may be being written there, and redaction
    could still rewrite it. Searched from the end, so its cost is the word's length, not the text's.

    >>> [_before_last_word(t) for t in ("one two", "one two ", "auth: Bearer ab", "x Bearer ", "")]
    [4, 8, 6, 2, 0]
    """
    start = len(text)
    while start > 0 and text[start - 1] not in _SPACES:
        start -= 1
    gap = start
    while gap > 0 and text[gap - 1] in _SPACES:
        gap -= 1
    if gap < start and text[max(0, gap - 6):gap].lower() == "bearer":
        return gap - 6
    return start


def releasable(text: str, stop: Sequence[str] = (), max_chars: int | None = None) -> tuple[str, bool]:
    """(what of a reply being produced can be sent now, whether it is final: a stop sequence was reached).

    ``text`` is the reply so far. Redacted as the executor will redact the whole reply; cut at the first stop
    sequence (unless a longer one may still be arriving that starts earlier); the tail that could begin a
    stop sequence and the last word (a key could be being written; with a ``bearer`` before it) are held back
    until the text after them arrives; at most ``max_chars`` (the ``max_tokens`` cut).

    >>> releasable("The answer is 42. <ans", ["<answer>"])
    ('The answer is 42. ', False)
    >>> releasable("The answer is 42", [])
    ('The answer is ', False)
    >>> releasable("The answer is 42 <answer>43", ["<answer>"])
    ('The answer is 42 ', True)
    >>> releasable("a b xy", ["b xyz", "y"])         # "b xyz" may still come, and it starts first
    ('a ', False)
    >>> releasable("one two three ", [], max_chars=6)
    ('one tw', False)
    >>> releasable("key: Bearer abc", [])
    ('key: ', False)
    """
    return ready_part(redact(text), stop, max_chars)


def ready_part(text: str, stop: Sequence[str] = (), max_chars: int | None = None) -> tuple[str, bool]:
    """``releasable`` of a text already redacted."""
    found = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    # a longer stop sequence may be starting before the one found, and end after what has arrived
    partial = min((p for s in stop for p in range(max(0, len(text) - len(s) + 1), len(text))
                   if s.startswith(text[p:])), default=len(text))
    done = 0 <= found <= partial
    ready = text[: found if done else partial]
    ready = ready[: _before_last_word(ready)]
    if max_chars is not None:
        ready = ready[:max_chars]
    return ready, done


def frozen_boundary(raw: str, before: int, floor: int) -> int:
    """A position in ``raw`` at or below ``before`` (above ``floor``, else ``floor``) that no redaction can span:
    right after whitespace, and not after ``bearer`` + whitespace. Redacting the text up to it and after it
    separately gives the same as redacting the whole (key shapes are whitespace-free runs; key values too).

    >>> frozen_boundary("alpha beta gamma", 13, 0), frozen_boundary("x Bearer abcdefghijklmnop", 20, 0)
    (11, 2)
    """
    i = before
    while i > floor:
        if raw[i - 1] in _SPACES:
            gap = i - 1
            while gap > floor and raw[gap - 1] in _SPACES:
                gap -= 1
            if raw[max(0, gap - 6):gap].lower() != "bearer":
                return i
            i = gap
        i -= 1
    return floor


class ChoiceStream:
    """One choice's answer as it streams: the executor's sink (``start`` / ``delta``) and what was sent.

    The reply so far is redacted incrementally: everything before a ``frozen_boundary`` well behind the end is
    redacted once and kept, so each look at a long answer redacts only its last few hundred characters."""

    FREEZE_AFTER = 1024              # characters past the frozen part before more of it is frozen
    KEEP_OPEN = 256                  # characters at the end never frozen (redacted again on every look)

    def __init__(self, owner: AnswerStream):
        self.owner = owner
        self.parts: list[str] = []
        self.sent = ""
        self.diverged = False        # a retried reply differs from what was already sent: stop streaming it
        self.done = False            # a stop sequence was reached: nothing more is sent
        self.frozen = 0              # raw characters redacted for good ...
        self.frozen_text = ""        # ... and what they became

    def start(self) -> None:
        self.parts = []              # a retry starts the reply over; what was sent stays sent
        self.frozen, self.frozen_text = 0, ""

    def redacted(self) -> str:
        """``redact`` of the reply so far (the same text, computed on its open end only)."""
        raw = "".join(self.parts)
        if len(raw) - self.frozen > self.FREEZE_AFTER:
            cut = frozen_boundary(raw, len(raw) - self.KEEP_OPEN, self.frozen)
            if cut > self.frozen:
                self.frozen_text += redact(raw[self.frozen:cut])
                self.frozen = cut
        return self.frozen_text + redact(raw[self.frozen:])

    def delta(self, text: str) -> None:
        self.parts.append(text)
        self.owner.changed.set()

    def pending(self) -> str:
        """New text that can be sent now (and is then counted as sent)."""
        if self.diverged or self.done or not self.parts:
            return ""
        ready, self.done = ready_part(self.redacted(), self.owner.stop, self.owner.max_chars)
        if ready.startswith(self.sent):
            new, self.sent = ready[len(self.sent):], ready
            return new
        if not self.sent.startswith(ready):      # not just a retry catching up: it says something else
            self.diverged = True
        return ""

    def finish(self, answer: str) -> str | None:
        """The rest of the finished ``answer`` to send, or None when what was sent is not its beginning."""
        if not answer.startswith(self.sent):
            return None
        rest, self.sent = answer[len(self.sent):], answer
        return rest


class AnswerStream:
    """A request's answers as they are produced (``AnswerSinks`` for the executor): one ``ChoiceStream`` per
    choice, fed only by the last step of the round at ``depth``, the one no later round can replace."""

    def __init__(self, n: int, depth: int, stop: Sequence[str] = (), max_tokens: int | None = None):
        self.depth = depth
        self.stop = tuple(stop)
        self.max_chars = None if max_tokens is None else max_tokens * 4   # render.answer_of's cut
        self.choices = [ChoiceStream(self) for _ in range(n)]
        self.changed = asyncio.Event()
        self.cost_s = 0.0            # CPU the last ``pending`` took (it grows with the answer: see ``pause_s``)

    def sink_for(self, sample_index: int, depth: int) -> ChoiceStream | None:
        if depth != self.depth or not 0 <= sample_index < len(self.choices):
            return None
        return self.choices[sample_index]

    def pending(self) -> list[tuple[int, str]]:
        """(choice, text) that can be sent now."""
        self.changed.clear()
        t0 = time.perf_counter()
        out = [(i, t) for i, c in enumerate(self.choices) if (t := c.pending())]
        self.cost_s = time.perf_counter() - t0
        return out

    def pause_s(self) -> float:
        """How long to let deltas gather before the next ``pending``: each one redacts the whole answer so far,
        so a long answer arriving in many small pieces is looked at a few hundred times a second at most,
        never once per piece (at most a fifth of the time goes to it)."""
        return min(0.05, 4 * self.cost_s) if self.cost_s > 0.0002 else 0.0
