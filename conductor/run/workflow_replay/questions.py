"""The workflow replay's question set, its split, and a spec that makes ``conductor answer`` load exactly it.

The question set: GSM8K test questions that RouteLLM also recorded and MMLU-STEM questions, each dataset in a
fixed content-hash order (a larger count keeps the smaller one's questions), recorded in one merged hash order (so
a partial recording is an unbiased sample of the full set), split by content hash 50/20/30 into train, validation
and test (``conductor.learning.splits.split_of``, seed 0). Changing any of this changes which questions a running
recording has recorded: it is frozen.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from conductor.resources import data_path

if TYPE_CHECKING:
    from conductor.data.questions import Question

LOCAL_POOL = data_path("pools", "local.yaml")
HYBRID_POOL = data_path("pools", "local-hybrid.yaml")
# The menu over the embedded pool (0 = Qwen2.5-Coder-1.5B, 1 = Qwen2.5-Coder-0.5B, 2 = SmolLM2-135M, 3 = python):
MENU = (
    "fixed:0",                    # the 1.5B answers alone (chain of thought)
    "pot:0",                      # the 1.5B writes a program, python runs it (program of thought)
    "chain:0:1",                  # the untrained default's calculation pattern: reason + program, run, report
    "moa:0:0",                    # answer -> review (the 1.5B reviews its own answer)
    "vote:0+pot-0+chain-0-1",     # a vote of three kinds of answers (no new calls)
    "cascade:0+pot-0:0",          # CoT and PoT agree -> accept, else the 1.5B decides seeing both
    "fixed:1",                    # the 0.5B alone (cheap)
)
SPLIT = (0.5, 0.2)   # train, validation; the rest is test
DEFAULT_CONDUCTOR = "embedded"   # the untrained informed default, named explicitly (no registry champion)


def default_cache() -> Path:
    """``$CONDUCTOR_HOME/recordings/workflow-menu.sqlite`` (default ``~/.cache/conductor/``): data, not source."""
    home = os.environ.get("CONDUCTOR_HOME")
    base = Path(home) if home else Path.home() / ".cache" / "conductor"
    return base / "recordings" / "workflow-menu.sqlite"


def _order(q: Question) -> str:
    from conductor.data.questions import normalize_question

    return hashlib.sha256(f"workflow-replay\x1f{normalize_question(q.prompt)}".encode()).hexdigest()


def question_set(n_gsm8k: int, n_mmlu: int) -> list[Question]:
    """The first ``n_gsm8k`` RouteLLM-recorded GSM8K test questions and ``n_mmlu`` MMLU-STEM questions in
    content-hash order, merged by each question's place in its own dataset's order (``stratified``), so that
    every prefix of the set, which is what a recording still under way has, mixes the two in the set's ratio.

    WHY not one hash order: the MMLU questions are the 100 lowest hashes of ~3,000, the GSM8K ones the 300 lowest
    of ~1,300, so merged by hash the first hundred were three quarters MMLU (found on the recording, 2026-11-29)."""
    from conductor.data.datasets import load_dataset
    from conductor.workers.recordings import load_recordings

    gpt4 = load_recordings("routellm-gsm8k:", "gpt-4-1106-preview")
    gsm = sorted((q for q in load_dataset("gsm8k_test") if gpt4.find(q.prompt) is not None), key=_order)[:n_gsm8k]
    mmlu = sorted(load_dataset("mmlu_stem"), key=_order)[:n_mmlu]
    return stratified([gsm, mmlu])


def stratified(groups: Sequence[Sequence[Question]]) -> list[Question]:
    """The groups merged by each item's fractional place in its own group (ties: the earlier group first).

    >>> from conductor.data.questions import Question
    >>> q = lambda i: Question(id=str(i), dataset="d", domain="math", prompt=str(i))
    >>> [x.id for x in stratified([[q(1), q(2), q(3), q(4)], [q(8), q(9)]])]
    ['1', '8', '2', '3', '9', '4']
    """
    ranked = [((i + 0.5) / len(g), k, i, x) for k, g in enumerate(groups) for i, x in enumerate(g)]
    return [x for *_, x in sorted(ranked, key=lambda r: r[:3])]


def split(q: Question) -> str:
    """``train`` / ``validation`` / ``test`` (50/20/30 by content hash, seed 0)."""
    from conductor.learning.splits import split_of

    return split_of(q.prompt, 0, *SPLIT)


def slice_spec(questions: Sequence[Question]) -> str:
    """A question-set spec that loads exactly these questions, in order (``conductor answer`` reads it)."""
    index: dict[str, dict[str, int]] = {}
    parts = []
    for q in questions:
        name = q.dataset                 # the loaders name their questions' dataset after themselves
        if name not in index:
            from conductor.data.datasets import load_dataset

            index[name] = {x.id: i for i, x in enumerate(load_dataset(name))}
        i = index[name][q.id]
        parts.append(f"{name}[{i}:{i + 1}]")
    return ",".join(parts)
