"""`conductor serve` driven by the real openai SDK (sync, async, streaming, errors) on loopback, over the
simulated pool (workers know the gold answers through options.gold_path; see tests/test_serve_support.py)."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import openai
import pytest

from tests.test_serve_support import keyed_server, questions, simulated_pool

KEY = "cnd-test-key-0123456789abcdef"
KEY_ENV = "CONDUCTOR_TEST_SERVE_KEYS"
ITEMS = questions(80)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    pool = simulated_pool(tmp, ITEMS, skills=1.0)
    with keyed_server(tmp, pool, KEY_ENV, KEY, max_input_chars=2000, max_body_bytes=20_000) as s:
        yield s


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)


def ask(client, i: int, **kw):
    return client.chat.completions.create(model="conductor", messages=[{"role": "user", "content": ITEMS[i][0]}], **kw)


def test_sync_chat_completion_answers_with_usage_cost_and_no_extra_field(client):
    raw = client.chat.completions.with_raw_response.create(
        model="conductor", messages=[{"role": "user", "content": ITEMS[0][0]}])
    r = raw.parse()
    assert f"<answer>{ITEMS[0][1]}</answer>" in r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop" and r.model == "conductor@moa:0+1:2"
    u = r.usage.model_dump()
    assert u["orchestration_input_tokens"] > u["prompt_tokens"] > 0 and u["orchestration_output_tokens"] > 0
    assert u["worker_calls"] == 3 and u["cost"] > 0
    assert float(raw.headers["x-conductor-cost"]) == pytest.approx(u["cost"])
    assert "conductor_trace" not in (r.model_extra or {})


def test_trace_by_body_field_or_header(client):
    r = ask(client, 1, extra_body={"conductor": {"trace": True}})
    tr = r.model_extra["conductor_trace"]
    steps = tr["choices"][0]["rounds"][0]["steps"]
    assert [s["worker"] for s in steps] == ["sim-mathwiz", "sim-scholar", "sim-generalist"]
    assert steps[2]["access"] == "all" and steps[0]["access"] == []
    assert all({"subtask", "input_tokens", "output_tokens", "cost", "seconds"} <= s.keys() for s in steps)
    assert sum(s["cost"] for s in steps) == pytest.approx(r.usage.model_dump()["cost"])
    r2 = ask(client, 1, extra_headers={"X-Conductor-Trace": "enabled"})
    assert r2.model_extra["conductor_trace"]["checkpoint"] == "moa:0+1:2"


def test_streaming_sends_the_answer_then_usage_and_trace_last_before_done(server, client):
    chunks = list(ask(client, 2, stream=True, stream_options={"include_usage": True},
                      extra_body={"conductor": {"trace": True}}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert f"<answer>{ITEMS[2][1]}</answer>" in text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    last = chunks[-1]
    assert last.choices == [] and last.usage.total_tokens > 0 and "conductor_trace" in last.model_extra
    assert text == ask(client, 2).choices[0].message.content
    # without trace or include_usage: nothing extra, and the raw stream ends with [DONE]
    body = httpx.post(f"{server.base_url}/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": "conductor", "stream": True,
                            "messages": [{"role": "user", "content": ITEMS[2][0]}]}).text
    events = [e.removeprefix("data: ") for e in body.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]" and "conductor_trace" not in body and '"usage"' not in body


def test_async_clients_share_one_executor(server):
    async def main():
        c = openai.AsyncOpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)
        rs = await asyncio.gather(*(c.chat.completions.create(
            model="conductor", messages=[{"role": "user", "content": ITEMS[10 + i][0]}]) for i in range(24)))
        await c.close()
        return rs
    calls_before = server.engine.executor.stats["calls"]
    rs = asyncio.run(main())
    assert all(f"<answer>{ITEMS[10 + i][1]}</answer>" in r.choices[0].message.content for i, r in enumerate(rs))
    assert server.engine.executor.stats["calls"] - calls_before == 24 * 3


def test_responses_api_text_in_text_out(client):
    r = client.responses.create(model="conductor", input=ITEMS[3][0])
    assert f"<answer>{ITEMS[3][1]}</answer>" in r.output_text and r.status == "completed"
    assert r.usage.model_dump()["cost"] > 0 and r.usage.output_tokens > 0


def test_n_stop_and_max_tokens_are_honoured(client):
    r = ask(client, 4, n=3, seed=7, temperature=0.5)
    assert [c.index for c in r.choices] == [0, 1, 2] and r.usage.model_dump()["worker_calls"] == 9
    r = ask(client, 4, stop=["<answer>"])
    assert "<answer>" not in r.choices[0].message.content and r.choices[0].finish_reason == "stop"
    r = ask(client, 4, max_tokens=3)
    assert len(r.choices[0].message.content) <= 12 and r.choices[0].finish_reason == "length"


def test_controls_restrict_the_pool_and_steps(client):
    r = ask(client, 5, extra_body={"conductor": {"workers": ["sim-budget", "sim-generalist", "sim-scholar", "sim-mathwiz"],
                                                 "exclude_workers": ["sim-scholar"], "trace": True}})
    tr = r.model_extra["conductor_trace"]
    assert tr["workers"] == ["sim-mathwiz", "sim-generalist", "sim-budget"]   # manifest order
    assert [s["worker"] for s in tr["choices"][0]["rounds"][0]["steps"]] == tr["workers"]
    with pytest.raises(openai.BadRequestError) as e:   # moa:0+1:2 needs three workers
        ask(client, 5, extra_body={"conductor": {"exclude_workers": ["sim-budget", "sim-scholar"]}})
    assert e.value.code == "invalid_controls"
    with pytest.raises(openai.BadRequestError) as e:   # and three steps
        ask(client, 5, extra_body={"conductor": {"max_steps": 2}})
    assert e.value.code == "invalid_controls" and "3 steps" in e.value.message


def test_max_cost_stops_at_the_last_affordable_step_and_says_so(client):
    raw = client.chat.completions.with_raw_response.create(
        model="conductor", messages=[{"role": "user", "content": ITEMS[6][0]}],
        extra_body={"conductor": {"max_cost": 0.0001, "trace": True}})
    r = raw.parse()
    tr = r.model_extra["conductor_trace"]["choices"][0]
    statuses = [s["status"] for s in tr["rounds"][0]["steps"]]
    assert "skipped_budget" in statuses and statuses.count("ok") >= 1
    assert "budget" in tr["budget_stop"] and raw.headers["x-conductor-budget-stop"] == "true"
    assert r.choices[0].message.content          # the answer of the last step that ran
    assert r.usage.model_dump()["worker_calls"] == statuses.count("ok")


@pytest.mark.parametrize("body, status, code", [
    (b"{not json", 400, "invalid_json"),
    (json.dumps({"model": "conductor", "messages": []}).encode(), 400, "empty_messages"),
    (json.dumps({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}).encode(), 404, "model_not_found"),
    (json.dumps({"model": "conductor", "messages": [{"role": "user", "content": "x" * 3000}]}).encode(), 400,
     "context_length_exceeded"),
    (json.dumps({"model": "conductor", "messages": [{"role": "user", "content": "x" * 30000}]}).encode(), 413,
     "request_too_large"),
    (json.dumps({"model": "conductor", "messages": [{"role": "user", "content": "hi"}],
                 "conductor": {"max_cost": -1}}).encode(), 400, "invalid_controls"),
    (json.dumps({"model": "conductor", "messages": [{"role": "user", "content": "hi"}],
                 "conductor": {"budget": 1}}).encode(), 400, "invalid_controls"),
    (json.dumps({"model": "conductor", "messages": [{"role": "user", "content": "hi"}],
                 "tools": [{"type": "function", "function": {"name": "f"}}]}).encode(), 400, "unsupported_parameter"),
    (json.dumps({"model": "conductor", "messages": [{"role": "user", "content": "hi"}], "n": 99}).encode(), 400,
     "invalid_value"),
])
def test_bad_requests_get_openai_error_objects(server, body, status, code):
    r = httpx.post(f"{server.base_url}/chat/completions", content=body,
                   headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["type"] and err["message"] and "Traceback" not in r.text


def test_sdk_raises_typed_errors(server, client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="conductor", messages=[])
    bad = openai.OpenAI(base_url=server.base_url, api_key="wrong-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.chat.completions.create(model="conductor", messages=[{"role": "user", "content": "hi"}])
    assert e.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    with pytest.raises(openai.InternalServerError) as e:   # no worker can answer an unknown question: 502
        client.chat.completions.create(model="conductor", messages=[{"role": "user", "content": "unknown?"}])
    assert e.value.status_code == 502 and e.value.code == "upstream_failure"
    r = httpx.get(f"{server.root}/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_keys_never_reach_logs(server, caplog):
    caplog.set_level(logging.DEBUG)
    bad = openai.OpenAI(base_url=server.base_url, api_key="sk-secret-never-logged-123456", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="conductor", messages=[{"role": "user", "content": "hi"}])
    ask(openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0), 7)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "sk-secret-never-logged" not in text and KEY not in text


def test_models_health_and_metrics(server, client):
    ids = [m.id for m in client.models.list().data]
    assert ids[0] == "conductor" and "conductor@moa:0+1:2" in ids
    h = httpx.get(f"{server.root}/health").json()
    assert h["status"] == "ok" and h["pool"] == "simulated-4@v1" and h["default"] == "moa:0+1:2"
    ask(client, 8)
    m = httpx.get(f"{server.root}/metrics")
    assert m.headers["content-type"].startswith("text/plain")
    for name in ("conductor_serve_requests_total", "conductor_serve_request_seconds_bucket",
                 "conductor_serve_worker_calls_total", "conductor_serve_dollars_total",
                 "conductor_serve_errors_total"):
        assert name in m.text, name


def test_served_traffic_lands_in_the_lake_redacted(server, client):
    from conductor.lake.reader import open_lake

    ask(client, 9)
    server.engine.writer.flush()
    lake = open_lake(server.engine.config.lake)
    rows = lake.scan("trajectories", kind="served").collect().to_dicts()
    assert rows and {r["kind"] for r in rows} == {"served"}
    assert all(r["question"].startswith("[REDACTED:") for r in rows)
    assert all(r["checkpoint_id"] == "moa:0+1:2" and r["pool_id"] == "simulated-4@v1" for r in rows)
    assert any(r["cost_usd"] > 0 and r["wall_s"] > 0 for r in rows)
    assert not any(ITEMS[9][0][:40] in json.dumps(r, default=str) for r in rows)


def test_errors_inside_a_stream_and_on_the_responses_api(client):
    stream = client.chat.completions.create(model="conductor", stream=True,
                                            messages=[{"role": "user", "content": "a question nobody recorded"}])
    with pytest.raises(openai.APIError) as e:
        list(stream)
    assert "upstream" in str(e.value.body) or "infrastructure" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="conductor", input=ITEMS[0][0], stream=True)
    assert e.value.code == "unsupported_parameter"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="conductor", input="")
    assert e.value.code == "empty_input"


def test_nothing_stays_held_after_answers_streams_and_errors(server, client):
    list(ask(client, 11, stream=True))
    with pytest.raises(openai.BadRequestError):
        ask(client, 11, extra_body={"conductor": {"max_steps": 2}})
    srv = server.app.state.server
    assert srv.clients._local["tester"].in_flight == 0
    assert server.engine.default.in_flight == 0
