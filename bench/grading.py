"""Grading throughput on this machine: 1,000 math answers (MATH-500 + GSM8K, half right, half
wrong, in the forms models write) and the 164 HumanEval canonical solutions run in the sandbox.

    python bench/grading.py            # last line: math_per_s=<x> code_per_s=<y>

``--prose`` measures instead how well the numeric grader reads frontier prose replies (issue #47), before and
after the final-sentence rule, side by side in one run ("before" is the same grader with the rules it had:
``tag, boxed, final_line, last_number``): agreement, precision and recall against the 160 hand labels of
``tests/data/gsm8k_prose_replies.jsonl`` and the 48 held-out ones beside it, and each model's accuracy on all
1,319 RouteLLM GSM8K replies.

    python bench/grading.py --prose    # last line: agreement_before=.. agreement_after=.. precision_before=.. ...
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from conductor.data.datasets import load_dataset
from conductor.data.questions import Question, with_instruction
from conductor.grading import get_grader, grade_many
from conductor.grading.code import CodeGrader
from conductor.grading.mathverify import default_pool
from conductor.resources import shared_data_dir
from conductor.sandbox import default_sandbox

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "data" / "gsm8k_prose_replies.jsonl"
HELD_OUT = CORPUS.with_name("gsm8k_prose_replies_heldout.jsonl")


def _wrong(gold: str) -> str:
    m = re.search(r"\d", gold)
    return gold + "+1" if not m else gold[:m.start()] + str((int(m.group()) + 1) % 10) + gold[m.end():]


def math_items(n: int = 1000):
    qs = load_dataset("math500") + load_dataset("gsm8k_test", limit=n - 500)
    forms = ["The answer is $\\boxed{{{}}}$.", "<answer>{}</answer>", "Final answer: {}"]
    responses = [forms[i % 3].format(q.gold if i % 2 == 0 else _wrong(q.gold)) for i, q in enumerate(qs[:n])]
    return qs[:n], responses


OLD_RULES = ("tag", "boxed", "final_line", "last_number")     # the numeric grader's rules before #47
MODELS = {"gpt4": "gpt-4-1106-preview", "mixtral": "mistralai/Mixtral-8x7B-Instruct-v0.1"}


def _gsm8k_question(text: str, gold: str, rules: tuple[str, ...] | None) -> Question:
    meta: dict = {"grader": "numeric", **({"extract": list(rules)} if rules else {})}
    return Question(id="gsm8k/test/x", dataset="gsm8k_test", domain="math", prompt=with_instruction(text, "math"),
                    gold=gold, metadata=meta)


def _scores(verdicts: list[bool], labels: list[bool]) -> dict[str, float]:
    tp = sum(v and lab for v, lab in zip(verdicts, labels))
    fp = sum(v and not lab for v, lab in zip(verdicts, labels))
    fn = sum(lab and not v for v, lab in zip(verdicts, labels))
    return {"agreement": sum(v == lab for v, lab in zip(verdicts, labels)) / len(labels),
            "precision": tp / (tp + fp) if tp + fp else 1.0, "recall": tp / (tp + fn) if tp + fn else 1.0,
            "false_positive_rate": fp / len(labels)}


def prose() -> None:
    """Issue #47: the hand-labelled corpus, then every RouteLLM GSM8K reply, with the old and the new rules."""
    grader = get_grader("numeric")
    out: dict[str, float] = {}
    for name, path in (("", CORPUS), ("heldout_", HELD_OUT)):
        corpus = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        labels = [bool(r["label"]) for r in corpus]
        for when, rules in (("before", OLD_RULES), ("after", None)):
            verdicts = [grader.grade(_gsm8k_question(r["question"], r["gold"], rules), r["reply"]).correct
                        for r in corpus]
            scores = _scores(verdicts, labels)
            out.update({f"{name}{key}_{when}": value for key, value in scores.items()})
            print(f"{path.name} ({len(corpus)} hand-labelled replies), {when}: " +
                  " ".join(f"{k}={v:.4f}" for k, v in scores.items()))
    csv.field_size_limit(1 << 30)
    gold = {}
    for line in (shared_data_dir() / "gsm8k_test.jsonl").read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        gold[d["question"].strip()] = d["answer"].rsplit("####", 1)[1].strip().replace(",", "")
    with open(shared_data_dir() / "routellm" / "gsm8k_responses.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    for name, col in MODELS.items():
        routellm = sum(r[col] == "True" for r in rows) / len(rows)
        for when, rules in (("before", OLD_RULES), ("after", None)):
            right = sum(grader.grade(_gsm8k_question(r["prompt"], gold[r["prompt"].strip()], rules),
                                     r[f"{col}_response"]).correct for r in rows)
            out[f"{name}_accuracy_{when}"] = right / len(rows)
        print(f"{col} on all {len(rows)} GSM8K replies: before {out[f'{name}_accuracy_before']:.4f}, "
              f"after {out[f'{name}_accuracy_after']:.4f}, RouteLLM's own True/False {routellm:.4f}")
    keys = ["agreement", "false_positive_rate", "precision", "recall", "heldout_agreement", "heldout_false_positive_rate"]
    print(" ".join(f"{k}_{w}={out[f'{k}_{w}']:.4f}" for k in keys for w in ("before", "after")) + " " +
          " ".join(f"{m}_accuracy_{w}={out[f'{m}_accuracy_{w}']:.4f}" for m in MODELS for w in ("before", "after")))


def main() -> None:
    if "--prose" in sys.argv[1:]:
        prose()
        return
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
