"""Code answers, executed only inside the sandbox.

Two test styles: HumanEval (``tests`` is Python defining ``check(candidate)``,
called on ``entry_point``) and LiveCodeBench stdin/stdout (``tests`` is a list of
``{"input": ..., "output": ...}``; every case must print the expected output).
A run that times out, crashes or exceeds a limit is a wrong answer; a sandbox
that could not start is an infrastructure error.

Function-style items pass only when the trusted harness (``harness.py``) prints the run's secret
token after every test ran, never on an exit status alone: see that module for why and how.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from conductor.data.questions import Question
from conductor.extract.answer import code_block
from conductor.grading.base import GradeResult, as_question, register_grader
from conductor.sandbox import Limits, Sandbox, SandboxResult, default_sandbox


def solution_source(code: str, entry_point: str | None, prompt: str | None = None) -> str:
    """The program for a function-style item. The function prompt goes in front: a body-only
    completion continues it; a full solution follows it (so imports and helper functions the
    prompt defines, like ``List``, stay available).

    >>> print(solution_source("    return x\\n", "f", "def f(x):\\n"), end="")
    def f(x):
        return x
    """
    if prompt:
        if entry_point and not re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", code, re.M):
            return prompt + code                  # a body-only completion
        return f"{prompt.rstrip()}\n\n\n{code}"   # keeps the prompt's imports and helpers; the solution redefines
    return code


@lru_cache(maxsize=1)
def _harness_text() -> str:
    return Path(__file__).with_name("harness.py").read_text()


def harness_program(entry_point: str | None) -> str:
    """``main.py`` of a function-style run: the harness, told which function ``check`` receives."""
    return f"{_harness_text()}\n\nif __name__ == \"__main__\":\n    main({entry_point!r})\n"


def humaneval_program(code: str, tests: str, entry_point: str | None, prompt: str | None = None) -> str:
    """The whole item as one plain script (solution, tests, ``check(entry_point)``), for reading and
    for running by hand; grading runs it through the harness instead, which an exit cannot fool.

    >>> print(humaneval_program("def f(x):\\n    return x\\n", "def check(c):\\n    assert c(1) == 1\\n", "f"))
    def f(x):
        return x
    <BLANKLINE>
    <BLANKLINE>
    def check(c):
        assert c(1) == 1
    <BLANKLINE>
    <BLANKLINE>
    check(f)
    <BLANKLINE>
    """
    code = solution_source(code, entry_point, prompt)
    program = f"{code.rstrip()}\n\n\n{tests.rstrip()}\n"
    if entry_point:
        program += f"\n\ncheck({entry_point})\n"
    return program


def outputs_match(got: str, expected: str) -> bool:
    """Line-wise comparison ignoring trailing spaces and blank lines at the ends.

    >>> outputs_match("1 2 \\n3\\n\\n", "1 2\\n3"), outputs_match("1\\n", "2\\n")
    (True, False)
    """
    def norm(s: str) -> list[str]:
        return [ln.rstrip() for ln in s.strip().splitlines()]
    return norm(got) == norm(expected)


def _failure(result: SandboxResult) -> str:
    tail = result.stderr.strip().splitlines()[-1:] if result.stderr.strip() else []
    return f"{result.status}" + (f": {tail[0][:200]}" if tail else "")


def _check_case(n: int, case: Mapping[str, Any], result: SandboxResult, code: str) -> GradeResult | None:
    """The verdict if stdin/stdout case ``n`` settles the grade (a failure), else None."""
    if result.status == "infra":
        return GradeResult(False, code, f"sandbox: {result.detail}")
    if not result.ok:
        return GradeResult(False, code, None, f"test {n}: {_failure(result)}")
    if not outputs_match(result.stdout, str(case["output"])):
        return GradeResult(False, code, None, f"test {n}: wrong output")
    return None


class CodeGrader:
    kind = "code"

    def __init__(self, sandbox: Sandbox | None = None, limits: Limits | None = None) -> None:
        self._sandbox = sandbox
        self.limits = limits

    @property
    def sandbox(self) -> Sandbox:
        return self._sandbox or default_sandbox()

    def grade(self, question_or_gold: Question | str | Mapping[str, Any], response: str | None) -> GradeResult:
        q = as_question(question_or_gold, "code")
        code = code_block(response or "")
        if not code or not code.strip():
            return GradeResult(False, None, None, "no code found")
        tests = q.tests
        if isinstance(tests, str) and tests.strip():
            return self._function_tests(q, code, tests)
        if isinstance(tests, list) and tests:
            for n, case in enumerate(tests):
                if not isinstance(case, Mapping) or "input" not in case or "output" not in case:
                    return GradeResult(False, code, f"test {n}: expected {{'input', 'output'}}")
            # the first case alone (most wrong programs fail it), then the rest in parallel
            first = self.sandbox.run(code, stdin=str(tests[0]["input"]), limits=self.limits)
            verdict = _check_case(0, tests[0], first, code)
            if verdict is not None:
                return verdict
            rest = self.sandbox.run_many([(code, str(c["input"])) for c in tests[1:]], limits=self.limits)
            for n, (case, result) in enumerate(zip(tests[1:], rest), 1):
                verdict = _check_case(n, case, result, code)
                if verdict is not None:
                    return verdict
            return GradeResult(True, code)
        return GradeResult(False, code, "question has no tests")

    def _function_tests(self, q: Question, code: str, tests: str) -> GradeResult:
        """Right only if the harness printed this run's token, i.e. every test ran and passed."""
        token = secrets.token_hex(16)
        files = {"solution.py": solution_source(code, q.entry_point, q.metadata.get("function_prompt")),
                 "tests.py": tests, "token": token}
        result = self.sandbox.run(harness_program(q.entry_point), files=files, limits=self.limits)
        if result.status == "infra":
            return GradeResult(False, code, f"sandbox: {result.detail}")
        passed = token in result.stdout
        return GradeResult(passed, code, None, None if passed else _failure(result))


register_grader("code")(CodeGrader)
