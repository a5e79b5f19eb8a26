"""The numeric grader: a response's number against the gold's, exactly (number parsing: ``conductor/extract/numbers.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conductor.data.questions import Question
from conductor.extract.answer import UNCOMMITTED, extract, last_number
from conductor.extract.numbers import leading_number, numbers_equal, to_exact
from conductor.grading.base import GradeResult, as_question, register_grader, rules_for


class NumericGrader:
    """Numeric match with tolerance (GSM8K, AIME); tolerances from question metadata."""

    kind = "numeric"

    def grade(self, question_or_gold: Question | str | Mapping[str, Any], response: str | None) -> GradeResult:
        q = as_question(question_or_gold, "math")
        gold = to_exact(q.gold)
        if gold is None:
            return GradeResult(False, None, f"gold {_short(q.gold)} is not a number")
        extracted = extract(response, rules_for(q, self.kind), question=q.prompt or None)
        if extracted is None:
            return GradeResult(False, None, None, "no answer found")
        if extracted == UNCOMMITTED:
            return GradeResult(False, None, None, "the final sentence commits to no single number")
        value = to_exact(extracted)
        if value is None:     # a phrase: its opening number ("20 cups of feed, ..."), else its last one
            value = to_exact(leading_number(extracted) or last_number(extracted))
        if value is None:
            return GradeResult(False, extracted, None, "not a number")
        ok = numbers_equal(value, gold, float(q.metadata.get("rel_tol", 1e-9)), float(q.metadata.get("abs_tol", 1e-9)))
        return GradeResult(ok, extracted)


def _short(gold: Any) -> str:
    text = repr(gold)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} chars)"


register_grader("numeric")(NumericGrader)
