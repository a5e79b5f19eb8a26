"""The python tool worker: finds the program a step should run, runs it in the real sandbox through the
real executor (cache included), and contains hostile programs (each reply is an answer, never an infra failure)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conductor.execution.cache import ResponseCache
from conductor.execution.executor import Executor
from conductor.prompts import worker_messages
from conductor.workers.pool import PoolError, parse_pool
from conductor.workers.providers.python_tool import NO_CODE, code_in, find_code, print_last_expression
from conductor.workflow import ALL, Step, Workflow

ROOT = Path(__file__).resolve().parent.parent

POOL_YAML = """
pool_id: py-test
workers:
  - name: sim
    provider: simulated
    model: simulated-sim
    options: {skills: {default: 1.0}, seed: 1}
  - name: python
    provider: python
    model: cpython3
    limits: {max_concurrency: 4, timeout_s: 30, max_retries: 0}
    sandbox: {wall_s: 3, memory_mb: 256}
"""
POOL = parse_pool(POOL_YAML)
PY = 1


def run(workflow: Workflow, question: str = "What is 6 times 7?", cache: ResponseCache | None = None):
    ex = Executor(cache=cache)

    async def go():
        try:
            return await ex.run_workflow(question, workflow, POOL.full())
        finally:
            await ex.aclose()
    return asyncio.run(go()), ex


def run_code(code: str) -> str:
    res, _ = run(Workflow((Step(PY, f"Run this:\n```python\n{code}\n```", ()),)))
    assert res.failure is None, res.failure
    return res.final_answer


# ---------------------------------------------------------------- which code runs

def test_code_comes_from_the_subtask_first_then_the_latest_visible_response():
    wf = Workflow((Step(0, "Write a program.", ()), Step(0, "Write another.", ()),
                   Step(PY, "Run the code above.", ALL)))
    responses = {0: "```python\nprint(1)\n```", 1: "Sure:\n```python\nprint(2)\n```\nOutput:\n```\n3\n```"}
    assert find_code(worker_messages("q", wf, 2, responses)) == "print(2)\n"   # the invented output is not code
    wf_own = Workflow((Step(0, "x", ()), Step(PY, "```python\nprint(5)\n```", ALL)))
    assert find_code(worker_messages("q", wf_own, 1, {0: "```python\nprint(1)\n```"})) == "print(5)\n"
    # a step that may not see the code gets nothing to run, and the question's own code is never run
    wf_blind = Workflow((Step(0, "x", ()), Step(PY, "Run it.", ())))
    assert find_code(worker_messages("```python\nprint('from the question')\n```", wf_blind, 1, {})) is None
    # a bare script without a fence is run too
    assert find_code(worker_messages("q", wf, 2, {0: "total = 3 * 4\nprint(total)", 1: "It is 12."})) \
        == "total = 3 * 4\nprint(total)"


@given(st.integers(-10**6, 10**6), st.text(alphabet="abc XYZ.,:\n", max_size=40))
def test_the_labelled_block_wins_over_prose_and_invented_output(n, prose):
    text = f"{prose}\n```python\nprint({n})\n```\n{prose}\nOutput:\n```\n{n + 1}\n```\n{prose}"
    assert code_in(text) == f"print({n})\n"


@given(st.from_regex(r"[A-Z][a-z ,]{0,30}[.?!]", fullmatch=True))
def test_sentences_are_not_programs(sentence):
    assert code_in(sentence) is None


def test_a_final_bare_expression_is_printed():
    assert print_last_expression("def solve():\n    return 41 + 1\nsolve()") == "def solve():\n    return 41 + 1\nprint(solve())"
    assert run_code("def solve():\n    return 41 + 1\nsolve()") == "42"


# ---------------------------------------------------------------- through the executor

def test_write_then_run_workflow_returns_what_the_program_printed_and_is_cached(tmp_path):
    wf = Workflow((Step(PY, "```python\nprint(sum(range(10)))\n```", ()), Step(PY, "Run the code above.", [0])))
    cache = ResponseCache(tmp_path / "c.sqlite")
    res, ex = run(wf, cache=cache)
    assert res.failure is None and res.responses[0] == "45"
    assert res.final_answer == NO_CODE           # "45" is output, not a program: nothing to run
    assert all(c.cost_usd == 0 and c.input_tokens == 0 and c.output_tokens == 0 for c in res.calls)
    res2, ex2 = run(wf, cache=cache)
    assert res2.responses == res.responses and ex2.stats["cache_hits"] == 2 and ex2.stats["calls"] == 0
    cache.close()


def test_errors_come_back_as_a_short_reproducible_tail():
    out = run_code("print('partial')\nraise ValueError('bad value')")
    assert out.startswith("partial\nError (exit code 1):") and "ValueError: bad value" in out
    assert "conductor-sbx" not in out and 'File "main.py"' in out
    assert run_code("x = 1") == "(the program ran and printed nothing)"
    long = run_code("print('x' * 100000)")
    assert len(long) < 2200 and "characters cut" in long


def test_no_code_is_an_answer_not_a_failure():
    res, _ = run(Workflow((Step(PY, "Compute the answer.", ()),)))
    assert res.failure is None and res.final_answer == NO_CODE


# ---------------------------------------------------------------- containment

def test_infinite_loop_is_stopped_at_the_manifest_wall_clock():
    t = time.monotonic()
    out = run_code("while True:\n    pass")
    assert out.startswith("Error: the program was stopped after 3 s") and time.monotonic() - t < 25


def test_memory_bomb_is_stopped():
    out = run_code("x = bytearray(4 * 1024**3)\nprint('allocated')")
    assert "allocated" not in out and "ran out of memory (limit 256 MB)" in out


def _sandbox_uid_procs() -> int:
    n = 0
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                n += os.stat(f"/proc/{p}").st_uid >= 200_000
            except OSError:
                pass
    return n


def test_fork_bomb_is_contained_and_leaves_no_process():
    before = _sandbox_uid_procs()
    out = run_code("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass")
    assert out.startswith("Error")
    # back to the count before at some moment: another test worker's short sandbox run (pytest-xdist) may
    # start at any time and is not a leak, where the bomb's processes would never go away
    deadline = time.monotonic() + 10
    drained = False
    while not drained and time.monotonic() < deadline:
        drained = _sandbox_uid_procs() <= before
        time.sleep(0 if drained else 0.1)
    assert drained, f"{_sandbox_uid_procs() - before} sandbox processes left behind"


def test_network_is_refused():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    accepted: list[object] = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                accepted.append(srv.accept())
            except OSError:
                pass
    th = threading.Thread(target=accept, daemon=True)
    th.start()
    try:
        out = run_code(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')")
    finally:
        stop.set()
        th.join()
        srv.close()
    assert "connected" not in out and out.startswith("Error") and not accepted


def test_writes_outside_its_directory_do_not_reach_the_host(tmp_path):
    targets = [ROOT / f"escape-{os.getpid()}.txt", tmp_path / "escape.txt", Path.home() / f"escape-{os.getpid()}.txt"]
    code = ("import json\nres = {}\n"
            f"for p in {json.dumps([str(t) for t in targets])}:\n"
            "    try:\n        open(p, 'w').write('x')\n        res[p] = 'wrote'\n"
            "    except OSError as e:\n        res[p] = type(e).__name__\n"
            "open('inside.txt', 'w').write('ok')\nprint(open('inside.txt').read())")
    out = run_code(code)
    assert out == "ok"            # its own directory is writable
    for t in targets:
        assert not t.exists(), f"the sandboxed program wrote {t}"


# ---------------------------------------------------------------- manifests and the answer flow

def test_sandbox_limits_are_validated_with_the_line():
    bad = POOL_YAML.replace("sandbox: {wall_s: 3, memory_mb: 256}", "sandbox: {wall_s: 3, memory_mb: lots}")
    with pytest.raises(PoolError, match=r"<pool>:\d+: workers\[1\]\(python\)\.sandbox\.memory_mb"):
        parse_pool(bad)
    slow = POOL_YAML.replace("wall_s: 3,", "wall_s: 30,")
    with pytest.raises(PoolError, match="sandbox.wall_s .30. must be below limits.timeout_s"):
        parse_pool(slow)
    wrong = POOL_YAML.replace("    options: {skills", "    sandbox: {wall_s: 1}\n    options: {skills")
    with pytest.raises(PoolError, match="provider python only"):
        parse_pool(wrong)


def test_shipped_pools_hold_a_python_worker_without_moving_the_others():
    from conductor.workers.pool import load_pool

    local = load_pool(ROOT / "data/pools/local.yaml")
    assert local.workers[0].name == "qwen2.5-coder-1.5b"             # fixed:0 stays the 1.5B
    assert local.workers[-1].provider == "python" and local.workers[-1].notes
    from conductor.local.servers import embedded_models
    assert "python" not in " ".join(embedded_models(local))          # no server is started for it
    text = (ROOT / "data/pools/paper.yaml").read_text()         # the paper's 7 workers, python commented out
    block = text[text.index("#  - name: python"):]
    enabled = parse_pool(text[:text.index("#  - name: python")] + block.replace("#  ", "  "))
    assert len(enabled.workers) == 8 and enabled.workers[-1].provider == "python"


def test_answer_flow_with_a_python_worker_records_free_calls(tmp_path):
    from conductor.run.config import AnswerConfig
    from flows.answer import answer_flow

    pool = tmp_path / "pool.yaml"
    pool.write_text(POOL_YAML)
    qfile = tmp_path / "q.jsonl"
    qfile.write_text("".join(json.dumps({"id": f"q{i}", "question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                             for i in range(3)))
    s = answer_flow(AnswerConfig(questions=str(qfile), out=str(tmp_path / "out"), pool=str(pool), conductor=f"fixed:{PY}",
                                 show_progress=False))
    assert s.trajectories == 3 and s.infra_failures == 0 and s.parse_failures == 0
    assert s.dollars_per_question == 0 and s.tokens_per_question == 0
    from conductor.lake.reader import scan
    calls = scan(s.lake, "calls").collect()
    assert calls.height == 3 and set(calls["provider"]) == {"python"}
    assert calls["cost_usd"].sum() == 0 and (calls["response"] == NO_CODE).all()
    assert pl.read_ndjson(tmp_path / "out" / "answers.jsonl").height == 3
