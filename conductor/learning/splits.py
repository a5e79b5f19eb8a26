"""A question's split (train / validation / test) from its normalised content: the same on every machine.

A split by content hash needs no stored list and survives a question set growing: a question keeps its split
whatever else is added (``bench/workflow_replay.py`` splits its recording 50/20/30 this way, seed 0).
"""

from __future__ import annotations

import hashlib


def split_of(question: str, seed: int, train: float, val: float) -> str:
    """``train`` / ``validation`` / ``test`` from the question's normalised content (stable across machines).

    >>> split_of("What is 2+2?", 0, 0.6, 0.2) == split_of("what is  2+2? ", 0, 0.6, 0.2)
    True
    >>> split_of("What is 2+2?", 0, 1.0, 0.0), split_of("What is 2+2?", 0, 0.0, 0.0)
    ('train', 'test')
    """
    from conductor.data.questions import normalize_question

    h = hashlib.sha256(f"{seed}\x1f{normalize_question(question)}".encode()).hexdigest()
    u = int(h[:12], 16) / 16 ** 12
    return "train" if u < train else "validation" if u < train + val else "test"
