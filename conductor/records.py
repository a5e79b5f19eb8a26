"""A record copied with some fields changed, cheaply: the hot paths' ``dataclasses.replace``.

``dataclasses.replace`` re-runs ``__init__`` over every field (a Python loop over the fields, then the
initialiser); ``replaced`` copies the instance dict in C and sets the changed fields. It is for records whose
``__post_init__`` (if any) a changed field does not need to re-run: conductor/serve/lake.py's stored copies of a
trajectory, and conductor/serve/engine.py's per-request ``RunSpec`` (whose ``__post_init__`` only parses
``fewshot``, which a request never changes). Frozen dataclasses too: the copy's dict is written directly.
"""

from __future__ import annotations

import copy
from typing import Any, TypeVar

_T = TypeVar("_T")


def replaced(obj: _T, **changes: Any) -> _T:
    """A shallow copy of ``obj`` with ``changes``; ``obj`` is untouched.

    >>> from dataclasses import dataclass, replace
    >>> @dataclass(frozen=True)
    ... class R:
    ...     a: int
    ...     b: str = "x"
    >>> r = R(1)
    >>> replaced(r, b="y"), r, replaced(r, b="y") == replace(r, b="y")
    (R(a=1, b='y'), R(a=1, b='x'), True)
    """
    out = copy.copy(obj)
    vars(out).update(changes)
    return out
