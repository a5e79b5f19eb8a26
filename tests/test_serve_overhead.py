"""The server's own time (total minus the time waiting on workers), as gateways report theirs: the
``x-conductor-overhead-ms`` header on every response and the ``conductor_serve_overhead_seconds`` histogram,
driven through the real ``openai`` SDK against `conductor serve` on loopback over the simulated pool."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import openai
import pytest

from conductor.serve.config import ServeConfig
from tests.test_serve_support import LiveServer, questions, simulated_pool

LATENCY_S = 0.3     # per worker call; moa:0+1:2 = two proposers at once, then the aggregator: ~0.6 s of waiting


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("overhead")
    pool = simulated_pool(tmp, questions(8), latency_s=LATENCY_S)
    cfg = ServeConfig(pool=str(pool), conductor="moa:0+1:2", registry=str(tmp / "registry"), reload_s=0)
    with LiveServer(cfg) as s:
        openai.OpenAI(base_url=s.base_url, api_key="k", max_retries=0).chat.completions.create(
            model="conductor", messages=[{"role": "user", "content": questions(3)[2][0]}])   # first-request imports
        yield s


def _total_ms(server_timing: str) -> float:
    found = re.search(r"total;dur=([0-9.]+)", server_timing)
    assert found, server_timing
    return float(found.group(1))


def test_the_header_is_the_total_minus_the_wait_on_workers(server: LiveServer) -> None:
    c = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    raw = c.chat.completions.with_raw_response.create(model="conductor",
                                                      messages=[{"role": "user", "content": questions(1)[0][0]}])
    assert raw.parse().choices[0].message.content
    overhead = float(raw.headers["x-conductor-overhead-ms"])
    total = _total_ms(raw.headers["server-timing"])
    waited = total - overhead
    # the two rounds of worker calls (~600 ms) are in the total and not in the overhead; the two parallel
    # proposers count once (twice: ~900 ms); what is left is the server's own time
    assert 0 <= overhead and 2 * LATENCY_S * 1000 * 0.95 <= waited < 2.5 * LATENCY_S * 1000, (overhead, total)


def test_every_response_carries_it_and_the_histogram_counts_streams(server: LiveServer) -> None:
    c = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    for path in ("/health", "/v1/models", "/metrics", "/no/such/path"):
        r = httpx.get(server.root + path)
        assert float(r.headers["x-conductor-overhead-ms"]) >= 0, path
    bad = httpx.post(server.base_url + "/chat/completions", content=b"{not json",   # declared JSON: a keyless
                     headers={"content-type": "application/json"})                 # server refuses others (415)
    assert bad.status_code == 400 and float(bad.headers["x-conductor-overhead-ms"]) >= 0
    with c.chat.completions.with_streaming_response.create(
            model="conductor", stream=True, messages=[{"role": "user", "content": questions(2)[1][0]}]) as s:
        assert float(s.headers["x-conductor-overhead-ms"]) >= 0      # the time to the first byte
        assert "".join(chunk.choices[0].delta.content or "" for chunk in s.parse() if chunk.choices)

    text = httpx.get(server.root + "/metrics").text
    count = re.search(r'^conductor_serve_overhead_seconds_count\{endpoint="chat"\} ([0-9.e+]+)$', text, re.M)
    total = re.search(r'^conductor_serve_overhead_seconds_sum\{endpoint="chat"\} ([0-9.e+-]+)$', text, re.M)
    assert count and total, text[:2000]
    assert float(count.group(1)) >= 2                         # the bad body and the stream (and earlier requests)
    # the stream's ~0.6 s of worker calls are not in it
    assert float(total.group(1)) < 0.25 * 2 * LATENCY_S * float(count.group(1))
    assert 'conductor_serve_overhead_seconds_count{endpoint="other"}' in text and "/no/such/path" not in text


def test_the_answer_routes_fast_path_leaves_other_methods_to_the_router(server: LiveServer) -> None:
    """POST to the answer routes goes straight to its handler (``Front``); any other method on the same paths still
    gets the router's OpenAI-shaped 405, and a path beside them its 404, each with the overhead header."""
    for path in ("/v1/chat/completions", "/v1/responses"):
        r = httpx.get(server.root + path)
        assert r.status_code == 405, (path, r.text)
        assert r.json()["error"]["code"] == "method_not_allowed" and path in r.json()["error"]["message"]
        assert float(r.headers["x-conductor-overhead-ms"]) >= 0
    r = httpx.post(server.root + "/v1/chat/completion", json={"model": "conductor", "messages": []})
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert float(r.headers["x-conductor-overhead-ms"]) >= 0
    ok = httpx.post(server.base_url + "/responses", json={"model": "conductor", "input": questions(4)[3][0]},
                    timeout=30)
    assert ok.status_code == 200 and ok.json()["object"] == "response", ok.text


def test_outside_a_server_nothing_is_counted(tmp_path: Path) -> None:
    """The executor's wrapper has no clock to tick outside a request (bulk runs, the benches)."""
    from conductor.execution.upstream import UPSTREAM, awaiting_upstream

    assert UPSTREAM.get() is None
    with awaiting_upstream():
        pass
    assert UPSTREAM.get() is None
