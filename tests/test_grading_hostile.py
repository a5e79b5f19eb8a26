"""Adversarial inputs to the reward path (issue #17 items 3, 4, 7, 8, issue #12's extraction defects, issue #39 items 9, 16, 18):
degenerate replies, huge golds, hedged choices, rigged code, and `conductor grade` under signals.

Each test here failed on the code before the fix: exiting early passed code tests, extraction was
quadratic, huge or scientific golds could not be read, and markdown-wrapped choices were missed. The
sandbox's containment tests, run as root and as a normal user, live in tests/test_sandbox.py.
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conductor.data.questions import Question
from conductor.extract.answer import MAX_CHARS, answer_tag, extract
from conductor.grading import get_grader
from conductor.grading.code import CodeGrader
from conductor.grading.reward import score_trajectory
from conductor.sandbox import Limits, Sandbox
from conductor.trajectory import Round, Trajectory
from tests.cli_checks import one_error, run

CPU_BUDGET_S = 20   # CPU seconds (not wall time: a loaded machine does not change it); the fixed code needs < 1


def _under_cpu_budget(snippet: str) -> str:
    """Run ``snippet`` in a fresh interpreter that the kernel kills after CPU_BUDGET_S CPU seconds
    (SIGXCPU); return its stdout. The quadratic extraction took minutes on these inputs."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (CPU_BUDGET_S, CPU_BUDGET_S + 1))

    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(snippet)], preexec_fn=limit, capture_output=True,
                          text=True, timeout=CPU_BUDGET_S * 30)
    assert proc.returncode == 0, f"killed or failed (rc {proc.returncode}; -24 is SIGXCPU): {proc.stderr[-500:]}"
    return proc.stdout.strip()


@pytest.mark.parametrize("name,build,call,want", [
    ("100,000 <answer> tags", "'<answer>' * 100_000 + '<answer>42</answer>'", "extract(t)", "'42'"),
    ("10,000 nested boxes", "'\\\\boxed{' * 10_000 + '7' + '}' * 10_000", "boxed(t)", "'7'"),
    ("160 KB of blanks inside the final line", "'Final answer: 12' + ' ' * 160_000 + 'x'", "extract(t)", "'12'"),   # not 160 KB
    ("150,000 code fences without a newline", "'```' * 150_000", "code_block(t)", "200000 chars: '`````````'"),
    ("'The answer' then 100,000 blanks", "'The answer' + ' ' * 100_000 + '?'", "choice_letter(t, 4)", "None"),
])
def test_degenerate_replies_are_extracted_in_linear_time(name, build, call, want):
    out = _under_cpu_budget(f"""
        from conductor.extract.answer import boxed, choice_letter, code_block, extract
        t = {build}
        r = {call}
        print(repr(r) if r is None or len(r) < 20 else str(len(r)) + " chars: " + repr(r[:9]))
    """)
    assert out == want, name


def test_a_100000_digit_answer_is_read_in_linear_time():
    out = _under_cpu_budget("""
        from conductor.grading import get_grader
        g = get_grader("numeric")
        print(g.grade("7", "<answer>" + "9" * 100_000 + "!?</answer>").correct, g.grade("9" * 100_000, "9" * 100_000).correct)
    """)
    assert out == "False True"


def test_the_final_sentence_rule_is_linear():
    """Issue #47's sentence rule on a 100,000-digit numeral, 50,000 openers, a 40,000-way hedge and 60,000 commas."""
    out = _under_cpu_budget("""
        from conductor.extract.answer import final_sentence
        from conductor.grading import get_grader
        g = get_grader("numeric")
        texts = ["9" * 100_000, "So, " * 50_000 + "5 cows.", "1 or 2 or " * 40_000, "a, " * 60_000 + "2 apples.",
                 "x is " * 50_000 + "4", "<<" * 50_000 + "1"]
        print(",".join(str(final_sentence(t, t[:1000]))[:3] for t in texts), g.grade("5", "So, " * 50_000 + "5").correct)
    """)
    assert out == "999,5,[no,2,4,1 True"


