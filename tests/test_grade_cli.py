"""`conductor grade` as a user runs it: a real subprocess, JSONL in, one verdict line per input line."""

from __future__ import annotations

import json
import subprocess
import sys

LINES = [
    {"kind": "math", "gold": "\\frac{1}{2}", "response": "so $\\boxed{0.5}$"},
    {"kind": "numeric", "gold": "18", "response": "She makes $18 every day."},
    "this is not json",
    {"kind": "mcq", "gold": "B", "response": "<answer>A</answer>"},
    {"kind": "code", "gold": None, "tests": "def check(c):\n    assert c(2) == 4\n", "entry_point": "f",
     "response": "```python\ndef f(x):\n    return x * 2\n```"},
    {"kind": "code", "tests": [{"input": "3\n", "output": "6\n"}], "response": "while True:\n    pass\n"},
    {"kind": "bogus", "gold": "1", "response": "1"},
    {"kind": "math", "response": "1"},
    [1, 2],
]


def _run(args, stdin: str):
    return subprocess.run([sys.executable, "-m", "conductor", "grade", *args], input=stdin, capture_output=True,
                          text=True, timeout=120)


def test_grade_file_one_line_per_input(tmp_path):
    p = tmp_path / "in.jsonl"
    p.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in LINES) + "\n")
    proc = _run([str(p), "--timeout", "2"], "")
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(ln) for ln in proc.stdout.splitlines()]
    assert len(out) == len(LINES)
    assert all(set(o) == {"correct", "extracted", "error"} for o in out)
    assert [o["correct"] for o in out] == [True, True, False, False, True, False, False, False, False]
    assert out[0]["extracted"] == "0.5" and out[3]["extracted"] == "A"
    assert out[2]["error"].endswith("in.jsonl:3: invalid JSON (Expecting value)")
    assert out[5]["error"] is None                    # a hung program is a wrong answer, not an error
    assert "in.jsonl:7: field 'kind'" in out[6]["error"]
    assert "in.jsonl:8: field 'gold' is required" in out[7]["error"]
    assert "in.jsonl:9: expected a JSON object" in out[8]["error"]


def test_grade_stdin_and_missing_file():
    proc = _run(["-"], json.dumps({"kind": "mcq", "gold": 2, "response": "(C)"}) + "\n")
    assert proc.returncode == 0 and json.loads(proc.stdout) == {"correct": True, "extracted": "C", "error": None}
    proc = _run(["/nonexistent/x.jsonl"], "")
    assert proc.returncode == 2 and proc.stderr.strip() == "error: /nonexistent/x.jsonl: No such file or directory"
