"""Graders: one ``grade(question_or_gold, response) -> GradeResult`` per kind.

Kinds: ``math`` (math-verify equivalence), ``numeric`` (tolerance), ``mcq``
(letter/index/option text), ``code`` (tests in the sandbox), ``exact`` (free text).

The folder also holds the paper's reward (``reward``) and the cost objective. Answers are read with
``conductor.extract`` and generated code runs in ``conductor.sandbox``: leaves shared with the tool workers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from conductor.data.questions import Question
from conductor.grading import code as _code  # noqa: F401  (registers "code")
from conductor.grading import equivalence as _equivalence  # noqa: F401  (registers "math", "exact")
from conductor.grading import mcq as _mcq  # noqa: F401  (registers "mcq")
from conductor.grading import numeric as _numeric  # noqa: F401  (registers "numeric")
from conductor.grading.base import Grader, GradeResult, as_question, get_grader, grader_kinds, kind_of, register_grader


def grade(question: Question, response: str | None, kind: str | None = None) -> GradeResult:
    """Grade one response to one question with the grader its dataset asks for. A grader that
    raises (a bug, a gold it cannot read) gives an infrastructure error, never a crashed run."""
    return _guarded(get_grader(kind or kind_of(question)), question, response)


def _guarded(grader: Grader, question: Question | str | Mapping[str, Any], response: str | None) -> GradeResult:
    try:
        return grader.grade(question, response)
    except Exception as exc:  # noqa: BLE001  (reported as the item's error; the batch goes on)
        return GradeResult(False, None, f"grader {getattr(grader, 'kind', '?')} failed: {type(exc).__name__}: "
                                        f"{str(exc)[:200]}")


def grade_many(questions: Sequence[Question | str | Mapping[str, Any]], responses: Sequence[str | None],
               kinds: Sequence[str] | str | None = None, max_workers: int | None = None) -> list[GradeResult]:
    """Grade a batch: math items go through math-verify's pool together, the rest run on threads
    (code runs are bounded by the sandbox semaphore)."""
    if len(questions) != len(responses):
        raise ValueError(f"{len(questions)} questions but {len(responses)} responses")
    if isinstance(kinds, str) or kinds is None:
        kinds = [kinds or (kind_of(q) if isinstance(q, Question) else "exact") for q in questions]
    out: list[GradeResult | None] = [None] * len(questions)
    math_idx = [i for i, k in enumerate(kinds) if k == "math"]
    if math_idx:
        grader = get_grader("math")
        try:
            results = grader.grade_many([questions[i] for i in math_idx], [responses[i] for i in math_idx])  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001  (one bad item must not sink the batch: grade them one by one)
            results = [_guarded(grader, questions[i], responses[i]) for i in math_idx]
        for i, r in zip(math_idx, results):
            out[i] = r
    rest = [i for i, k in enumerate(kinds) if k != "math"]

    def one(i: int) -> GradeResult:
        try:
            grader = get_grader(kinds[i])
        except KeyError as exc:
            return GradeResult(False, None, str(exc.args[0]))
        return _guarded(grader, questions[i], responses[i])
    with ThreadPoolExecutor(max_workers=max_workers or 8) as ex:
        for i, r in zip(rest, ex.map(one, rest)):
            out[i] = r
    return [r for r in out if r is not None]


__all__ = ["GradeResult", "Grader", "as_question", "get_grader", "grade", "grade_many", "grader_kinds", "kind_of",
           "register_grader"]
