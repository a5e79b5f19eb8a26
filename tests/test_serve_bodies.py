"""Issue #51 items 1-2: `conductor serve` survives any request body.

A body nested 200,000 levels deep is a 400 (it killed the process, and the unflushed lake rows with it); a chunked
body is refused as soon as it passes the size cap (it was buffered whole first); and a fuzz test throws
hypothesis-generated bodies (depth, size, chunking, encodings, JSON types in every field) at a real
`python -m conductor serve` process, which must answer each with 200 or an OpenAI error object and stay up.
Each of the first two failed on the code before the fix (a dead server; no answer until the body ended).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_serve_support import ROOT, free_port, keyed_server, questions, simulated_pool

KEY = "cnd-body-key-0123456789abcdef"
KEY_ENV = "CONDUCTOR_TEST_BODY_KEYS"
ITEMS = questions(8)
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}


@contextmanager
def serve_process(tmp: Path, run_id: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """The real command (default 1 MB body cap) with one API key; SIGTERM at the end, which must exit 0."""
    pool = simulated_pool(tmp, ITEMS, skills=1.0)
    port = free_port()
    env = {**os.environ, "CONDUCTOR_SERVE_API_KEYS": f"tester={KEY}", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "conductor", "serve", "--pool", str(pool), "--conductor", "fixed:0",
                             "--port", str(port), "--lake", str(tmp / "lake"), "--registry", str(tmp / "r"),
                             "--run-id", run_id, "--key-rpm", "0"],
                            stderr=subprocess.PIPE, env=env, cwd=ROOT)
    root = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{root}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-2000:]
            time.sleep(0.1)
        yield root, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)


def chat_body(i: int) -> dict:
    return {"model": "conductor", "messages": [{"role": "user", "content": ITEMS[i][0]}]}


def test_a_deeply_nested_body_is_a_400_and_the_server_keeps_its_unflushed_rows(tmp_path):
    from conductor.lake.reader import load_trajectories

    with serve_process(tmp_path, "served-deep") as (root, proc):
        for i in range(3):
            r = httpx.post(f"{root}/v1/chat/completions", json=chat_body(i), headers=AUTH, timeout=60)
            assert r.status_code == 200, r.text
        deep = b'{"model": "conductor", "messages": [{"role": "user", "content": "hi"}], "metadata": ' \
               + b"[" * 200_000 + b"]" * 200_000 + b"}"
        assert 390_000 < len(deep) < 1_000_000
        r = httpx.post(f"{root}/v1/chat/completions", content=deep, headers=AUTH, timeout=60)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "invalid_json" and "recursion limit" in err["message"]
        assert proc.poll() is None
        assert httpx.get(f"{root}/health", timeout=5).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    assert len(load_trajectories(str(tmp_path / "lake"), "served-deep", kind="served")) == 3


@pytest.fixture(scope="module")
def small_cap(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cap")
    pool = simulated_pool(tmp, ITEMS, skills=1.0)
    with keyed_server(tmp, pool, KEY_ENV, KEY, max_body_bytes=20_000) as s:
        yield s


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def test_a_chunked_body_is_refused_once_it_passes_the_cap_not_after_it_ends(small_cap):
    """The client sends 5 x the cap in chunks and never ends the body: the 413 must come anyway."""
    with socket.create_connection(("127.0.0.1", small_cap.port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  + f"Authorization: Bearer {KEY}\r\n".encode()
                  + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        s.sendall(_chunk(b'{"model": "conductor", "metadata": {"pad": "'))
        for _ in range(10):
            s.sendall(_chunk(b"x" * 10_000))
        head = b""
        try:
            while b"\r\n\r\n" not in head:
                got = s.recv(65536)
                if not got:
                    break
                head += got
        except TimeoutError:
            pytest.fail("no answer while the chunked body is still open: the server waits for all of it")
    assert head.startswith(b"HTTP/1.1 413"), head[:200]
    body = head.split(b"\r\n\r\n", 1)[1]
    assert b"request_too_large" in body or not body


def test_a_chunked_body_under_the_cap_is_answered(small_cap):
    payload = json.dumps(chat_body(0)).encode()
    r = httpx.post(f"{small_cap.base_url}/chat/completions", headers=AUTH,
                   content=(payload[i:i + 7] for i in range(0, len(payload), 7)))   # an iterator: chunked
    assert r.status_code == 200, r.text
    assert f"<answer>{ITEMS[0][1]}</answer>" in r.json()["choices"][0]["message"]["content"]


# ---------------------------------------------------------------------------------------------------- the fuzz
CAP = 1_000_000                     # the served process's default body cap
FIELDS = ("model", "messages", "n", "stop", "temperature", "seed", "max_tokens", "max_completion_tokens", "stream",
          "stream_options", "user", "metadata", "store", "tools", "response_format", "conductor", "input",
          "instructions", "top_p", "logprobs", "modalities", "text")
scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
           | st.text(max_size=20) | st.sampled_from(["conductor", "user", "system", "developer", "text", ITEMS[0][0]]))
json_values = st.recursive(scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(
    st.sampled_from(["role", "content", "type", "text", "name", "workers", "max_cost", "trace", "x"]) | st.text(max_size=6),
    c, max_size=4), max_leaves=16)


@st.composite
def bodies(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str], int | None]:
    """(path, raw body, extra headers, chunk size or None): a valid request with fields replaced by any JSON, then
    perhaps nested deep, padded past the cap, re-encoded or cut, and sent in chunks."""
    path = draw(st.sampled_from(["/v1/chat/completions", "/v1/responses"]))
    body: dict = ({"model": "conductor", "input": ITEMS[1][0]} if path == "/v1/responses" else chat_body(1))
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=4, unique=True)):
        body[name] = draw(json_values)
    if draw(st.booleans()):
        body["messages"] = [{"role": draw(st.sampled_from(["user", "system", "developer", "assistant", "tool", "x"])),
                             "content": draw(json_values), **draw(st.dictionaries(st.sampled_from(
                                 ["name", "tool_calls", "refusal"]), json_values, max_size=2))}]
    text = json.dumps(body)
    depth = draw(st.sampled_from([0, 0, 0, 150, 250, 5_000, 200_000]))
    if depth:
        opener = draw(st.sampled_from(["[", '{"a":', "[{\"b\":"]))
        closer = {"[": "]", '{"a":': "}", "[{\"b\":": "}]"}[opener] if draw(st.booleans()) else ""
        text = text[:-1] + ', "metadata": ' + opener * depth + "1" + closer * depth + "}"
    pad = draw(st.sampled_from([0] * 8 + [10_000, CAP - 200, CAP + 1, CAP * 3 // 2]))
    if pad:
        text = text[:-1] + ', "user": "' + "p" * pad + '"}'
    encoding = draw(st.sampled_from(["utf-8", "utf-8", "utf-8", "utf-16", "utf-32", "utf-8-sig", "latin-1", "cut",
                                     "garbage"]))
    if encoding == "cut":
        raw = text.encode()[: draw(st.integers(0, len(text)))]
    elif encoding == "garbage":
        raw = draw(st.binary(max_size=200))
    else:
        raw = text.encode(encoding, errors="replace")
    headers = dict(AUTH)
    if draw(st.booleans()):
        headers["Content-Encoding"] = draw(st.sampled_from(["gzip", "br", "identity"]))
    chunk = draw(st.sampled_from([None, None, 1, 7, 4096, 65536] if len(raw) < 20_000 else [None, 65536]))
    return path, raw, headers, chunk


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    with serve_process(tmp_path_factory.mktemp("fuzz"), "served-fuzz") as (root, proc):
        yield root, proc


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=bodies())
def test_the_server_survives_any_body(fuzz_server, case):
    root, proc = fuzz_server
    path, raw, headers, chunk = case
    content = raw if chunk is None else (raw[i:i + chunk] for i in range(0, len(raw), chunk))
    try:
        r = httpx.post(root + path, content=content, headers=headers, timeout=120)
    except httpx.TransportError:
        assert len(raw) > CAP, "the connection broke on a body under the cap"   # a 413 sent mid-upload
    else:
        assert r.status_code in (200, 400, 404, 413, 502), (r.status_code, r.text[:500])
        if r.status_code != 200:
            err = r.json()["error"]
            assert err["message"] and err["type"] and err["code"] and "Traceback" not in r.text
        if len(raw) > CAP:
            assert r.status_code == 413
    assert proc.poll() is None, "the server died"


def test_after_the_fuzz_the_server_still_answers_and_exits_cleanly(fuzz_server):
    root, proc = fuzz_server
    r = httpx.post(f"{root}/v1/chat/completions", json=chat_body(2), headers=AUTH, timeout=60)
    assert r.status_code == 200 and f"<answer>{ITEMS[2][1]}</answer>" in r.json()["choices"][0]["message"]["content"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
