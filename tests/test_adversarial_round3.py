"""Issue #39 (hardening, round 3): a lake-only query session, bounded inputs, no silently dropped fields, no
silently replaced answers, secrets in URLs, one line for every mistake.

Real components only: real files, the real typer app in-process (commands that stop at their checks), real
subprocesses of `python -m conductor` where a signal, a kill or the exit status of the whole program matters,
real DuckDB, the real sandbox and the real provider emulator. Each test failed on the code before the fix.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from conductor.cli import app
from conductor.data.datasets import DatasetError, load_file
from conductor.lake import queries as q
from conductor.lake import write_shard
from lake_records import small_lake_records
from tests.cli_checks import one_error, run

ROOT = Path(__file__).resolve().parent.parent
SIM_POOL = str(ROOT / "data/pools/simulated.yaml")


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120,
        stdin: str | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", **(env or {})}
    return subprocess.run([sys.executable, "-m", "conductor", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env=full_env, input=stdin)




@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lake3")
    write_shard(root, small_lake_records(), "00000")
    return root


@pytest.fixture()
def qfile(tmp_path) -> Path:
    f = tmp_path / "q.jsonl"
    f.write_text('{"id": "a", "question": "1+1?", "answer": "2"}\n', encoding="utf-8")
    return f


def answer(qf: Path | str, out: Path | str, *extra: str) -> list[str]:
    return ["answer", str(qf), "--out", str(out), "--pool", SIM_POOL, "--conductor", "fixed:0", *extra]


# --------------------------------------------------------------------------- 1. a lake-only query session


def test_1_query_is_a_lake_only_read_only_session(lake, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("secret,1\n")
    refused = [
        f"COPY (SELECT * FROM trajectories) TO '{tmp_path}/x.csv'",
        f"COPY trajectories TO '{lake}/inside.csv'",                 # even inside the lake: no writes
        f"SELECT * FROM read_csv('{outside}')",
        f"SELECT * FROM read_text('{outside}')",
        "SELECT * FROM glob('/etc/*')",
        f"ATTACH '{tmp_path}/y.db'",
        f"EXPORT DATABASE '{tmp_path}/exp'",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "SELECT 1; SELECT 2",
    ]
    for sql in refused:
        with pytest.raises(Exception) as e:
            q.sql(str(lake), sql)
        assert "Traceback" not in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outside.txt"]
    assert not (lake / "inside.csv").exists()
    with pytest.raises(q.QueryRefused, match="read_"):   # polars' own file readers
        q.sql(str(lake), f"SELECT * FROM read_csv('{outside}')", engine="polars")
    # what the command is for still works: SELECT, WITH, DESCRIBE, SHOW, EXPLAIN
    assert q.sql(str(lake), "SELECT count(*) AS n FROM trajectories").rows() == [(8,)]
    assert q.sql(str(lake), "WITH t AS (SELECT run_id FROM trajectories) SELECT count(*) FROM t").rows() == [(8,)]
    assert q.sql(str(lake), "DESCRIBE trajectories").height > 10
    assert {"calls", "trajectories"} <= set(q.sql(str(lake), "SHOW TABLES")["name"])
    # the command: one error line; --allow-files gives DuckDB's full power on purpose
    one_error(run("query", f"SELECT * FROM read_text('{outside}')", "--lake", str(lake)), "query")
    one_error(run("query", f"COPY trajectories TO '{tmp_path}/z.csv'", "--lake", str(lake)), "COPY", "--allow-files")
    one_error(run("query", "", "--lake", str(lake)), "empty")                          # 19: was an AttributeError
    r = run("query", f"SELECT * FROM read_csv('{outside}', header=false)", "--lake", str(lake), "--allow-files",
            "-f", "csv")
    assert r.exit_code == 0 and "secret" in r.stdout


# --------------------------------------------------------------------------- 2, 10, 15, 19: inputs


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


# --------------------------------------------------------------------------- 3, 18: question fields


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


def test_18_a_hedged_choice_is_not_credited():
    from conductor.grading import get_grader

    g = get_grader("mcq")
    assert not g.grade({"gold": "B", "choices": ["w", "x", "y", "z"]}, "<answer>A or B</answer>").correct
    assert not g.grade({"gold": "B", "choices": ["w", "x", "y", "z"]}, "<answer>B/C</answer>").correct
    assert g.grade({"gold": "B", "choices": ["w", "x", "y", "z"]}, "<answer>B</answer>").correct


# --------------------------------------------------------------------------- 4, 5, 6, 17, 19: --out and friends


def test_4_5_out_is_a_non_empty_path_and_config_paths_are_expanded(tmp_path, qfile, monkeypatch):
    r = cli(*answer(qfile, ""), "--limit", "1")
    one_error(r, "--out", "non-empty")
    assert not (ROOT / "answers.jsonl").exists() and not (ROOT / "cache.sqlite").exists()
    from conductor.run.config import AnswerConfig

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("R3_DIR", str(tmp_path / "v"))
    conf = tmp_path / "run.yaml"
    conf.write_text("questions: q.jsonl\nout: ~/x\ncache: ${R3_DIR}/c.sqlite\nlake: $R3_DIR/lake\n")
    cfg = AnswerConfig.build(conf)
    assert (cfg.out, cfg.cache, cfg.lake) == (f"{tmp_path}/x", f"{tmp_path}/v/c.sqlite", f"{tmp_path}/v/lake")


def test_6_a_used_out_holding_another_input_is_refused_and_a_running_one_is_locked(tmp_path, qfile):
    from conductor.run.preflight import OUT_LOCK, OUT_MARKER

    out = tmp_path / "out"
    out.mkdir()
    (out / "answers.jsonl").write_text('{"id": "old"}\n' * 60)
    (out / OUT_MARKER).write_text(json.dumps({"questions": "other.jsonl"}))
    one_error(run(*answer(qfile, out)), "another question set", "--replace")
    assert len((out / "answers.jsonl").read_text().splitlines()) == 60
    (out / OUT_MARKER).write_text(json.dumps({"questions": str(qfile)}))
    with open(out / OUT_LOCK, "a+") as held:      # a run of the same command in flight
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        one_error(run(*answer(qfile, out)), "another `conductor answer` is writing there now")


def test_17_mistakes_are_found_before_prefect_starts(tmp_path, qfile):
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"this is not a database" * 10)
    one_error(run(*answer(qfile, tmp_path / "o1", "--cache", str(garbage))), "--cache", "not an SQLite database")
    (tmp_path / "o2" / "answers.jsonl").mkdir(parents=True)
    one_error(run(*answer(qfile, tmp_path / "o2")), "answers.jsonl is a directory")
    sur = tmp_path / "sur.jsonl"
    sur.write_text('{"id": "s", "question": "x\\ud800y"}\n')
    one_error(run(*answer(sur, tmp_path / "o3")), f"{sur}:1", "lone surrogate")
    assert not (tmp_path / "o3").exists()                   # no cache.sqlite left behind
    # a champion whose files are gone
    from conductor.learning.registry import Registry

    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "config.json").write_text("{}")
    reg = Registry(str(tmp_path / "reg"))
    reg.register(str(ck), checkpoint_id="ck")
    reg.promote("ck")
    (ck / "config.json").unlink()
    ck.rmdir()
    r = CliRunner().invoke(app, answer(qfile, tmp_path / "o4")[:-2] + ["--conductor", "champion"],
                           env={"CONDUCTOR_REGISTRY": str(tmp_path / "reg")})
    one_error(r, "--conductor", "champion ck", "no such directory")
    # rollout --dask at an address that does not answer: seconds, not a 30 s DNS wait after Prefect starts
    start = time.monotonic()
    one_error(run("rollout", str(qfile), "--lake", str(tmp_path / "l"), "--pool", SIM_POOL, "--conductor", "fixed:0",
                  "--run-id", "r", "--dask", "bogus.invalid:1"), "--dask")
    one_error(run("rollout", str(qfile), "--lake", str(tmp_path / "l"), "--pool", SIM_POOL, "--conductor", "fixed:0",
                  "--run-id", "r", "--dask", "local:zero"), "--dask")
    assert time.monotonic() - start < 15


def test_18_nonsense_options_are_refused(tmp_path, qfile, lake):
    one_error(run(*answer(qfile, tmp_path / "o", "--temperature", "1000")), "--temperature")
    one_error(run(*answer(qfile, tmp_path / "o", "--limits", "sqlite:/nonexistent-r3/sub/x")), "--limits",
              "does not exist")
    assert not Path("/nonexistent-r3").exists()
    one_error(run(*answer(qfile, tmp_path / "o", "--fewshot", "ood:-1")), "--fewshot")
    one_error(run("prompt", ""), "empty")
    one_error(run("report", "--lake", str(lake), "--out", str(tmp_path / "rep"), "--kind", "bogus"), "--kind")
    assert not (tmp_path / "rep").exists()
    for body, needle in (("pool_id: ../../etc/evil\nworkers:\n  - {name: a, provider: simulated, model: a}\n",
                          "pool_id"),
                         ("pool_id: p\nworkers:\n  - {name: a, provider: openai_compatible, model: a, "
                          "base_url: 'file:///etc/passwd'}\n", "base_url")):
        (tmp_path / "p.yaml").write_text(body)
        one_error(run("pool", "validate", str(tmp_path / "p.yaml")), needle)


# --------------------------------------------------------------------------- 7, 8, 13: manifests and secrets


def test_7_secrets_in_urls_are_masked(tmp_path, monkeypatch):
    monkeypatch.setenv("R3_API_KEY", "k3y-value-0123456789")
    pool = tmp_path / "p.yaml"
    pool.write_text("pool_id: p\nworkers:\n"
                    "  - {name: a, provider: openai_compatible, model: m, base_url: 'http://h/v1?api-key=${R3_API_KEY}'}\n"
                    "  - {name: b, provider: openai_compatible, model: m, base_url: 'http://user:pa55word-xyz@h/v1'}\n")
    r = run("pool", "show", str(pool))
    assert r.exit_code == 0, r.output
    assert "k3y-value-0123456789" not in r.stdout and "pa55word-xyz" not in r.stdout
    assert "http://h/v1?api-key=[REDACTED]" in r.stdout
    from conductor.policy.spec import parse_conductor_spec
    from conductor.run.runtime import checkpoint_of

    ckpt = checkpoint_of(parse_conductor_spec("openai:m@http://u:SECRET-pass@host/v1#VAR"))
    assert "SECRET-pass" not in ckpt and ckpt == "openai:m@http://[REDACTED]@host/v1#VAR"


def test_8_a_manifest_or_config_that_is_not_utf8_is_one_line(tmp_path, qfile):
    pool = tmp_path / "latin1.yaml"
    pool.write_bytes("pool_id: p\nnotes: café\nworkers:\n  - {name: a, provider: simulated, model: a}\n"
                     .encode("latin-1"))
    one_error(run("pool", "validate", str(pool)), f"{pool}:2", "not UTF-8")
    one_error(run("pool", "show", str(pool)), "not UTF-8")
    one_error(run("preflight", str(pool)), "not UTF-8")
    one_error(run("answer", str(qfile), "--out", str(tmp_path / "o"), "--pool", str(pool)), "not UTF-8")
    conf = tmp_path / "run.yaml"
    conf.write_bytes("questions: q.jsonl\n# café\nout: x\n".encode("latin-1"))
    one_error(run("answer", "--config", str(conf)), f"{conf}:2", "not UTF-8")


def test_13_an_unset_variable_in_a_manifest_is_an_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.delenv("R3_UNSET_HOST", raising=False)
    pool = tmp_path / "p.yaml"
    pool.write_text("pool_id: p\nworkers:\n  - name: a\n    provider: openai_compatible\n    model: m\n"
                    "    base_url: http://${R3_UNSET_HOST}/v1\n")
    one_error(run("pool", "validate", str(pool)), f"{pool}:6", "R3_UNSET_HOST is not set")
    one_error(run("preflight", str(pool)), "R3_UNSET_HOST")
    pool.write_text(pool.read_text().replace("${R3_UNSET_HOST}", "${R3_UNSET_HOST:-127.0.0.1:9}"))
    assert run("pool", "validate", str(pool)).exit_code == 0


# --------------------------------------------------------------------------- 9, 19: grading and signals


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


# --------------------------------------------------------------------------- 11, 12, 14: registry, nightly, emulator


def test_11_the_registry_checks_what_it_registers(tmp_path):
    reg = str(tmp_path / "reg")
    empty = tmp_path / "empty"
    empty.mkdir()
    one_error(run("registry", "register", str(tmp_path / "missing"), "--registry", reg), "no such directory")
    one_error(run("registry", "register", str(empty), "--registry", reg), "holds no model")
    one_error(run("registry", "register", "/etc", "--registry", reg), "holds no model")
    good = tmp_path / "good"
    good.mkdir()
    (good / "config.json").write_text("{}")
    one_error(run("registry", "register", str(good), "--id", "../../evil", "--registry", reg), "never a path")
    assert run("registry", "register", str(good), "--registry", reg).exit_code == 0
    (good / "config.json").unlink()
    one_error(run("registry", "promote", "good", "--force", "--registry", reg), "holds no model")
    (Path(reg) / "registry.json").write_text("{not json")
    one_error(run("registry", "show", "--registry", reg), "corrupt registry document")
    start = time.monotonic()
    one_error(cli("registry", "show", "--registry", "mlflow+http://127.0.0.1:9#m"), "MLflow registry")
    assert time.monotonic() - start < 60        # was 252 s of silent retries


def test_12_17_nightly_mistakes_are_refused_before_anything_starts(tmp_path):
    ck = tmp_path / "base"
    ck.mkdir()
    common = ["nightly", "--pool", SIM_POOL, "--train", "gsm8k_train:2", "--eval", "gsm8k_test:2",
              "--work-dir", str(tmp_path / "w")]
    one_error(run(*common, "--base", str(ck), "--grpo", '{"learnig_rate": 1}'), "--grpo", "learnig_rate")
    one_error(run(*common, "--base", str(ck), "--grpo", '{"learning_rate": "fast"}'), "--grpo", "learning_rate")
    one_error(run(*common, "--base", str(ck), "--backend", "bogus"), "--backend")
    one_error(run(*common, "--base", str(ck), "--night", "../x"), "--night")
    one_error(run(*common, "--base", str(tmp_path / "missing")), "--base", "no such checkpoint")
    assert not (tmp_path / "w").exists()


def test_14_emulator_mistakes_are_one_line_and_sigterm_stops_a_hang(tmp_path):
    one_error(run("emulator", "--port", "70000"), "--port 70000")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    one_error(run("emulator", "--port", "0", "--config", str(bad)), "not valid JSON")
    bad.write_text('{"latency_sx": 1}')
    one_error(run("emulator", "--port", "0", "--config", str(bad)), "unknown emulator settings")
    p = subprocess.Popen([sys.executable, "-m", "conductor.testing.emulator", "--port", "0"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        url = p.stdout.readline().strip().rsplit(" ", 1)[-1]
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x [[fault:hang]]"}]}).encode()
        req = urllib.request.Request(url + "/v1/chat/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        import threading

        threading.Thread(target=lambda: _ignore(urllib.request.urlopen, req, timeout=30), daemon=True).start()
        time.sleep(1.0)
        start = time.monotonic()
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=20)
        assert time.monotonic() - start < 8        # was held until the hang (an hour) ended
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def _ignore(fn, *args, **kw):
    try:
        fn(*args, **kw)
    except Exception:  # noqa: BLE001 - the server went away mid-request: expected
        pass


# --------------------------------------------------------------------------- 16: the leftovers


def test_16_retry_backoff_stays_inside_the_call_deadline(tmp_path, monkeypatch):
    from conductor.execution.executor import Executor
    from conductor.execution.ratelimit import RateLimiter
    from conductor.execution.retry import RetryPolicy
    from conductor.testing.emulator import Emulator
    from conductor.trajectory import CallRecord
    from conductor.workers.pool import Pool
    from conductor.workers.providers.base import Message
    from tests.fixtures_emulator import FAKE_KEYS, worker

    for k, v in FAKE_KEYS.items():
        monkeypatch.setenv(k, v)
    with Emulator() as emu:
        emu.configure(retry_after_s=3600.0)
        pool = Pool(pool_id="dl", workers=(worker(emu, "w", "openai", limits={"timeout_s": 1.0, "max_retries": 1}),))
        ex = Executor(limiter=RateLimiter(max_pause_s=0.2), retry=RetryPolicy(base_s=0.001))   # max_wait_s: 30

        async def main() -> float:
            rec = CallRecord(call_id="0.0", parent_call_id=None, depth=0, step=0, worker_index=0, worker="w",
                             provider="openai", model="w-model", subtask="x", access=[], access_all=False)
            start = time.monotonic()
            await ex.call(pool.workers[0], [Message("user", "x [[fault:429*1]]")], rec)
            await ex.aclose()
            return time.monotonic() - start

        assert asyncio.run(main()) < 8     # was 30 s: the back-off honoured Retry-After outside the deadline


def test_16_extraction_and_a_huge_gold_on_the_simulated_pool():
    from conductor.grading.extract import extract
    from conductor.workers.providers.simulated import GoldRecord, wrong_answer

    assert extract("Final answer: 12" + " " * 160_000 + "x") == "12"
    for seed in range(5):
        w = wrong_answer(GoldRecord("9" * 5000, "math"), random.Random(seed))
        assert w != "9" * 5000 and len(w) == 5000
    assert wrong_answer(GoldRecord("1e999", "math"), random.Random(0)).startswith("1e999")


def test_16_a_retried_shard_keeps_the_failed_attempt_as_history(tmp_path):
    from conductor.data.questions import Question, content_sharded
    from conductor.lake.resume import committed
    from lake_records import traj

    failed = [traj("r", f"q{i}", 0, kind="answer", infra_cause="rate_limited: x") for i in range(2)]
    write_shard(tmp_path, failed, "first")
    state = committed(tmp_path, "answer", "r")
    ids = {t.question_id: [t.trajectory_id] for t in failed}
    assert state.failed == set(sum(ids.values(), [])) and set(state.failed_rows.values()) == {1}
    qs = [Question(id=f"q{i}", dataset="d", domain="math", prompt="p") for i in range(2)]
    plain = content_sharded(qs, 5, key=lambda q: "\x1f".join(ids[q.id]))
    retry = content_sharded(qs, 5, key=lambda q: "\x1f".join(ids[q.id]) + state.attempt_key(ids[q.id]))
    assert plain[0][0] != retry[0][0]        # the retry writes a shard of its own: the failed rows are kept
    write_shard(tmp_path, failed, "second")   # failed again: the next retry gets yet another name
    again = committed(tmp_path, "answer", "r")
    assert again.attempt_key(ids["q0"]) != state.attempt_key(ids["q0"])
