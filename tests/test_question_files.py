"""Question files as users write them (issues #39, #51): an endless or huge input refused at once, JSONL split
on newlines only, malformed CSV rows and binary input named by line, the fields read by default, and the domain
inferred from a number answer (said once).

Real files, the real loaders and the real `conductor answer` on the simulated pool.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from conductor.cli import app
from conductor.data.datasets import DatasetError, load_file
from tests.cli_checks import one_error, run
from tests.test_serve_support import questions, simulated_pool

ROOT = Path(__file__).resolve().parent.parent
SIM_POOL = str(ROOT / "data/pools/simulated.yaml")


def answer(qf: Path | str, out: Path | str, *extra: str) -> list[str]:
    return ["answer", str(qf), "--out", str(out), "--pool", SIM_POOL, "--conductor", "fixed:0", *extra]


def test_2_an_endless_or_huge_input_is_refused_at_once(tmp_path):
    with pytest.raises(DatasetError, match="/dev/zero: not a regular file"):
        load_file("/dev/zero")
    no_newline = tmp_path / "blob.jsonl"
    with open(no_newline, "wb") as fh:   # 17 MiB without a newline: one line over the cap, read no further
        fh.write(b"x" * (17 * 2**20))
    start = time.monotonic()
    with pytest.raises(DatasetError, match=r"blob\.jsonl:1: line longer than the limit"):
        load_file(no_newline)
    assert time.monotonic() - start < 10
    with pytest.raises(DatasetError, match="is a directory"):
        load_file(tmp_path)
    one_error(run(*answer("/dev/zero", tmp_path / "out")), "/dev/zero", "not a regular file")
    assert not (tmp_path / "out").exists()


def test_10_jsonl_splits_on_newline_only(tmp_path):
    f = tmp_path / "sep.jsonl"
    f.write_text('{"id": "a", "question": "one\u2028two\u0085three", "answer": "1"}\n'
                 '{"id": "b", "question": "x\u2029y", "answer": "2"}\n', encoding="utf-8")
    qs = load_file(f)
    assert [x.id for x in qs] == ["a", "b"] and "one\u2028two\u0085three" in qs[0].prompt
    line = json.dumps({"kind": "exact", "gold": "a\u2028b", "response": "<answer>a\u2028b</answer>"},
                      ensure_ascii=False)
    r = CliRunner().invoke(app, ["grade", "-"], input=line + "\n")
    assert r.exit_code == 0 and len(r.stdout.strip().splitlines()) == 1, r.output   # one verdict per input line
    assert json.loads(r.stdout)["correct"] is True


@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20), min_size=1, max_size=5))
@settings(max_examples=40, deadline=None)
def test_10_any_json_text_round_trips_through_the_jsonl_reader(texts):
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "h.jsonl"
        rows = [{"id": f"q{i}", "question": "Q:" + t} for i, t in enumerate(texts)]
        f.write_bytes(b"\xef\xbb\xbf" + "\n".join(json.dumps(r, ensure_ascii=False) for r in rows).encode())
        got = load_file(f)
        assert [g.id for g in got] == [r["id"] for r in rows]
        assert all(g.prompt.startswith(("Q:" + t).strip()) for g, t in zip(got, texts))


def test_15_a_malformed_csv_row_is_an_error_naming_its_line(tmp_path):
    f = tmp_path / "q.csv"
    f.write_text('id,question,answer\nq1,"What is 2+2?,4\nq2,What is 3+3?,6\n', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"q\.csv:\d+: bad CSV"):
        load_file(f)
    f.write_text("id,question,answer\nq1,What is 2+2?,4,extra\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"q\.csv:2: 4 fields, the header has 3"):
        load_file(f)
    f.write_text('id,question,answer\nq1,"multi\nline",4\n', encoding="utf-8")   # a quoted newline is fine
    assert load_file(f)[0].gold == "4"


def test_19_bom_binary_stdin_and_a_file_named_like_a_dataset(tmp_path):
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b'\xef\xbb\xbf{"id": "a", "question": "q?"}\n')
    assert load_file(bom)[0].id == "a"
    binary = tmp_path / "b.jsonl"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe\n")
    with pytest.raises(DatasetError, match=rf"{binary}:1: not UTF-8"):
        load_file(binary)
    named = tmp_path / "gsm8k_test:3"
    named.write_text('{"id": "a", "question": "q?"}\n')
    code = ("import sys; from conductor.data.questionset import load_questions\n"
            "print(len(load_questions('-')), load_questions('-')[0].dataset)\n"
            "try:\n    load_questions('gsm8k_test:3')\nexcept ValueError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], input='{"id": "s", "question": "q?"}\n', text=True,
                       capture_output=True, cwd=tmp_path, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["1 stdin", "question-set spec 'gsm8k_test:3' is both a file here and "
                                     "'gsm8k_test' limited to 3; write ./gsm8k_test:3 for the file or move it"]


def _one(tmp_path: Path, row: dict) -> object:
    f = tmp_path / "f.jsonl"
    f.write_text(json.dumps(row) + "\n", encoding="utf-8")
    return load_file(f)[0]


def test_3_question_fields_are_read_by_default_and_checked(tmp_path):
    mcq = _one(tmp_path, {"id": "m", "question": "Capital?", "choices": ["Rome", "Paris"], "answer": "B"})
    assert mcq.domain == "mcq" and mcq.gold == "B" and "B. Paris" in mcq.prompt and mcq.choices == ["Rome", "Paris"]
    code = _one(tmp_path, {"id": "c", "question": "Write add.", "tests": "assert add(1, 2) == 3",
                           "entry_point": "add"})
    assert (code.domain, code.tests, code.entry_point) == ("code", "assert add(1, 2) == 3", "add")
    assert _one(tmp_path, {"id": "d", "question": "2+2?", "answer": "4", "domain": "math"}).domain == "math"
    assert _one(tmp_path, {"id": "k", "question": "2+2?", "answer": "4", "kind": "numeric"}).domain == "math"
    bad = [
        ({"id": "z", "question": "q", "choices": ["a", "b", "c", "d"], "answer": "Z"}, "not one of 4 options"),
        ({"id": "p", "question": "q", "domain": "poetry"}, "field 'domain'"),
        ({"id": "m", "question": "q", "domain": "mcq"}, "needs field 'choices'"),
        ({"id": "t", "question": "q", "tests": "npm test && echo ok"}, "field 'tests' is not Python"),   # 18
        ({"id": "e", "question": "q", "tests": "assert f()", "entry_point": "add; import os"}, "identifier"),  # 18
        ({"id": "x", "question": "q", "tests": "assert True", "domain": "math"}, "not 'code'"),
        ({"id": "n", "question": float("nan")}, "NaN is not valid JSON"),                               # 18
    ]
    for row, needle in bad:
        with pytest.raises(DatasetError, match=needle) as e:
            _one(tmp_path, row)
        assert str(e.value).startswith(f"{tmp_path / 'f.jsonl'}:1: ")


ITEMS = questions(12, offset=900)
GSM8K_REPLIES = [("Natalia sold 48/2 = 24 clips in May. 48+24 = 72. The answer is 72.", 72),
                 ("Weng earns 12/60 = $0.2 per minute... so she earned $10.", "10"),
                 ("So Betty needs 100 - 95 = 5 more dollars.\n#### 5", "5"),
                 ("The answer is 1,234 apples.", "1,234"),
                 ("Paris is the capital.", "Paris")]


def test_12_a_file_without_domain_grades_a_number_answer_as_math_and_says_so(tmp_path):
    from conductor.data.datasets import inferred_domain_note, load_file
    from conductor.grading import grade

    f = tmp_path / "q.jsonl"
    f.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Question {i}?", "answer": gold}) + "\n"
                         for i, (_, gold) in enumerate(GSM8K_REPLIES)))
    qs = load_file(f)
    assert [q.domain for q in qs] == ["math", "math", "math", "math", "free"]
    assert [grade(q, reply).correct for q, (reply, _) in zip(qs, GSM8K_REPLIES, strict=True)][:4] == [True] * 4
    assert inferred_domain_note(qs) == ("note: 4 questions without a 'domain' field graded as math (the answer is a "
                                        "number); give each row a domain to choose")
    # a row that names its domain keeps it; so do multiple-choice and code rows
    g = tmp_path / "own.jsonl"
    g.write_text(json.dumps({"question": "Year?", "answer": "1969", "domain": "free"}) + "\n"
                 + json.dumps({"question": "Pick", "answer": "B", "choices": ["1", "2"]}) + "\n")
    own = load_file(g)
    assert [q.domain for q in own] == ["free", "mcq"] and inferred_domain_note(own) is None


def test_12_conductor_answer_says_once_that_it_inferred_the_domain(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text("".join(json.dumps({"question": q, "answer": g}) + "\n" for q, g in ITEMS[:2]))
    pool = simulated_pool(tmp_path, ITEMS, skills=1.0)
    r = subprocess.run([sys.executable, "-m", "conductor", "answer", str(f), "--out", str(tmp_path / "out"),
                        "--pool", str(pool), "--conductor", "fixed:0"], capture_output=True, text=True, cwd=ROOT,
                       timeout=300, env={**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("graded as math") == 1 and "2 questions without a 'domain' field" in r.stdout
    assert "accuracy            100.0% of 2 graded" in r.stdout, r.stdout
