"""The grader extension point: given a gold record and a response, say right or wrong.

A grader has one method, ``grade(question_or_gold, response) -> GradeResult``, and is
registered by kind ("math", "numeric", "mcq", "code", "exact"). ``error`` is set only
when grading itself could not run (a timeout in math-verify, a sandbox that failed to
start): such a result is an infrastructure failure, not a wrong answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from conductor.data.questions import Question


@dataclass(frozen=True)
class GradeResult:
    correct: bool
    extracted: str | None
    error: str | None = None          # grading could not run: an infrastructure failure
    detail: str | None = None         # why it is wrong (e.g. "timeout", "AssertionError"); not an error

    def to_json(self) -> dict[str, Any]:
        return {"correct": self.correct, "extracted": self.extracted, "error": self.error}


class Grader(Protocol):
    def grade(self, question_or_gold: Question | str | Mapping[str, Any], response: str | None) -> GradeResult: ...


GRADERS: dict[str, Grader] = {}
_FACTORIES: dict[str, Callable[[], Grader]] = {}


def register_grader(kind: str) -> Callable[[Callable[[], Grader]], Callable[[], Grader]]:
    """Decorator over a zero-argument factory; the grader is built on first use."""

    def deco(factory: Callable[[], Grader]) -> Callable[[], Grader]:
        _FACTORIES[kind] = factory
        GRADERS.pop(kind, None)
        return factory

    return deco


def get_grader(kind: str) -> Grader:
    if kind not in GRADERS:
        if kind not in _FACTORIES:
            raise KeyError(f"unknown grader kind {kind!r}; known: {', '.join(sorted(_FACTORIES))}")
        GRADERS[kind] = _FACTORIES[kind]()
    return GRADERS[kind]


def grader_kinds() -> list[str]:
    return sorted(_FACTORIES)


_DOMAIN_KIND = {"math": "math", "mcq": "mcq", "code": "code", "free": "exact"}


def kind_of(question: Question) -> str:
    """The grader kind for a question: ``metadata["grader"]`` or its domain's default.

    >>> kind_of(Question(id="x/t/0", dataset="x", domain="mcq", prompt="?"))
    'mcq'
    """
    return str(question.metadata.get("grader") or _DOMAIN_KIND[question.domain])


def as_question(obj: Question | str | int | float | Mapping[str, Any], domain: str = "free") -> Question:
    """Wrap a bare gold value or a ``{"gold", "tests", "entry_point", "choices"}`` mapping
    as a Question so every grader takes one shape.

    >>> as_question("42", "math").gold
    '42'
    """
    if isinstance(obj, Question):
        return obj
    if isinstance(obj, Mapping):
        gold = obj.get("gold", obj.get("answer"))
        meta: dict[str, Any] = {}
        if obj.get("choices") is not None:
            meta["choices"] = [str(c) for c in obj["choices"]]
        if obj.get("extract") is not None:
            meta["extract"] = list(obj["extract"])
        return Question(id=str(obj.get("id") or "inline"), dataset="inline", domain=domain,  # type: ignore[arg-type]
                        prompt="", gold=None if gold is None else gold_text(gold), tests=obj.get("tests"),
                        entry_point=obj.get("entry_point"), metadata=meta)
    return Question(id="inline", dataset="inline", domain=domain, prompt="", gold=gold_text(obj))  # type: ignore[arg-type]


def gold_text(value: Any) -> str:
    """``str(value)``, also for integers past Python's 4,300-digit conversion limit.

    >>> len(gold_text(10 ** 5000 - 1)), gold_text(-12)
    (5000, '-12')
    """
    if not isinstance(value, int) or isinstance(value, bool):
        return str(value)
    try:
        return str(value)
    except ValueError:
        sign, n, chunks = "-" if value < 0 else "", abs(value), []
        while n:
            n, low = divmod(n, 10 ** 4000)
            chunks.append(low)
        return sign + str(chunks[-1]) + "".join(f"{c:04000d}" for c in reversed(chunks[:-1]))


def rules_for(question: Question, kind: str) -> Sequence[str]:
    from conductor.extract.answer import DEFAULT_RULES

    return tuple(question.metadata.get("extract") or DEFAULT_RULES.get(kind, DEFAULT_RULES["free"]))
