"""Question-set specs as users type them: ``gsm8k_test:10,mmlu_stem:10`` or ``my.jsonl`` or ``s3://b/q.parquet:50``."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conductor.questions import Question


def split_spec(spec: str) -> list[tuple[str, int | None]]:
    """Comma-separated parts, each a dataset name or path with an optional ``:N`` limit.

    >>> split_spec("gsm8k_test:10, mmlu_stem:10")
    [('gsm8k_test', 10), ('mmlu_stem', 10)]
    >>> split_spec("s3://bucket/q.jsonl")
    [('s3://bucket/q.jsonl', None)]
    """
    parts = []
    for raw in spec.split(","):
        raw = raw.strip()
        if not raw:
            continue
        name, sep, tail = raw.rpartition(":")
        if sep and tail.isdigit() and name:
            parts.append((name, int(tail)))
        else:
            parts.append((raw, None))
    if not parts:
        raise ValueError("empty question-set spec")
    return parts


def load_questions(spec: str, limit: int | None = None) -> list["Question"]:
    """Load every part, keep ids unique, apply an overall limit last."""
    from conductor.datasets import load_dataset

    out: list[Question] = []
    seen: set[str] = set()
    for name, n in split_spec(spec):
        for q in load_dataset(name, limit=n):
            if q.id in seen:
                raise ValueError(f"{name}: duplicate question id {q.id!r}")
            seen.add(q.id)
            out.append(q)
    return out[:limit] if limit is not None else out
