"""Issue #49 items 1 and 3: OpenAI request shapes for text chat, and the workers that answered, in every body.

The real openai SDK against a real `conductor serve` on loopback (simulated pool that knows the gold answers;
Mixture-of-Agents 0+1 -> 2, so every answer is three steps: sim-mathwiz, sim-scholar, then sim-generalist).
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.test_serve_support import keyed_server, questions, simulated_pool

KEY = "cnd-compat-key-0123456789abcdef"
KEY_ENV = "CONDUCTOR_TEST_COMPAT_KEYS"
ITEMS = questions(30)
MOA = ["sim-mathwiz", "sim-scholar", "sim-generalist"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compat")
    pool = simulated_pool(tmp, ITEMS, skills=1.0)
    with keyed_server(tmp, pool, KEY_ENV, KEY, max_input_chars=4000) as s:
        yield s


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)


def gold(i: int) -> str:
    return f"<answer>{ITEMS[i][1]}</answer>"


# ------------------------------------------------------------------------------------------------ item 1
@pytest.mark.parametrize("role", ["developer", "system"])
def test_a_developer_or_system_only_conversation_is_answered(client, role):
    r = client.chat.completions.create(model="conductor", messages=[{"role": role, "content": ITEMS[0][0]}])
    assert gold(0) in r.choices[0].message.content


def test_text_parts_names_and_the_ignored_parameters(client):
    r = client.chat.completions.create(
        model="conductor", seed=7, user="user-42", metadata={"team": "qa"}, store=True, top_p=0.5,
        messages=[{"role": "user", "content": [{"type": "text", "text": ITEMS[1][0]}], "name": "alice"}])
    assert gold(1) in r.choices[0].message.content


def test_n_stop_and_max_completion_tokens(client):
    r = client.chat.completions.create(model="conductor", n=2, messages=[{"role": "user", "content": ITEMS[2][0]}])
    assert [c.index for c in r.choices] == [0, 1] and all(gold(2) in c.message.content for c in r.choices)
    r = client.chat.completions.create(model="conductor", max_completion_tokens=2,
                                       messages=[{"role": "user", "content": ITEMS[2][0]}])
    assert r.choices[0].finish_reason == "length" and len(r.choices[0].message.content) <= 8
    r = client.chat.completions.create(model="conductor", stop=["<answer>"],
                                       messages=[{"role": "user", "content": ITEMS[2][0]}])
    assert "<answer>" not in r.choices[0].message.content and r.choices[0].finish_reason == "stop"
    for stop in (None, "<answer>"):     # null and a single string are OpenAI's other two forms (null once gave 500)
        r = client.chat.completions.create(model="conductor", stop=stop, messages=[{"role": "user", "content": ITEMS[2][0]}])
        text = r.choices[0].message.content or ""
        assert text and ("<answer>" in text) == (stop is None)


def test_a_null_max_completion_tokens_does_not_hide_max_tokens(server):
    r = httpx.post(f"{server.base_url}/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                   json={"model": "conductor", "max_tokens": 2, "max_completion_tokens": None,
                         "messages": [{"role": "user", "content": ITEMS[3][0]}]})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("kw, param, code", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}, "tools",
     "unsupported_parameter"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}},
     "response_format", "unsupported_parameter"),
    ({"response_format": {"type": "json_object"}}, "response_format", "unsupported_parameter"),
    ({"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}, "audio",
     "unsupported_parameter"),
    ({"logprobs": True}, "logprobs", "unsupported_parameter"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}]},
     "messages[0].content", "unsupported_content"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r", "tool_call_id": "c"}]},
     "messages[1].role", "unsupported_role"),
    ({"n": 0}, "n", "invalid_value"),
    ({"temperature": 3}, "temperature", "invalid_value"),
    ({"metadata": {"k": 1}}, "metadata.k", "invalid_type"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_value"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),
    ({"extra_body": {"conductor": {"max_steps": 0}}}, "conductor.max_steps", "invalid_controls"),
])
def test_what_the_conductor_cannot_do_is_refused_naming_the_parameter(client, kw, param, code):
    kw.setdefault("messages", [{"role": "user", "content": ITEMS[4][0]}])
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="conductor", **kw)
    assert e.value.status_code == 400 and e.value.param == param and e.value.code == code, e.value.body
    assert e.value.type == "invalid_request_error" and e.value.message


def test_responses_api_shapes(client):
    r = client.responses.create(model="conductor", input=[{"role": "developer", "content": ITEMS[5][0]}])
    assert gold(5) in r.output_text
    r = client.responses.create(model="conductor", instructions=ITEMS[6][0], metadata={"a": "b"}, store=False)
    assert gold(6) in r.output_text
    r = client.responses.create(model="conductor", text={"format": {"type": "text"}},
                                input=[{"role": "user", "content": [{"type": "input_text", "text": ITEMS[7][0]}]}])
    assert gold(7) in r.output_text
    for kw, param in [({"text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}}}},
                       "text"),
                      ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]}, "tools"),
                      ({"previous_response_id": "resp_1"}, "previous_response_id"),
                      ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
                       "input[0].content"),
                      ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input")]:
        kw.setdefault("input", ITEMS[7][0])
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model="conductor", **kw)
        assert e.value.param == param and e.value.code in ("unsupported_parameter", "unsupported_content"), kw


# ------------------------------------------------------------------------------------------------ item 3
def test_every_completion_names_the_workers_that_ran_without_their_text(client):
    r = client.chat.completions.create(model="conductor", messages=[{"role": "user", "content": ITEMS[8][0]}])
    ran = r.model_extra["conductor_workers"]
    assert ran == [{"index": 0, "workers": MOA, "steps": 3, "answered_by": "sim-generalist"}]
    assert "conductor_trace" not in r.model_extra and ITEMS[8][1] not in json.dumps(ran)
    r = client.chat.completions.create(model="conductor", n=2, messages=[{"role": "user", "content": ITEMS[9][0]}])
    assert [w["index"] for w in r.model_extra["conductor_workers"]] == [0, 1]
    o = client.responses.create(model="conductor", input=ITEMS[10][0])
    assert o.model_extra["conductor_workers"][0]["workers"] == MOA


def test_budget_stopped_steps_are_not_counted(client):
    r = client.chat.completions.create(model="conductor", messages=[{"role": "user", "content": ITEMS[11][0]}],
                                       extra_body={"conductor": {"max_cost": 0.0001}})
    ran = r.model_extra["conductor_workers"][0]
    assert 1 <= ran["steps"] < 3 and ran["steps"] == r.usage.model_dump()["worker_calls"]


@pytest.mark.parametrize("include_usage", [False, True])
def test_the_last_stream_chunk_names_the_workers(client, include_usage):
    chunks = list(client.chat.completions.create(
        model="conductor", stream=True, messages=[{"role": "user", "content": ITEMS[12][0]}],
        **({"stream_options": {"include_usage": True}} if include_usage else {})))
    assert chunks[-1].model_extra["conductor_workers"][0]["workers"] == MOA
    assert (chunks[-1].usage is not None) == include_usage
    assert all("conductor_workers" not in (c.model_extra or {}) for c in chunks[:-1])
    assert gold(12) in "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
