"""Mathematical equivalence: cheap exact checks first, math-verify for the rest.

Most answers settle on the fast path (same number, same normalised string); only
the others go to math-verify, which runs in worker processes under a deadline
(see ``mathverify``), so a pathological expression costs a timeout, not a hang.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from conductor.data.questions import Question
from conductor.extract.answer import extract
from conductor.extract.numbers import numbers_equal, to_exact
from conductor.grading.base import GradeResult, as_question, register_grader, rules_for
from conductor.grading.mathverify import MathVerifyPool, default_pool

_STRIP_RE = re.compile(r"\\left|\\right|\\!|\\,|\\;|\\ |\s|\$|\\displaystyle|\^\{?\\circ\}?|\.$")


def normalize_latex(s: str) -> str:
    """Cosmetic normalisation for an exact-string fast path.

    >>> normalize_latex(r"\\left( 3, \\dfrac{\\pi}{2} \\right)")
    '(3,\\\\frac{\\\\pi}{2})'
    >>> normalize_latex(r"\\text{Evelyn}")
    'evelyn'
    """
    t = s.strip()
    t = re.sub(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}", r"\1", t)
    t = t.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    t = _STRIP_RE.sub("", t)
    return t.lower() if re.fullmatch(r"[A-Za-z ]+", t) else t


def quick_verdict(gold: str, pred: str) -> bool | None:
    """True/False when settled without math-verify, None when it needs it.

    >>> quick_verdict("18", "18.0"), quick_verdict("18", "19"), quick_verdict(r"\\frac{1}{2}", "0.5")
    (True, False, True)
    >>> quick_verdict(r"\\sqrt{2}", r"2^{1/2}") is None, quick_verdict("3i", "3") is None
    (True, True)
    """
    a, b = to_exact(gold, units=False), to_exact(pred, units=False)
    if a is not None and b is not None:
        return numbers_equal(a, b)
    if normalize_latex(gold) == normalize_latex(pred):
        return True
    return None


class MathGrader:
    """math-verify equivalence (MATH-500 style LaTeX answers)."""

    kind = "math"

    def __init__(self, pool: MathVerifyPool | None = None, timeout: float = 5.0) -> None:
        self._pool = pool
        self.timeout = timeout

    @property
    def pool(self) -> MathVerifyPool:
        return self._pool or default_pool()

    def grade(self, question_or_gold: Question | str | Mapping[str, Any], response: str | None) -> GradeResult:
        return self.grade_many([question_or_gold], [response])[0]

    def grade_many(self, golds: Sequence[Question | str | Mapping[str, Any]],
                   responses: Sequence[str | None]) -> list[GradeResult]:
        """Batch form: fast paths inline, the rest through the math-verify pool in parallel."""
        out: list[GradeResult | None] = [None] * len(golds)
        pending: list[tuple[int, str, str]] = []
        for i, (g, r) in enumerate(zip(golds, responses, strict=True)):
            q = as_question(g, "math")
            if q.gold is None or not str(q.gold).strip():
                out[i] = GradeResult(False, None, "question has no gold answer")
                continue
            extracted = extract(r, rules_for(q, self.kind))
            if extracted is None:
                out[i] = GradeResult(False, None, None, "no answer found")
                continue
            quick = quick_verdict(q.gold, extracted)
            if quick is not None:
                out[i] = GradeResult(quick, extracted)
            else:
                pending.append((i, q.gold, extracted))
        if pending:
            verdicts = self.pool.check_many([(g, p) for _, g, p in pending], self.timeout)
            for (i, _, extracted), (equal, err) in zip(pending, verdicts):
                if equal is None:
                    out[i] = GradeResult(False, extracted, err or "math-verify failed")
                else:
                    out[i] = GradeResult(bool(equal), extracted, None, None if equal else err)
        return [o for o in out if o is not None]


class ExactGrader:
    """Free-form answers: case- and space-insensitive string match after extraction."""

    kind = "exact"

    def grade(self, question_or_gold: Question | str | Mapping[str, Any], response: str | None) -> GradeResult:
        q = as_question(question_or_gold, "free")
        if q.gold is None:
            return GradeResult(False, None, "question has no gold answer")
        extracted = extract(response, rules_for(q, self.kind))
        if extracted is None:
            return GradeResult(False, None, None, "no answer found")
        same = " ".join(extracted.lower().split()).strip(". ") == " ".join(q.gold.lower().split()).strip(". ")
        return GradeResult(same or quick_verdict(q.gold, extracted) is True, extracted)


register_grader("math")(MathGrader)
register_grader("exact")(ExactGrader)
