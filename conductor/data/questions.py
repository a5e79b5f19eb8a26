"""The question record every stage reads: what to ask, and what counts as right.

A ``Question`` carries the full prompt text (with lettered choices for multiple
choice and an instruction on the answer format) so the conductor and the workers
see exactly the same thing, and a stable ``id`` ("gsm8k/test/17") so reruns of
the same shard line up row for row in the lake.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

Domain = Literal["math", "mcq", "code", "free"]
DOMAINS: tuple[str, ...] = ("math", "mcq", "code", "free")
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

ANSWER_INSTRUCTIONS: dict[str, str] = {
    "math": "Give your final answer inside <answer></answer> tags (for example <answer>42</answer>).",
    "mcq": "Give the letter of the correct option inside <answer></answer> tags (for example <answer>B</answer>).",
    "code": "Write the complete solution as one Python code block (```python ... ```).",
    "free": "Give your final answer inside <answer></answer> tags.",
}


@dataclass(frozen=True)
class Question:
    """One benchmark item. ``gold`` is a string (for MCQ: the correct letter);
    code items carry ``tests`` (+ ``entry_point`` for function-style tests)."""

    id: str
    dataset: str
    domain: Domain
    prompt: str
    gold: str | None = None
    tests: Any = None                # str (HumanEval check code) or list[{"input","output"}]
    entry_point: str | None = None
    source: str = ""
    split: str = ""
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.domain not in DOMAINS:
            raise ValueError(f"question {self.id!r}: domain {self.domain!r} not in {DOMAINS}")
        if not self.id:
            raise ValueError("question: empty id")

    @property
    def choices(self) -> list[str] | None:
        """The option texts of a multiple-choice item (kept in metadata)."""
        return self.metadata.get("choices")

    def with_prompt(self, prompt: str) -> Question:
        return replace(self, prompt=prompt)


def mcq_prompt(question: str, choices: Sequence[str], instruction: str | None = None) -> str:
    """Question text, lettered options, then the answer-format instruction.

    >>> print(mcq_prompt("2+2?", ["3", "4"]))
    2+2?
    <BLANKLINE>
    A. 3
    B. 4
    <BLANKLINE>
    Give the letter of the correct option inside <answer></answer> tags (for example <answer>B</answer>).
    """
    if len(choices) > len(LETTERS):
        raise ValueError(f"too many choices ({len(choices)})")
    options = "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices))
    return f"{question.strip()}\n\n{options}\n\n{instruction or ANSWER_INSTRUCTIONS['mcq']}"


def with_instruction(text: str, domain: str, instruction: str | None = None) -> str:
    """Append the answer-format instruction for ``domain``.

    >>> with_instruction("What is 1+1?", "math").endswith("<answer>42</answer>).")
    True
    """
    return f"{text.strip()}\n\n{instruction or ANSWER_INSTRUCTIONS[domain]}"


def shard_id(question_id: str, n_shards: int) -> int:
    """Hash-based shard of a question id: stable across runs and machines.

    >>> shard_id("gsm8k/test/17", 8) == shard_id("gsm8k/test/17", 8)
    True
    >>> 0 <= shard_id("gsm8k/test/17", 8) < 8
    True
    """
    if n_shards < 1:
        raise ValueError("n_shards must be >= 1")
    digest = hashlib.sha256(question_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % n_shards


_UNSAFE = re.compile(r"[^A-Za-z0-9._+@-]+")


def safe_name(text: str, default: str = "q") -> str:
    """A plain path segment for file names in the lake: any other character becomes '_'.

    >>> safe_name("my questions"), safe_name("données=v2"), safe_name(".hidden"), safe_name("")
    ('my_questions', 'donn_es_v2', 'q.hidden', 'q')
    """
    out = _UNSAFE.sub("_", text).strip("_")
    if not out or not out[0].isalnum():
        out = default + out
    return out[:60]


def question_digest(q: Question) -> str:
    """Hash of everything in a question that can change its answer or grade (not its position in the file).

    >>> a = Question(id="q1", dataset="d", domain="math", prompt="1+1?", gold="2")
    >>> question_digest(a) == question_digest(replace(a, metadata={"row": 9}))
    True
    >>> question_digest(a) == question_digest(replace(a, gold="3"))
    False
    """
    meta = {k: v for k, v in sorted(q.metadata.items()) if k != "row"}
    body = [q.id, q.dataset, q.domain, q.prompt, q.gold, q.tests, q.entry_point, meta]
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


def sharded(questions: Iterable[Question], shard_size: int) -> Iterator[tuple[str, list[Question]]]:
    """Consecutive fixed-size shards, named by dataset and position, e.g.
    ``("gsm8k_test-00000", [...])``; the same input always gives the same shards. Dataset names are made
    safe for file names (any file name works).

    >>> qs = [Question(id=f"d/t/{i}", dataset="d", domain="free", prompt="p") for i in range(5)]
    >>> [(name, len(chunk)) for name, chunk in sharded(qs, 2)]
    [('d-00000', 2), ('d-00001', 2), ('d-00002', 1)]
    """
    if shard_size < 1:
        raise ValueError("shard_size must be >= 1")
    chunk: list[Question] = []
    index = 0
    for q in questions:
        chunk.append(q)
        if len(chunk) == shard_size:
            yield f"{safe_name(chunk[0].dataset)}-{index:05d}", chunk
            chunk, index = [], index + 1
    if chunk:
        yield f"{safe_name(chunk[0].dataset)}-{index:05d}", chunk


def content_sharded(questions: Sequence[Question], shard_size: int,
                    key: Callable[[Question], str]) -> list[tuple[str, list[Question]]]:
    """Consecutive shards named by what they hold: ``<dataset>-<hash of the questions' keys>``.

    A shard's name changes whenever one of its questions (``key``: id, content and the settings that change
    answers) changes, so a rerun never mistakes an old shard for the current one.

    >>> qs = [Question(id=f"q{i}", dataset="my set", domain="free", prompt="p") for i in range(3)]
    >>> [(n.split("-")[0], len(c)) for n, c in content_sharded(qs, 2, lambda q: q.id)]
    [('my_set', 2), ('my_set', 1)]
    >>> content_sharded(qs, 2, lambda q: q.id)[0][0] == content_sharded(qs[:2], 5, lambda q: q.id)[0][0]
    True
    """
    out = []
    for _, chunk in sharded(questions, shard_size):
        digest = hashlib.sha256("\x1f".join(key(q) for q in chunk).encode()).hexdigest()[:12]
        out.append((f"{safe_name(chunk[0].dataset)}-{digest}", chunk))
    return out


def normalize_question(text: str) -> str:
    """NFKC, whitespace runs collapsed to one space (ends stripped), casefolded.

    >>> normalize_question("  What is\\n\\t2+2?  ")
    'what is 2+2?'
    >>> normalize_question("ＡＢＣ  Straße") == normalize_question("abc strasse")
    True
    >>> normalize_question(normalize_question(" A\\u00a0b ")) == normalize_question(" A\\u00a0b ")
    True
    """
    return " ".join(unicodedata.normalize("NFKC", text).split()).casefold()
