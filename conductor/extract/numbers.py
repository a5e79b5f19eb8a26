"""Numbers as models write them: ``$1,200``, ``25%``, ``18 dollars``, ``\\frac{3}{4}``, ``x = 5``, ``1e308``.

Values are parsed exactly (``Fraction``), so a gold of 5,000 nines or ``1e308`` compares like any
other number: no float overflow, no rounding of big integers. Used by the numeric and math graders
(``conductor/grading/``) and the ``vote`` tool worker alike.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox|textrm)\s*\{([^{}]*)\}")
_FRAC_RE = re.compile(r"^(-?)\\[dt]?frac\s*\{\s*(-?[\d.]+)\s*\}\s*\{\s*(-?[\d.]+)\s*\}$")
_FRAC_SHORT_RE = re.compile(r"^(-?)\\[dt]?frac(\d)(\d)$")
_THOUSANDS_RE = re.compile(r"(?<!\d)(\d{1,3}(?:,\d{3})+)(?![\d,])")
# unambiguous (not \d+\.?\d*): a regex that fails after it must not retry every split of a long numeral
_NUM = r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_NUM_THEN_WORDS = re.compile(rf"^({_NUM}(?:/\d+)?)\s*(?:[a-zA-Z°](?:[a-zA-Z°. /-]|\^\d)*)?$")
_NUM_ONLY = re.compile(rf"^({_NUM}(?:/\d+)?)$")
_SCI_RE = re.compile(rf"^({_NUM})\s*(?:\\times|\\cdot|×|\*)\s*10\s*\^\s*\{{?\s*([+-]?\d+)\s*\}}?$")
_DECIMAL_RE = re.compile(r"(-?)(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d{1,9}))?")
# a number that opens a phrase: "20 cups of mixed chicken feed, ..." -> 20
_LEADING_RE = re.compile(r"\s*(?:\\?\$\s*)?(-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)(?:\s*\\?%)?\s+[a-zA-Z]")
MAX_DIGITS = 100_000      # longer numerals are not read as numbers
MAX_EXPONENT = 10_000     # |e| in 1e<e>; 10**10000 is still cheap to compare exactly


def _big_int(digits: str) -> int:
    """``int(digits)`` without Python's 4,300-digit conversion limit (chunked)."""
    if len(digits) <= 4000:
        return int(digits)
    value = 0
    for i in range(0, len(digits), 4000):
        chunk = digits[i:i + 4000]
        value = value * 10 ** len(chunk) + int(chunk)
    return value


def _decimal(num: str) -> Fraction | None:
    """Exact value of ``-12.5``, ``.5``, ``3.``, ``1e308``, ``2.5E-3`` (None past the size caps)."""
    m = _DECIMAL_RE.fullmatch(num.strip())
    if not m:
        return None
    sign, whole, frac, exp = m.groups()
    digits = (whole or "") + (frac or "")
    if not digits or len(digits) > MAX_DIGITS:
        return None
    e = int(exp or 0)
    if abs(e) > MAX_EXPONENT:
        return None
    e -= len(frac or "")
    n = _big_int(digits)
    value = Fraction(n * 10 ** e) if e >= 0 else Fraction(n, 10 ** -e)
    return -value if sign else value


def _ratio(num: str) -> Fraction | None:
    if "/" not in num:
        return _decimal(num)
    a, b = (_decimal(p) for p in num.split("/", 1))
    if a is None or not b:
        return None
    return a / b


def to_exact(text: Any, units: bool = True) -> Fraction | None:
    """The exact value of a numeric answer, or None when it is not a plain number. With
    ``units=False`` only ``\\text{..}`` units may follow the number (so ``5x`` is not 5).

    >>> [to_exact(s) for s in ["1e308", "9" * 30, "\\\\frac{3}{4}", "1.5 \\\\times 10^{3}", "x"]] == [
    ...     Fraction(10) ** 308, Fraction(10 ** 30 - 1), Fraction(3, 4), Fraction(1500), None]
    True
    """
    if text is None or isinstance(text, bool):
        return None
    if isinstance(text, (int, Fraction)):
        return Fraction(text)
    if isinstance(text, float):
        return Fraction(text) if math.isfinite(text) else None
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
        value = _ratio(f"{m.group(2)}/{m.group(3)}")
        return None if value is None else -value if m.group(1) else value
    m = _SCI_RE.match(t)
    if m:
        mantissa, power = _decimal(m.group(1)), int(m.group(2))
        if mantissa is None or abs(power) > MAX_EXPONENT:
            return None
        return mantissa * Fraction(10) ** power
    m = _NUM_THEN_WORDS.match(t) if units else _NUM_ONLY.match(t)
    return _ratio(m.group(1)) if m else None


def to_number(text: Any, units: bool = True) -> float | None:
    """``to_exact`` as a float (None when it is not a number or does not fit a float).

    >>> [to_number(s) for s in ["$1,200", "25\\\\%", "18 dollars", "\\\\frac{3}{4}", "x = -5", "3/4", "1,2"]]
    [1200.0, 25.0, 18.0, 0.75, -5.0, 0.75, None]
    >>> to_number("18 or 19") is None, to_number("3 m/s^2"), to_number("12 km^2"), to_number("1e308")
    (True, 3.0, 12.0, 1e+308)
    >>> to_number("\\\\sqrt{2}") is None, to_number("5x", units=False) is None, to_number("5\\\\text{ cm}", units=False)
    (True, True, 5.0)
    """
    value = to_exact(text, units)
    if value is None:
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def leading_number(text: str) -> str | None:
    """The number that opens a phrase ("20 cups of feed, 4 per hen" -> "20"), commas removed.

    >>> leading_number("20 cups of mixed chicken feed, which is 3 cups per chicken"), leading_number("x = 5")
    ('20', None)
    """
    m = _LEADING_RE.match(text)
    return m.group(1).replace(",", "") if m else None


def numbers_equal(a: float | Fraction, b: float | Fraction, rel_tol: float = 1e-9, abs_tol: float = 1e-9) -> bool:
    """Relative-or-absolute tolerance, computed exactly; two whole numbers must match exactly.

    >>> numbers_equal(18.0, 18.0000000001), numbers_equal(18, 19), numbers_equal(2880000, 2880001)
    (True, False, False)
    >>> numbers_equal(Fraction(10 ** 5000 - 1), Fraction(10 ** 5000 - 1)), numbers_equal(10 ** 400, 10 ** 400 + 1)
    (True, False)
    """
    x, y = to_exact(a), to_exact(b)
    if x is None or y is None:            # inf or nan
        return False
    if x.denominator == 1 and y.denominator == 1:
        return x == y
    return abs(x - y) <= max(Fraction(rel_tol) * max(abs(x), abs(y)), Fraction(abs_tol))
