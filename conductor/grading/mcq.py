"""Multiple choice: the response names a letter, an index-like letter, or the option's text."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conductor.data.datasets import DatasetError, gold_letter
from conductor.data.questions import LETTERS, Question
from conductor.extract.answer import choice_letter, extract
from conductor.grading.base import GradeResult, as_question, register_grader, rules_for


class MCQGrader:
    """Gold may be a letter, a 0-based index or the option text (with ``choices``)."""

    kind = "mcq"

    def grade(self, question_or_gold: Question | str | Mapping[str, Any], response: str | None) -> GradeResult:
        q = as_question(question_or_gold, "mcq")
        choices = q.choices
        n = len(choices) if choices else 26
        raw = q.gold.strip() if q.gold is not None else None
        if raw is not None and len(raw) > 12 and raw.lstrip("-").isdigit():   # no option index is this long
            return GradeResult(False, None, f"gold: answer of {len(raw)} digits is not one of {n} options")
        try:
            gold = gold_letter(raw if raw is None or not raw.lstrip("-").isdigit() else int(raw),
                               choices or list(LETTERS[:n]), "gold")
        except DatasetError as exc:
            return GradeResult(False, None, str(exc))
        if not response:
            return GradeResult(False, None, None, "empty response")
        extracted = extract(response, rules_for(q, self.kind))
        if extracted is None:
            lines = [ln for ln in response.strip().splitlines() if ln.strip()]
            extracted = lines[-1].strip() if lines else None
        letter = choice_letter(extracted, n, choices) if extracted else None
        if letter is None:
            return GradeResult(False, extracted, None, "no option found")
        return GradeResult(letter == gold, letter)


register_grader("mcq")(MCQGrader)
