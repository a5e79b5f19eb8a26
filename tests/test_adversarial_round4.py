"""Issue #51 (hardening, round 4), items 3-14: `conductor serve` checks its options and its lake at start, keeps
every served row or says so, one id per streamed answer, no 200 without a workflow, keyless servers refuse the
web, an unreadable registry keeps the champion; domains from a number answer, contradicting labels, fault
latency, `lake view` after a compact and on s3 without credentials.

Real components only: the real typer app in-process (commands that stop at their checks), the real server on
loopback driven by the openai SDK and httpx, real Parquet lakes and registries, the loopback provider emulator
and the loopback S3 server. Each test failed on the code before the fix.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from conductor.policy.strategies import VOTE_WORKER
from conductor.serve.config import ServeConfig
from tests.cli_checks import one_error, run
from tests.test_serve_support import LiveServer, keyed_server, questions, simulated_pool

ROOT = Path(__file__).resolve().parent.parent
SIM_POOL = str(ROOT / "data/pools/simulated.yaml")
ITEMS = questions(12, offset=900)
KEY = "cnd-round4-key-0123456789abcdef"
KEY_ENV = "CONDUCTOR_TEST_ROUND4_KEYS"
NO_KEYS = "CONDUCTOR_TEST_ROUND4_NO_KEYS"      # never set: a keyless server




def serve(*extra: str):
    return run("serve", "--pool", SIM_POOL, "--conductor", "fixed:0", *extra)


def ask(base_url: str, i: int = 0, key: str = "unused", **kw):
    c = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
    return c.chat.completions.create(model="conductor", messages=[{"role": "user", "content": ITEMS[i][0]}], **kw)


# --------------------------------------------------------------------------- 3, 5 and the Low options

@pytest.mark.parametrize("args, needle", [
    (("--max-cost", "nan"), "--max-cost"), (("--max-cost", "-1"), "--max-cost"), (("--max-cost", "0"), "--max-cost"),
    (("--key-rpm", "-5"), "--key-rpm"), (("--key-concurrency", "0"), "--key-concurrency"),
    (("--reload-s", "-1"), "--reload-s"), (("--reload-s", "inf"), "--reload-s"),
    (("--recursion-depth", "-1"), "--recursion-depth"), (("--max-input-chars", "0"), "--max-input-chars"),
])
def test_3_serve_refuses_numbers_that_would_void_a_limit(args, needle):
    one_error(serve(*args), needle)


@pytest.mark.parametrize("args, needle", [
    (("--port", "70000"), "--port 70000"), (("--port", "-1"), "--port -1"),
    (("--log-level", "bogus"), "--log-level 'bogus'"),
    (("--host", "bogus.invalid"), "--host 'bogus.invalid'"),
])
def test_5_serve_start_up_mistakes_are_one_line(args, needle):
    one_error(serve(*args), needle)


def test_5_a_cache_that_is_a_directory_or_not_sqlite_and_a_port_in_use(tmp_path):
    one_error(serve("--cache", str(tmp_path)), "--cache", "is a directory")
    junk = tmp_path / "junk.sqlite"
    junk.write_text("not a database")
    one_error(serve("--cache", str(junk)), "--cache", "not an SQLite database")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        one_error(serve("--port", str(port)), f"--port {port}", "cannot listen")


def test_low_serve_key_refuses_names_its_keys_file_line_could_not_hold():
    for name in ("two words", "a#b", "line\nbreak", ""):
        one_error(run("serve-key", name), "name")
    r = run("serve-key", "app-1")
    assert r.exit_code == 0 and "line: app-1 sha256:" in r.output


# --------------------------------------------------------------------------- 4: the lake destination

@pytest.mark.parametrize("run_id", ["a/b", "../x", "a b"])
def test_4_a_run_id_that_is_not_a_plain_name_is_refused_at_start(run_id, tmp_path):
    one_error(serve("--lake", str(tmp_path / "lake"), "--run-id", run_id), "--run-id", repr(run_id))


def test_4_a_lake_that_is_a_file_is_refused_at_start(tmp_path):
    f = tmp_path / "lake"
    f.write_text("x")
    one_error(serve("--lake", str(f)), "--lake", "not a directory")


def test_4_rows_that_cannot_be_written_are_kept_counted_and_turn_health_unhealthy(tmp_path):
    pool = simulated_pool(tmp_path, ITEMS, skills=1.0)
    lake = tmp_path / "lake"
    cfg = ServeConfig(pool=str(pool), conductor="fixed:0", registry=str(tmp_path / "registry"), reload_s=0,
                      lake=str(lake), lake_flush_s=0.1, api_keys_env=NO_KEYS, key_rpm=None)
    with LiveServer(cfg) as s:
        ask(s.base_url, 0)
        s.engine.writer.flush()
        assert httpx.get(f"{s.root}/health").json()["lake"]["rows_written"] == 1
        shutil.rmtree(lake)
        lake.write_text("the lake's directory was replaced by a file")     # every shard write now fails
        ask(s.base_url, 1)
        ask(s.base_url, 2)
        s.engine.writer.flush()
        h = httpx.get(f"{s.root}/health")
        assert h.status_code == 503 and h.json()["status"] == "unhealthy", h.text
        lk = h.json()["lake"]
        assert lk["errors"] >= 1 and lk["rows_pending"] == 2 and lk["rows_lost"] == 0 and lk["last_error"]
        metrics = httpx.get(f"{s.root}/metrics").text
        assert "conductor_serve_lake_write_errors " in metrics and "conductor_serve_lake_write_errors 0.0" not in metrics
        lake.unlink()
        lake.mkdir()                                  # the lake is back: the kept rows land on the next flush
        s.engine.writer.flush()
        h = httpx.get(f"{s.root}/health")
        assert h.status_code == 200 and h.json()["lake"]["rows_pending"] == 0, h.text
        assert h.json()["lake"]["rows_written"] == 3
    from conductor.lake.reader import open_lake

    assert open_lake(str(lake)).scan("trajectories", kind="served").collect().height == 2


# --------------------------------------------------------------------------- 6: one id per streamed answer

def test_6_a_streamed_answer_has_the_id_of_its_lake_row_and_trace(tmp_path):
    pool = simulated_pool(tmp_path, ITEMS, skills=1.0)
    with keyed_server(tmp_path, pool, KEY_ENV, KEY) as s:
        c = openai.OpenAI(base_url=s.base_url, api_key=KEY, max_retries=0)
        for i in range(2):     # the second request would be numbered after the first one's two ids
            chunks = list(c.chat.completions.create(
                model="conductor", messages=[{"role": "user", "content": ITEMS[i][0]}], stream=True,
                extra_body={"conductor": {"trace": True}}))
            ids = {ch.id for ch in chunks}
            assert len(ids) == 1, ids
            traced = [ch.model_extra.get("conductor_trace") for ch in chunks if ch.model_extra.get("conductor_trace")]
            assert traced and f"chatcmpl-{traced[0]['request_id']}" in ids
        s.engine.writer.flush()
        from conductor.lake.reader import open_lake

        qids = set(open_lake(str(tmp_path / "lake")).scan("trajectories", kind="served").collect()["question_id"])
        assert f"served/{ids.pop().removeprefix('chatcmpl-')}" in qids


# --------------------------------------------------------------------------- 7: no 200 without a workflow

def test_7_excluding_the_vote_tool_of_a_vote_server_is_a_400(tmp_path):
    pool = simulated_pool(tmp_path, ITEMS, skills=1.0)
    cfg = ServeConfig(pool=str(pool), conductor="vote:0+1", registry=str(tmp_path / "registry"), reload_s=0,
                      api_keys_env=NO_KEYS, key_rpm=None)
    with LiveServer(cfg) as s:
        assert ask(s.base_url, 0).choices[0].message.content
        with pytest.raises(openai.BadRequestError) as e:
            ask(s.base_url, 0, extra_body={"conductor": {"exclude_workers": [VOTE_WORKER]}})
        assert e.value.code == "invalid_controls" and "vote tool" in e.value.message


def test_7_a_conductor_whose_output_does_not_parse_is_an_error_not_an_empty_answer(tmp_path):
    from conductor.testing.emulator import Emulator

    pool = simulated_pool(tmp_path, ITEMS, skills=1.0)
    os.environ["EMU_ROUND4_KEY"] = "sk-emu-round4-0123456789"
    try:
        with Emulator() as emu:    # replies with prose: not a workflow
            cfg = ServeConfig(pool=str(pool), conductor=f"openai:emu-model@{emu.base_url}/v1#EMU_ROUND4_KEY",
                              registry=str(tmp_path / "registry"), reload_s=0, api_keys_env=NO_KEYS,
                              key_rpm=None, lake=str(tmp_path / "lake"), lake_flush_s=0.1)
            with LiveServer(cfg) as s:
                with pytest.raises(openai.APIStatusError) as e:
                    ask(s.base_url, 0)
                assert e.value.status_code == 502 and e.value.code == "no_workflow", e.value.message
                s.engine.writer.flush()
                assert httpx.get(f"{s.root}/health").json()["lake"]["rows_written"] == 1   # kept to debug
    finally:
        os.environ.pop("EMU_ROUND4_KEY", None)


# --------------------------------------------------------------------------- 8: keyless servers refuse the web

def test_8_a_keyless_server_answers_loopback_json_only(tmp_path):
    pool = simulated_pool(tmp_path, ITEMS, skills=1.0)
    cfg = ServeConfig(pool=str(pool), conductor="fixed:0", registry=str(tmp_path / "registry"), reload_s=0,
                      api_keys_env=NO_KEYS, key_rpm=None)
    body = json.dumps({"model": "conductor", "messages": [{"role": "user", "content": ITEMS[0][0]}]})
    with LiveServer(cfg) as s:
        assert ask(s.base_url, 0).choices[0].message.content          # the SDK: loopback, JSON
        url = f"{s.base_url}/chat/completions"
        for host in ("evil.example", f"evil.example:{s.port}", "127.0.0.1.evil.example", "10.0.0.5"):
            r = httpx.post(url, content=body, headers={"Host": host, "Content-Type": "application/json"})
            assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed", (host, r.text)
        r = httpx.get(f"{s.base_url}/models", headers={"Host": "evil.example"})
        assert r.status_code == 403
        for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {"Content-Type": ctype} if ctype else {}
            r = httpx.post(url, content=body, headers=headers)
            assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type", (ctype, r.text)
        for host in (f"localhost:{s.port}", f"[::1]:{s.port}", "127.0.0.1"):
            r = httpx.post(url, content=body, headers={"Host": host, "Content-Type": "application/json; charset=utf-8"})
            assert r.status_code == 200, (host, r.text)


def test_8_a_keyed_server_checks_the_key_as_before(tmp_path):
    pool = simulated_pool(tmp_path, ITEMS, skills=1.0)
    body = json.dumps({"model": "conductor", "messages": [{"role": "user", "content": ITEMS[0][0]}]})
    with keyed_server(tmp_path, pool, KEY_ENV, KEY) as s:
        r = httpx.post(f"{s.base_url}/chat/completions", content=body,
                       headers={"Host": "api.example", "Content-Type": "text/plain", "Authorization": f"Bearer {KEY}"})
        assert r.status_code == 200, r.text
        r = httpx.post(f"{s.base_url}/chat/completions", content=body, headers={"Content-Type": "text/plain"})
        assert r.status_code == 401


# --------------------------------------------------------------------------- 9: an unreadable registry

def test_9_an_unreadable_registry_keeps_the_champion_and_says_so(tmp_path):
    import asyncio

    from conductor.learning.registry import Registry

    reg = Registry(str(tmp_path / "registry"))
    d = tmp_path / "ck-a"
    d.mkdir()
    reg.register(str(d), lineage={"policy_spec": "fixed:1"}, checkpoint_id="ck-a")
    reg.promote("ck-a")
    pool = simulated_pool(tmp_path, ITEMS, skills=1.0)
    cfg = ServeConfig(pool=str(pool), conductor="fixed:0", registry=str(tmp_path / "registry"), reload_s=0,
                      api_keys_env=NO_KEYS, key_rpm=None)
    files = sorted(p for p in (tmp_path / "registry").rglob("*.json"))
    assert files, list((tmp_path / "registry").rglob("*"))
    with LiveServer(cfg) as s:
        assert ask(s.base_url, 0).model == "conductor@ck-a"
        saved = {p: p.read_bytes() for p in files}
        for p in files:
            p.write_text("{not json")
        assert asyncio.run(s.engine.reload_champion()) is False
        assert ask(s.base_url, 0).model == "conductor@ck-a"                 # not demoted to the default
        h = httpx.get(f"{s.root}/health").json()
        assert h["champion"] == "ck-a" and h["registry_error"], h
        for p, b in saved.items():
            p.write_bytes(b)
        asyncio.run(s.engine.reload_champion())
        assert httpx.get(f"{s.root}/health").json()["registry_error"] is None


# --------------------------------------------------------------------------- 12: the domain from the gold

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


# --------------------------------------------------------------------------- 11: contradicting labels

def test_11_two_labels_that_contradict_for_one_served_question_are_refused(tmp_path):
    from conductor.data.datasets import DatasetError
    from conductor.data.served import ServedTraffic, redaction_mark, select_labelled

    traffic = ServedTraffic.of([("served/r-1", redaction_mark("What is 2+2?")), ("served/r-2", "Name a colour")])
    labels = tmp_path / "labels.jsonl"
    rows = [{"question": "What is 2+2?", "answer": "4"}, {"question": "Name a colour", "answer": "red"},
            {"question": "What is 2+2?", "answer": "4"}]            # a repeat: kept once
    labels.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sel = select_labelled(traffic, str(labels))
    assert [r["answer"] for r in sel.rows] == ["4", "red"]
    labels.write_text("".join(json.dumps(r) + "\n" for r in rows + [{"question": "What is 2+2?", "answer": "5"}]))
    with pytest.raises(DatasetError, match=r"labels\.jsonl:4: .*line 1 .*'4' there, '5' here"):
        select_labelled(traffic, str(labels))
    labels.write_text(json.dumps({"id": "chatcmpl-r-2", "question": "Name a colour", "answer": "red"}) + "\n"
                      + json.dumps({"id": "r-2", "question": "name a colour", "answer": "blue"}) + "\n")
    with pytest.raises(DatasetError, match=r"labels\.jsonl:2: "):
        select_labelled(traffic, str(labels))


# --------------------------------------------------------------------------- 13: fault latency

def test_13_a_fault_latency_past_the_call_timeout_is_refused(tmp_path):
    import yaml

    from conductor.workers.pool import PoolError, load_pool

    doc = yaml.safe_load(Path(SIM_POOL).read_text())
    doc["workers"][0]["faults"] = {"latency_s": 1e9}
    p = tmp_path / "pool.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(PoolError, match=r"faults.latency_s \(1e\+09\) must be below limits.timeout_s"):
        load_pool(p)
    doc["workers"][0]["faults"] = {"inject": {"rate": 0.5, "text": "x" * 2_000_000}}
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(PoolError, match="inject"):
        load_pool(p)
    doc["workers"][0]["faults"] = {"latency_s": 0.5}
    p.write_text(yaml.safe_dump(doc))
    assert load_pool(p).workers[0].faults.latency_s == 0.5


# --------------------------------------------------------------------------- 10: lake view

def test_10_lake_view_follows_a_compaction_and_a_removed_shard_without_a_500(tmp_path):
    pytest.importorskip("duckdb")
    from starlette.testclient import TestClient

    from conductor.lake.compact import compact
    from conductor.lake.view.app import create_app
    from conductor.lake.writer import write_shard
    from lake_records import traj

    root = str(tmp_path / "lake")
    ts = [traj("r1", f"q{i}", 0, workers=["w-a", "w-b"], kind="answer") for i in range(8)]
    for i in range(4):
        write_shard(root, ts[2 * i:2 * i + 2], f"s{i}")
    client = TestClient(create_app([root], allowed_hosts=["testserver"]))   # a server exception fails the test
    before = {r["trajectory_id"]: r["shard"] for r in client.get("/api/trajectories").json()["rows"]}
    assert len(before) == 8 and client.get("/trajectories").status_code == 200
    compact(root, run_id="r1")                               # the files the viewer listed at start are gone
    r = client.get("/api/trajectories")
    assert r.status_code == 200 and len(r.json()["rows"]) == 8
    assert client.get("/trajectories").status_code == 200 and client.get("/runs").status_code == 200
    for tid, shard in list(before.items())[:2]:
        html = client.get(f"/t/{tid}?run=r1&lake=0&shard={shard}").text
        assert "answer from w-b" in html
    write_shard(root, [traj("r2", "z0", 0, workers=["w-a"], kind="answer")], "z0")
    client = TestClient(create_app([root], allowed_hosts=["testserver"]))
    for p in Path(root).glob("**/run_id=r2/**/*.parquet"):
        p.unlink()                                           # a removed shard
    r = client.get("/api/trajectories")
    assert r.status_code == 200 and {x["run_id"] for x in r.json()["rows"]} == {"r1"}
    assert client.get("/run/r2").status_code == 404


@pytest.mark.parametrize("offset", ["99999999999999999999", "1" * 5000])
def test_10_a_huge_offset_is_a_400_naming_it(offset, tmp_path):
    pytest.importorskip("duckdb")
    from starlette.testclient import TestClient

    from conductor.lake.view.app import create_app
    from conductor.lake.writer import write_shard
    from lake_records import traj

    root = str(tmp_path / "lake")
    write_shard(root, [traj("r1", "q0", 0, kind="answer")], "s0")
    client = TestClient(create_app([root], allowed_hosts=["testserver"]))
    for path in ("/api/trajectories", "/trajectories", "/compare?a=r1&b=r1"):
        sep = "&" if "?" in path else "?"
        r = client.get(f"{path}{sep}offset={offset}", headers={"accept": "application/json"})
        assert r.status_code == 400 and "offset" in r.text, (path, r.status_code, r.text[:300])


def test_10_lake_view_of_s3_without_credentials_is_refused_before_any_network_use(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(HOME=str(tmp_path), AWS_ENDPOINT_URL="http://192.0.2.1:9")    # TEST-NET: never answers
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "conductor", "lake", "view", "--lake", "s3://bucket/lake", "--port", "0"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120, env=env)
    one_error(r, "lake s3://bucket/lake: no S3 credentials", "AWS_ACCESS_KEY_ID")
    assert time.monotonic() - t0 < 30


def test_low_reload_redirects_only_to_a_page_of_the_viewer(tmp_path):
    pytest.importorskip("duckdb")
    from starlette.testclient import TestClient

    from conductor.lake.view.app import create_app
    from conductor.lake.writer import write_shard
    from lake_records import traj

    root = str(tmp_path / "lake")
    write_shard(root, [traj("r1", "q0", 0, kind="answer")], "s0")
    client = TestClient(create_app([root], allowed_hosts=["testserver"]), follow_redirects=False)
    r = client.post("/reload", headers={"referer": "https://evil.example/phish"})
    assert r.status_code == 303 and r.headers["location"] == "/runs"
    r = client.post("/reload", headers={"referer": "http://127.0.0.1:8765/trajectories?run=r1"})
    assert r.headers["location"] == "/trajectories?run=r1"


# --------------------------------------------------------------------------- the cheap Low items

def test_low_emulator_rpm_0_headroom_mistakes_and_a_compaction_that_merges_nothing(tmp_path):
    one_error(run("emulator", "--rpm", "0"), "--rpm 0")
    q = tmp_path / "one.jsonl"
    q.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    one_error(run("headroom", str(q), "--out", str(tmp_path / "h"), "--pool", SIM_POOL), "at least 2 questions")
    one_error(run("headroom", "--lake", str(tmp_path), "--out", str(tmp_path / "h"), "--cost-weight", "inf"),
              "--cost-weight inf")
    from conductor.lake.compact import compact
    from conductor.lake.writer import write_shard
    from lake_records import traj

    root = str(tmp_path / "lake")
    for i in range(2):
        write_shard(root, [traj("r1", f"q{i}", 0, kind="answer")], f"s{i}")
    line = compact(root, target_mb=0.0001).line()
    assert "nothing merged" in line and "--target-mb (0.0001 MB)" in line
