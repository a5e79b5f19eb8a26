"""Question-set specs as users type them: ``gsm8k_test:10,mmlu_stem:10`` or ``my.jsonl`` or ``s3://b/q.parquet:50``."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conductor.data.questions import Question


_SLICE = re.compile(r"^(?P<name>.+)\[(?P<start>\d*):(?P<stop>\d*)\]$")


def split_spec(spec: str) -> list[tuple[str, int, int | None]]:
    """Comma-separated parts, each a dataset name or path with an optional ``:N`` limit or ``[a:b]`` slice,
    as (name, start, stop). Slices keep training mixes and held-out sets apart on one dataset.

    >>> split_spec("gsm8k_test:10, mmlu_stem[100:150]")
    [('gsm8k_test', 0, 10), ('mmlu_stem', 100, 150)]
    >>> split_spec("s3://bucket/q.jsonl")
    [('s3://bucket/q.jsonl', 0, None)]
    """
    parts: list[tuple[str, int, int | None]] = []
    for raw in spec.split(","):
        raw = raw.strip()
        if not raw:
            continue
        if m := _SLICE.match(raw):
            start, stop = int(m["start"] or 0), int(m["stop"]) if m["stop"] else None
            if stop is not None and stop <= start:
                raise ValueError(f"question-set spec {raw!r}: empty slice")
            parts.append((m["name"], start, stop))
            continue
        name, sep, tail = raw.rpartition(":")
        if sep and tail.isdigit() and name:
            from conductor.data.datasets import DATASETS

            if os.path.exists(raw) and name not in DATASETS:
                parts.append((raw, 0, None))   # a file whose name ends in :N
                continue
            if os.path.exists(raw):   # a file named gsm8k_test:3 must not silently lose to the dataset spec
                raise ValueError(f"question-set spec {raw!r} is both a file here and {name!r} limited to {tail}; "
                                 f"write ./{raw} for the file or move it")
            parts.append((name, 0, int(tail)))
        else:
            parts.append((raw, 0, None))
    if not parts:
        raise ValueError("empty question-set spec")
    return parts


def load_questions(spec: str, limit: int | None = None) -> list[Question]:
    """Load every part, keep ids unique, apply an overall limit last."""
    from conductor.data.datasets import load_dataset

    out: list[Question] = []
    seen: set[str] = set()
    for name, start, stop in split_spec(spec):
        for q in load_dataset(name, limit=stop)[start:]:
            if q.id in seen:
                raise ValueError(f"{name}: duplicate question id {q.id!r}")
            seen.add(q.id)
            out.append(q)
    return out[:limit] if limit is not None else out


def check_disjoint(train: list[Question], held_out: list[Question], what: str = "evaluation") -> None:
    """Held-out means held out: refuse an evaluation set that shares questions with the training mix."""
    shared = sorted({q.id for q in train} & {q.id for q in held_out})
    if shared:
        raise ValueError(f"{what} questions overlap the training mix ({len(shared)} shared, e.g. {shared[0]!r}); "
                         "use disjoint slices such as mmlu_stem[0:200] and mmlu_stem[200:300]")
