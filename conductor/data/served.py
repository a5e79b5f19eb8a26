"""Served traffic as training questions: the requests ``conductor serve`` answered that a labels file answers too.

GRPO learns from verifiable rewards, and a served request has no gold answer. A *labels file* supplies it: any
question file ``conductor answer`` reads (JSONL, CSV or Parquet; ``id``, ``question``, ``answer`` and the optional
``domain``, ``choices``, ``tests`` columns), typically the application's own items with known answers, or
answers reviewed after the fact. A served request is labelled by the first label row that matches it:

- by id: the row's ``id`` is the response id the client got (``chatcmpl-<rid>`` or ``resp_<rid>``) or ``<rid>``;
- by text: the row's question equals the served text after :func:`normalize_question` (when the server stored
  the user's text, ``store_text``);
- by hash: the row's question hashes to the ``[REDACTED:<sha256 prefix>]`` mark the server stored in its place
  (the default), so a night can train on traffic whose text the lake never held.

The selection keeps the label rows as they are (same columns, so the file reads back exactly as the labels file
would), in label order, one per labelled question however often it was asked, with the row's own id or, when it
had none, the positional id loading the labels file would have given it.

    >>> served_request_id("served/ab12-7"), served_request_id("gsm8k/test/3")
    ('ab12-7', None)
    >>> label_request_id("chatcmpl-ab12-7"), label_request_id("resp_ab12-7"), label_request_id("ab12-7")
    ('ab12-7', 'ab12-7', 'ab12-7')
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conductor.data.datasets import QUESTION_ALIASES, DatasetError, iter_rows
from conductor.data.questions import normalize_question

_REDACTED = "[REDACTED:"


def served_request_id(question_id: str) -> str | None:
    """The request id inside a served trajectory's question id (``served/<rid>``), else None."""
    return question_id.removeprefix("served/") if question_id.startswith("served/") else None


def label_request_id(label_id: str) -> str:
    """A label row's id as a request id: the response ids clients see carry a prefix."""
    for prefix in ("chatcmpl-", "resp_"):
        if label_id.startswith(prefix):
            return label_id[len(prefix):]
    return label_id


def redaction_mark(text: str) -> str:
    """The mark ``conductor serve`` stores instead of the user's text (``conductor.serve.lake.scrub`` writes it).

    >>> redaction_mark("What is 2+2?")[:10]
    '[REDACTED:'
    """
    return f"[REDACTED:{hashlib.sha256(text.encode()).hexdigest()[:16]}]"


@dataclass(frozen=True)
class ServedTraffic:
    """What the lake holds of served requests: their ids and their texts (or the marks that stand for them)."""

    requests: int = 0
    ids: frozenset[str] = frozenset()
    texts: frozenset[str] = frozenset()     # normalised text of requests stored with their text
    marks: frozenset[str] = frozenset()     # [REDACTED:...] marks of the others

    @classmethod
    def of(cls, rows: Iterable[tuple[str, str]]) -> ServedTraffic:
        """From (question_id, question) pairs of ``kind = 'served'`` trajectories."""
        ids: set[str] = set()
        texts: set[str] = set()
        marks: set[str] = set()
        n = 0
        for qid, question in rows:
            n += 1
            if rid := served_request_id(qid or ""):
                ids.add(rid)
            if question.startswith(_REDACTED):
                marks.add(question)
            elif question:
                texts.add(normalize_question(question))
        return cls(requests=n, ids=frozenset(ids), texts=frozenset(texts), marks=frozenset(marks))

    def asked(self, label_id: str | None, text: str) -> bool:
        """Whether a label row (its id and question text) names a request served here."""
        if label_id and label_request_id(label_id) in self.ids:
            return True
        return normalize_question(text) in self.texts or redaction_mark(text) in self.marks


@dataclass(frozen=True)
class ServedSelection:
    """The label rows that served requests asked, and how much of the traffic they cover."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    labels: int = 0               # label rows read
    requests: int = 0             # served requests in the lake

    @property
    def labelled(self) -> int:
        return len(self.rows)

    def describe(self) -> str:
        return (f"{self.requests} served requests in the lake; {self.labelled} distinct labelled questions "
                f"among them (of {self.labels} label rows)")


def read_served(lake: str) -> ServedTraffic:
    """The served requests a lake holds (none when the lake or its served rows do not exist yet)."""
    from conductor.lake.reader import open_lake

    try:
        frame = open_lake(lake).scan("trajectories", kind="served").select("question_id", "question").collect()
    except FileNotFoundError:
        return ServedTraffic()
    return ServedTraffic.of(zip(frame["question_id"].to_list(), frame["question"].to_list()))


def select_labelled(traffic: ServedTraffic, labels: str) -> ServedSelection:
    """The rows of ``labels`` whose question was served (see the module docstring for the matching rules).

    One row per question: a repeated label (same question text or same request id, same answer) is kept
    once; two rows that label one question with different answers are a DatasetError naming both lines
    (training on both would reward two contradicting answers)."""
    dataset = os.path.basename(str(labels).rstrip("/")).split(".", 1)[0]
    rows: list[dict[str, Any]] = []
    first: dict[str, tuple[int, str]] = {}      # question key -> (line, answer) of its first label row
    n = 0
    for i, (lineno, row) in enumerate(iter_rows(labels)):
        n += 1
        column = next((c for c in QUESTION_ALIASES if c in row), None)
        text = row.get(column) if column else None
        if not isinstance(text, str) or not text.strip():
            raise DatasetError(f"{labels}:{lineno}: missing or empty field 'question'")
        label_id = None if row.get("id") in (None, "") else str(row["id"])
        if not traffic.asked(label_id, text):
            continue
        answer = "" if row.get("answer") is None else str(row["answer"]).strip()
        keys = [f"text:{normalize_question(text)}"] + ([f"id:{label_request_id(label_id)}"] if label_id else [])
        seen = next((first[k] for k in keys if k in first), None)
        if seen is not None:
            if seen[1] != answer:
                raise DatasetError(f"{labels}:{lineno}: labels a served question that line {seen[0]} already "
                                   f"labels with another answer ({seen[1]!r} there, {answer!r} here); keep one")
            continue
        for k in keys:
            first[k] = (lineno, answer)
        rows.append({**row, "id": label_id or f"{dataset}/all/{i}"})
    return ServedSelection(rows=rows, labels=n, requests=traffic.requests)


def write_selection(selection: ServedSelection, labels: str, out_dir: Path) -> Path:
    """The selected rows as JSONL named after the labels file (so loading it gives the same dataset name and
    ids as loading the labels file); written atomically, so a rerun of the night reads a whole file."""
    from conductor.files import atomic_write_text

    stem = os.path.basename(str(labels).rstrip("/")).split(".", 1)[0] or "served"
    text = "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in selection.rows)
    return atomic_write_text(out_dir / f"{stem}.jsonl", text)
