"""Numbers as models write them: ``$1,200``, ``25%``, ``18 dollars``, ``\\frac{3}{4}``, ``x = 5``."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from conductor.extract import extract, last_number
from conductor.grading.base import GradeResult, as_question, register_grader, rules_for
from conductor.questions import Question

_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox|textrm)\s*\{([^{}]*)\}")
_FRAC_RE = re.compile(r"^(-?)\\[dt]?frac\s*\{\s*(-?[\d.]+)\s*\}\s*\{\s*(-?[\d.]+)\s*\}$")
_FRAC_SHORT_RE = re.compile(r"^(-?)\\[dt]?frac(\d)(\d)$")
_THOUSANDS_RE = re.compile(r"(?<!\d)(\d{1,3}(?:,\d{3})+)(?![\d,])")
_NUM_THEN_WORDS = re.compile(r"^(-?(?:\d+\.?\d*|\.\d+)(?:/\d+)?)\s*(?:[a-zA-Z°](?:[a-zA-Z°. /-]|\^\d)*)?$")


def to_number(text: Any, units: bool = True) -> float | None:
    """A float from a numeric answer, or None when it is not a plain number. With
    ``units=False`` only ``\\text{..}`` units may follow the number (so ``5x`` is not 5).

    >>> [to_number(s) for s in ["$1,200", "25\\\\%", "18 dollars", "\\\\frac{3}{4}", "x = -5", "3/4", "1,2"]]
    [1200.0, 25.0, 18.0, 0.75, -5.0, 0.75, None]
    >>> to_number("18 or 19") is None, to_number("3 m/s^2"), to_number("12 km^2")
    (True, 3.0, 12.0)
    >>> to_number("\\\\sqrt{2}") is None, to_number("5x", units=False) is None, to_number("5\\\\text{ cm}", units=False)
    (True, True, 5.0)
    """
    if text is None:
        return None
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    t = str(text).strip()
    t = _TEXT_RE.sub(lambda m: " " + m.group(1) + " " if units or not re.fullmatch(r"[\sa-zA-Z.]*", m.group(1))
                     else " ", t)
    for junk in ("\\$", "$", "\\%", "%", "\\!", "\\,", "\\;", "{,}", "\\left", "\\right", "^\\circ", "^{\\circ}", "°"):
        t = t.replace(junk, "")
    t = t.replace("−", "-").replace("–", "-").strip()
    t = re.sub(r"^[a-zA-Z]\w*\s*=\s*", "", t)
    t = _THOUSANDS_RE.sub(lambda m: m.group(1).replace(",", ""), t)
    t = t.strip().rstrip(".").strip()
    if t.startswith("{") and t.endswith("}"):
        t = t[1:-1].strip()
    m = _FRAC_RE.match(t) or _FRAC_SHORT_RE.match(t)
    if m:
        try:
            value = float(m.group(2)) / float(m.group(3))
        except (ValueError, ZeroDivisionError):
            return None
        return -value if m.group(1) else value
    m = _NUM_THEN_WORDS.match(t) if units else re.match(r"^(-?(?:\d+\.?\d*|\.\d+)(?:/\d+)?)$", t)
    if not m:
        return None
    num = m.group(1)
    try:
        if "/" in num:
            a, b = num.split("/")
            return float(a) / float(b)
        value = float(num)
    except (ValueError, ZeroDivisionError):
        return None
    return value if math.isfinite(value) else None


def numbers_equal(a: float, b: float, rel_tol: float = 1e-9, abs_tol: float = 1e-9) -> bool:
    """Relative-or-absolute tolerance; two whole numbers must match exactly.

    >>> numbers_equal(18.0, 18.0000000001), numbers_equal(18, 19), numbers_equal(2880000, 2880001)
    (True, False, False)
    """
    if float(a).is_integer() and float(b).is_integer():
        return a == b
    return math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)


class NumericGrader:
    """Numeric match with tolerance (GSM8K, AIME); tolerances from question metadata."""

    kind = "numeric"

    def grade(self, question_or_gold: "Question | str | Mapping[str, Any]", response: str | None) -> GradeResult:
        q = as_question(question_or_gold, "math")
        gold = to_number(q.gold)
        if gold is None:
            return GradeResult(False, None, f"gold {q.gold!r} is not a number")
        extracted = extract(response, rules_for(q, self.kind))
        if extracted is None:
            return GradeResult(False, None, None, "no answer found")
        value = to_number(extracted)
        if value is None:
            fallback = last_number(extracted)
            value = to_number(fallback)
        if value is None:
            return GradeResult(False, extracted, None, "not a number")
        ok = numbers_equal(value, gold, float(q.metadata.get("rel_tol", 1e-9)), float(q.metadata.get("abs_tol", 1e-9)))
        return GradeResult(ok, extracted)


register_grader("numeric")(NumericGrader)