def test_extraction_reads_only_the_tail_of_a_huge_reply():
    reply = "<answer>1</answer>" + "x" * (MAX_CHARS + 10) + "<answer>2</answer>"
    assert extract(reply) == "2"
    assert answer_tag("<answer>" + "y" * (MAX_CHARS + 10) + "</answer>") is None   # its opening tag is cut off


def test_extraction_deadline_stops_trying_rules():
    assert extract("no tag but the number 5", ("tag", "last_number")) == "5"
    assert extract("no tag but the number 5", ("tag", "last_number"), deadline_s=-1.0) is None


NINES = "9" * 5000


@pytest.mark.parametrize("kind", ["numeric", "math"])
def test_a_gold_of_5000_nines_is_graded_not_crashed(kind):
    grader = get_grader(kind)
    right = grader.grade(NINES, f"<answer>{NINES}</answer>")
    wrong = grader.grade(NINES, f"<answer>{NINES[:-1]}8</answer>")
    assert (right.correct, right.error) == (True, None)
    assert (wrong.correct, wrong.error) == (False, None)
    as_int = grader.grade({"gold": 10 ** 5000 - 1}, f"The answer is {NINES}.")
    assert (as_int.correct, as_int.error) == (True, None)


def test_a_huge_gold_is_an_error_not_a_crash_for_multiple_choice():
    res = get_grader("mcq").grade({"gold": NINES, "choices": ["a", "b"]}, "<answer>A</answer>")
    assert res.correct is False and "not one of 2 options" in (res.error or "")


def test_a_huge_gold_through_the_reward_gives_a_reward():
    q = Question(id="big/0", dataset="big", domain="math", prompt="?", gold=NINES, metadata={"grader": "numeric"})
    t = Trajectory(trajectory_id="t", run_id="r", kind="rollout", question_id=q.id, dataset="big", domain="math",
                   question="?", rounds=[Round(depth=0, prompt="p", completion="c", parse_status="ok")],
                   final_answer=f"<answer>{NINES}</answer>")
    assert score_trajectory(t, q).reward == 1.0


@pytest.mark.parametrize("kind", ["numeric"])   # math-verify already read these; the numeric grader did not
@pytest.mark.parametrize("gold,response,want", [
    ("1e308", "<answer>1e308</answer>", True),
    ("1e308", "The answer is $1 \\times 10^{308}$.", True),
    ("1e308", "<answer>1e307</answer>", False),
    ("2.5e-3", "<answer>0.0025</answer>", True),
    ("1e400", "<answer>1e400</answer>", True),          # beyond a float: still a number
])
def test_scientific_golds_are_numbers(kind, gold, response, want):
    res = get_grader(kind).grade(gold, response)
    assert (res.correct, res.error) == (want, None), res


def test_a_number_that_opens_a_phrase_is_the_answer():
    # issue #12: "20 cups of mixed chicken feed, ..." was graded wrong against 20 (the last number was used)
    res = get_grader("numeric").grade("20", "<answer>20 cups of mixed chicken feed, which is 4 cups per hen</answer>")
    assert res.correct, res
    assert not get_grader("numeric").grade("4", "<answer>20 cups of feed, which is 4 cups per hen</answer>").correct


MCQ = {"gold": "B", "choices": ["boil it", "use heat", "freeze it", "ignore it"]}


@pytest.mark.parametrize("response", [
    "<answer>The most effective method for sterilising it is to **B**.</answer>",
    "The most effective method for sterilising it is to **B**.",
    "After weighing the options, I'd go with __B__ here.",
    "Of the four, *B* is the only sound one.",
])
def test_markdown_wrapped_choice_is_the_letter(response):
    res = get_grader("mcq").grade(MCQ, response)
    assert (res.correct, res.extracted) == (True, "B"), res


def test_markdown_wrapped_wrong_choice_is_wrong():
    res = get_grader("mcq").grade(MCQ, "The most effective method for sterilising it is to **C**.")
    assert (res.correct, res.extracted) == (False, "C")


ADD_ONE = {"tests": "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(41) == 42\n",
           "entry_point": "add_one"}


@pytest.fixture(scope="module")
def code_grader() -> CodeGrader:
    return CodeGrader(Sandbox(Limits(wall_s=10, memory_mb=512)))


