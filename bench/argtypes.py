"""Value types for the bench scripts' argparse options: a mistake (``--lr nan``, ``--lambdas abc``, ``--split
0.9,0.5``) is argparse's usage line and exit 2, never a traceback or a run on an empty split.

    >>> positive_float("3e-5"), float_list("0, 0.25,1"), fractions("0.6,0.2")
    (3e-05, [0.0, 0.25, 1.0], (0.6, 0.2))
    >>> fractions("0.9,0.5")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: '0.9,0.5': the fractions add up to 1.4; they must leave a test share (sum < 1)
"""

from __future__ import annotations

import argparse
import math


def finite_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return v


def positive_float(text: str) -> float:
    v = finite_float(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return v


def rate(text: str) -> float:
    """A probability in [0, 1]."""
    v = finite_float(text)
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a rate in [0, 1]")
    return v


def float_list(text: str) -> list[float]:
    """Comma-separated finite numbers, at least one."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated numbers")
    return [finite_float(p) for p in parts]


def fractions(text: str) -> tuple[float, float]:
    """``TRAIN,VALIDATION`` shares of a question set, each in (0, 1), leaving a test share (sum < 1)."""
    parts = float_list(text)
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"{text!r}: give two fractions, TRAIN,VALIDATION")
    if not all(0 < p < 1 for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: each fraction must be between 0 and 1")
    if sum(parts) >= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the fractions add up to {sum(parts):g}; they must leave a "
                                         "test share (sum < 1)")
    return parts[0], parts[1]
