"""`conductor serve` checks its options and its lake at start, keeps every served row or says so (issue #51):
one id per streamed answer, no 200 without a workflow, keyless servers answer loopback only, an unreadable
registry keeps the champion.

Real components only: the real typer app in-process (commands that stop at their checks), the real server on
loopback driven by the openai SDK and httpx, real Parquet lakes and registries. Each test failed on the code
before the fix.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
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