@pytest.mark.parametrize("name,solution", [
    ("sys.exit(0) before the tests", "import sys\ndef add_one(x):\n    return 0\nsys.exit(0)\n"),
    ("os._exit(0) before the tests", "import os\ndef add_one(x):\n    return 0\nos._exit(0)\n"),
    ("an atexit exit", "import atexit, os\natexit.register(lambda: os._exit(0))\ndef add_one(x):\n    return 0\n"),
    ("an atexit exit that hides the traceback", "import atexit, os, sys\nsys.stderr = open(os.devnull, 'w')\n"
     "atexit.register(os._exit, 0)\ndef add_one(x):\n    return 0\n"),
    ("sys.exit(0) inside the candidate", "import sys\ndef add_one(x):\n    sys.exit(0)\n"),
    ("raise SystemExit caught nowhere", "def add_one(x):\n    raise SystemExit(0)\n"),
    ("an always-equal object", "class Same:\n    def __eq__(self, other):\n        return True\n"
     "def add_one(x):\n    return Same()\n"),
    ("an always-equal int subclass", "class Same(int):\n    def __eq__(self, other):\n        return True\n"
     "    __hash__ = int.__hash__\ndef add_one(x):\n    return Same(0)\n"),
    ("unittest.mock.ANY", "from unittest.mock import ANY\ndef add_one(x):\n    return ANY\n"),
])
def test_exiting_early_or_rigging_equality_fails(code_grader, name, solution):
    res = code_grader.grade(ADD_ONE, f"```python\n{solution}```")
    assert res.correct is False and res.error is None, (name, res)


ROOT = Path(__file__).resolve().parent.parent


def test_18_a_hedged_choice_is_not_credited():
    from conductor.grading import get_grader

    g = get_grader("mcq")
    assert not g.grade({"gold": "B", "choices": ["w", "x", "y", "z"]}, "<answer>A or B</answer>").correct
    assert not g.grade({"gold": "B", "choices": ["w", "x", "y", "z"]}, "<answer>B/C</answer>").correct
    assert g.grade({"gold": "B", "choices": ["w", "x", "y", "z"]}, "<answer>B</answer>").correct


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.add(p)
        except OSError:
            pass
    return alive


def test_9_19_grade_is_bounded_interruptible_and_leaves_no_sandbox_behind(tmp_path):
    one_error(run("grade", "--timeout", "1e9", "-"), "--timeout")
    spin = tmp_path / "spin.jsonl"
    spin.write_text(json.dumps({"kind": "code", "response": "```python\nwhile True:\n    pass\n```",
                                "tests": "assert True"}) + "\n")
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    for sig, code, needle in ((signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated"),
                              (signal.SIGKILL, -9, None)):
        p = subprocess.Popen([sys.executable, "-m", "conductor", "grade", str(spin), "--timeout", "300"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(_descendants(p.pid)) < 2:   # the sandboxed program runs
            time.sleep(0.2)
        time.sleep(0.5)
        spawned = _descendants(p.pid)
        assert spawned, "the sandbox never started"
        start = time.monotonic()
        p.send_signal(sig)
        _, err = p.communicate(timeout=30)
        assert time.monotonic() - start < 10          # not the sandbox's 300 s
        assert p.returncode == code, (sig, p.returncode, err)
        if needle:
            assert err.strip().splitlines() == [f"error: {err.strip().removeprefix('error: ')}"] and needle in err
        deadline = time.monotonic() + 10
        while _alive(spawned) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(spawned), f"left behind after {sig.name}"


def test_16_extraction_and_a_huge_gold_on_the_simulated_pool():
    from conductor.extract.answer import extract
    from conductor.workers.providers.simulated import GoldRecord, wrong_answer

    assert extract("Final answer: 12" + " " * 160_000 + "x") == "12"
    for seed in range(5):
        w = wrong_answer(GoldRecord("9" * 5000, "math"), random.Random(seed))
        assert w != "9" * 5000 and len(w) == 5000
    assert wrong_answer(GoldRecord("1e999", "math"), random.Random(0)).startswith("1e999")
