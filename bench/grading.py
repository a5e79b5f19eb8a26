"""Grading throughput on this machine: 1,000 math answers (MATH-500 + GSM8K, half right, half
wrong, in the forms models write) and the 164 HumanEval canonical solutions run in the sandbox.

    python bench/grading.py            # last line: math_per_s=<x> code_per_s=<y>
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from conductor.data.datasets import load_dataset  # noqa: E402
from conductor.execution.sandbox import default_sandbox  # noqa: E402
from conductor.grading import grade_many  # noqa: E402
from conductor.grading.code import CodeGrader  # noqa: E402
from conductor.grading.mathverify import default_pool  # noqa: E402


def _wrong(gold: str) -> str:
    m = re.search(r"\d", gold)
    return gold + "+1" if not m else gold[:m.start()] + str((int(m.group()) + 1) % 10) + gold[m.end():]


def math_items(n: int = 1000):
    qs = load_dataset("math500") + load_dataset("gsm8k_test", limit=n - 500)
    forms = ["The answer is $\\boxed{{{}}}$.", "<answer>{}</answer>", "Final answer: {}"]
    responses = [forms[i % 3].format(q.gold if i % 2 == 0 else _wrong(q.gold)) for i, q in enumerate(qs[:n])]
    return qs[:n], responses


def main() -> None:
    qs, responses = math_items()
    default_pool().check_many([("1", "1")] * (os.cpu_count() or 1))   # start the math-verify workers (not timed)
    t = time.perf_counter()
    results = grade_many(qs, responses)
    math_s = time.perf_counter() - t
    right = sum(r.correct for r in results)
    assert right == sum(1 for i in range(len(qs)) if i % 2 == 0), "misgraded math answers"
    print(f"math: {len(qs)} answers in {math_s:.2f}s ({right} right, "
          f"{sum(r.error is not None for r in results)} errors)")
    # side by side: the same pairs sent straight to math-verify, without the fast paths
    pairs = [(q.gold, r.extracted or "") for q, r in zip(qs, results)]
    t = time.perf_counter()
    default_pool().check_many(pairs)
    mv_s = time.perf_counter() - t
    print(f"math: same {len(pairs)} pairs through math-verify only: {mv_s:.2f}s "
          f"(fast paths make grading {mv_s / math_s:.1f}x faster)")

    he = load_dataset("humaneval")
    responses = [f"```python\n{q.metadata['function_prompt']}{q.metadata['canonical_solution']}```" for q in he]
    grader = CodeGrader()
    sandbox = default_sandbox()
    t = time.perf_counter()
    with ThreadPoolExecutor(max_workers=sandbox.max_parallel * 2) as ex:
        code_results = list(ex.map(lambda p: grader.grade(*p), zip(he, responses)))
    code_s = time.perf_counter() - t
    passed = sum(r.correct for r in code_results)
    print(f"code: {len(he)} HumanEval solutions in {code_s:.2f}s ({passed} passed), isolation={sandbox.isolation}, "
          f"max_parallel={sandbox.max_parallel}, cores={os.cpu_count()}")
    # side by side: the sandbox's start-up cost against a bare interpreter start (a constant no-op program)
    n = 20
    t = time.perf_counter()
    for _ in range(n):
        subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], check=True)
    bare = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for _ in range(n):
        assert sandbox.run("pass").ok
    boxed = (time.perf_counter() - t) / n
    print(f"start-up: sandbox {boxed * 1000:.0f} ms vs bare python -I -S {bare * 1000:.0f} ms ({boxed / bare:.1f}x)")
    print(f"math_per_s={len(qs) / math_s:.1f} code_per_s={len(he) / code_s:.1f}")


if __name__ == "__main__":
    main()
