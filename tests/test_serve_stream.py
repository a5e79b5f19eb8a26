"""`stream: true` sends the answer as the last worker produces it: the real server, the real openai SDK, and the
provider emulator streaming the last step's reply on loopback (conductor/serve/stream.py).

The ordering test is deterministic, not timed: the emulator sends a few pieces of the reply and then waits
until the test releases it, which the test does only once its client holds the first piece of content. A
server that buffered the reply would never deliver that piece (the client's read times out instead)."""

from __future__ import annotations

import json

import openai
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from conductor.serve.render import answer_of
from conductor.serve.requests import ServeRequest
from conductor.serve.stream import AnswerStream, releasable
from conductor.testing.emulator import Emulator
from conductor.trajectory import Trajectory
from tests.test_serve_support import keyed_server, questions, simulated_pool

KEY = "cnd-stream-key-0123456789abcdef"
KEY_ENV = "CONDUCTOR_TEST_STREAM_KEYS"
ITEMS = questions(20, offset=900)
PREFIX = "Let me think about this question step by step before I answer it. "
FAULTY_REPLY = "Adding the two counts together.\n<answer>61</answer>"


@pytest.fixture(scope="module")
def emu():
    with Emulator() as e:
        yield e


@pytest.fixture(scope="module")
def server(tmp_path_factory, emu):
    """Pool: two simulated proposers, then emulator workers (the clean writer, and a faulty one) as the
    aggregator of ``moa:0+1:2`` (the controls pick which)."""
    tmp = tmp_path_factory.mktemp("serve-stream")
    path = simulated_pool(tmp, ITEMS, skills=1.0)
    doc = yaml.safe_load(path.read_text())
    sims = [w for w in doc["workers"] if w["name"] in ("sim-mathwiz", "sim-scholar")]
    emu_worker = {"provider": "openai_compatible", "base_url": f"{emu.base_url}/v1", "sampling": {"max_tokens": 512},
                  "price": {"input_per_mtok": 1.0, "output_per_mtok": 2.0},
                  "limits": {"timeout_s": 60, "max_retries": 0, "max_concurrency": 16}}
    doc["workers"] = [*sims, {"name": "writer", "model": "writer-model", **emu_worker},
                      {"name": "faulty", "model": "faulty-model", "faults": {"seed": 1, "wrong_answer": 1.0},
                       **emu_worker}]
    path.write_text(yaml.safe_dump(doc))
    with keyed_server(tmp, path, KEY_ENV, KEY) as s:
        yield s


@pytest.fixture
def client(server, emu):
    emu.configure(stream_pause_after=None, stream_delay_s=0.0, reply_prefix=PREFIX,
                  scripted=[{"match": "", "reply": FAULTY_REPLY, "model": "faulty-model"}])
    emu.reset()
    return openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=10)


def ask(client, i: int, **kw):
    return client.chat.completions.create(model="conductor", messages=[{"role": "user", "content": ITEMS[i][0]}], **kw)


def content(chunks) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_first_content_arrives_before_the_last_worker_has_finished(client, emu):
    emu.configure(stream_pause_after=4)
    stream = ask(client, 0, stream=True, stream_options={"include_usage": True}, extra_body={"conductor": {"trace": True}})
    chunks = iter(stream)
    first = []
    for c in chunks:
        first.append(c)
        if content([c]):
            break
    assert content(first) and PREFIX.startswith(content(first))
    assert emu.streams() == {"paused": 1, "finished": 0}     # the writer's reply is provably unfinished
    emu.release_streams()
    rest = list(chunks)
    assert emu.streams()["finished"] == 1
    streamed = content(first + rest)
    last = rest[-1]
    assert last.choices == [] and last.usage.total_tokens > 0
    whole = ask(client, 0, extra_body={"conductor": {"trace": True}})
    assert streamed == whole.choices[0].message.content and streamed.startswith(PREFIX + "reply from writer-model")
    assert [c.choices[0].finish_reason for c in rest if c.choices][-1] == "stop"
    # the records are those of the non-streamed path: same tokens, dollars and usage
    steps = [s for s in last.model_extra["conductor_trace"]["choices"][0]["rounds"][0]["steps"]]
    whole_steps = whole.model_extra["conductor_trace"]["choices"][0]["rounds"][0]["steps"]
    keys = ("worker", "input_tokens", "output_tokens", "cost", "status")
    assert [{k: s[k] for k in keys} for s in steps] == [{k: s[k] for k in keys} for s in whole_steps]
    assert steps[-1]["worker"] == "writer"
    u, w = last.usage.model_dump(), whole.usage.model_dump()
    assert {k: u[k] for k in ("completion_tokens", "orchestration_output_tokens", "cost")} == \
        {k: w[k] for k in ("completion_tokens", "orchestration_output_tokens", "cost")}
    bodies = [r["body"] for r in emu.requests() if r["model"] == "writer-model"]
    assert [b.get("stream", False) for b in bodies] == [True, False]


def test_the_lake_rows_of_a_streamed_request_match_the_non_streamed_ones(server, client):
    from conductor.lake.reader import open_lake

    streamed = content(list(ask(client, 1, stream=True)))
    whole = ask(client, 1).choices[0].message.content
    assert streamed == whole
    server.engine.writer.flush()
    lake = open_lake(server.engine.config.lake)
    rows = [r for r in lake.scan("trajectories", kind="served").collect().to_dicts() if r["final_answer"] == whole]
    assert len(rows) == 2
    drop = {"trajectory_id", "question_id", "wall_s", "conductor_s", "created_at", "row_id", "shard"}
    a, b = ({k: v for k, v in r.items() if k not in drop and "time" not in k} for r in rows)
    assert a == b and a["cost_usd"] > 0 and a["n_calls"] == 3
    calls = lake.scan("calls", kind="served").collect().to_dicts()
    keep = ("step", "worker", "response", "finish_reason", "input_tokens", "output_tokens", "cost_usd", "retries",
            "error", "fault", "messages_hash", "cache_hit")
    per = [sorted(tuple(c[k] for k in keep) for c in calls if c["trajectory_id"] == r["trajectory_id"]) for r in rows]
    assert per[0] == per[1] and len(per[0]) == 3


def test_a_faulty_last_worker_streams_only_its_faulty_reply(client, emu):
    controls = {"conductor": {"workers": ["sim-mathwiz", "sim-scholar", "faulty"]}}
    chunks = list(ask(client, 2, stream=True, extra_body=controls))
    streamed = content(chunks)
    whole = ask(client, 2, extra_body=controls).choices[0].message.content
    assert streamed == whole and "<answer>" in streamed
    assert "<answer>61</answer>" not in streamed                  # the real reply never reaches the client
    assert all("61" not in (c.choices[0].delta.content or "") for c in chunks if c.choices)
    bodies = [r["body"] for r in emu.requests() if r["model"] == "faulty-model"]
    assert bodies and not any(b.get("stream") for b in bodies)   # buffered: faults rewrite the whole reply


def test_a_stop_sequence_split_across_deltas_is_never_sent(client, emu):
    emu.configure(stream_delay_s=0.01)
    stop = ["step by"]                       # the emulator sends "... step " and "by " as separate pieces
    chunks = list(ask(client, 3, stream=True, stop=stop))
    streamed = content(chunks)
    assert streamed == "Let me think about this question "
    assert all("step" not in (c.choices[0].delta.content or "") for c in chunks if c.choices)
    assert streamed == ask(client, 3, stop=stop).choices[0].message.content
    limited = content(list(ask(client, 3, stream=True, max_tokens=4)))
    assert limited == ask(client, 3, max_tokens=4).choices[0].message.content == PREFIX[:16]


def test_budget_stop_sends_the_last_step_that_ran_whole(client):
    r = ask(client, 4, extra_body={"conductor": {"max_cost": 1e-9, "trace": True}})
    chunks = list(ask(client, 4, stream=True, extra_body={"conductor": {"max_cost": 1e-9, "trace": True}}))
    assert content(chunks) == r.choices[0].message.content
    assert "budget" in chunks[-1].model_extra["conductor_trace"]["choices"][0]["budget_stop"]


def test_non_streamed_responses_are_unchanged(client, emu):
    raw = client.chat.completions.with_raw_response.create(
        model="conductor", messages=[{"role": "user", "content": ITEMS[5][0]}])
    r = raw.parse()
    body = json.loads(raw.text)
    assert set(body) == {"id", "object", "created", "model", "system_fingerprint", "choices", "usage",
                         "conductor_workers"}     # #49: the workers that ran, always
    assert r.choices[0].message.content.startswith(PREFIX) and r.choices[0].finish_reason == "stop"
    assert not any(b["body"].get("stream") for b in emu.requests())


# ------------------------------------------------------------------ the hold-back rule, for any split

_TEXT = st.text(alphabet="ab <>/x\n", max_size=40)


@settings(max_examples=300, deadline=None)
@given(text=_TEXT, cuts=st.lists(st.integers(0, 40), max_size=8),
       stop=st.lists(st.text(alphabet="ab <>/x", min_size=1, max_size=4), max_size=3),
       max_tokens=st.none() | st.integers(1, 8), retry_at=st.none() | st.integers(0, 40))
def test_what_is_streamed_is_always_the_beginning_of_the_answer(text, cuts, stop, max_tokens, retry_at):
    req = ServeRequest("chat", "conductor", "q", stop=stop, max_tokens=max_tokens, stream=True)
    answer = AnswerStream(1, 0, stop, max_tokens)
    sink = answer.sink_for(0, 0)
    assert sink is not None and answer.sink_for(0, 1) is None and answer.sink_for(1, 0) is None
    sent = []

    def feed(pieces: list[str]) -> None:
        sink.start()
        for p in pieces:
            sink.delta(p)
            sent.extend(t for _, t in answer.pending())

    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    if retry_at is not None:                 # a failed attempt, then the retry says the same again
        feed([text[:retry_at]])
    feed(pieces)
    final, _ = answer_of(Trajectory("t", "r", "served", "q", "served", "free", "q", final_answer=text), req)
    rest = sink.finish(final)
    assert rest is not None and "".join(sent) + rest == final
    ready, _ = releasable(text, stop, None if max_tokens is None else max_tokens * 4)
    assert final.startswith(ready)


def test_a_retry_that_says_something_else_ends_the_stream_with_an_error_not_a_wrong_answer():
    from conductor.serve.errors import APIError
    from conductor.serve.render import stream_tail

    answer = AnswerStream(1, 0)
    sink = answer.sink_for(0, 0)
    sink.start()
    sink.delta("The answer is 41 and")
    assert answer.pending() == [(0, "The answer is 41 ")]
    sink.start()                                   # the call failed mid-stream; its retry differs
    sink.delta("I think it is 42 now")
    assert answer.pending() == [] and sink.diverged
    assert sink.finish("I think it is 42 now") is None

    class Out:                                     # what stream_tail reads of an Outcome
        model = type("M", (), {"model_id": "conductor@x"})()
        trajectories = [Trajectory("t", "r", "served", "q", "served", "free", "q", final_answer="I think it is 42")]

    req = ServeRequest("chat", "conductor", "q", stream=True)
    with pytest.raises(APIError) as e:
        stream_tail(Out(), req, False, "chatcmpl-x", 0, answer)   # type: ignore[arg-type]
    assert e.value.code == "stream_diverged"


_KEYISH = st.lists(st.sampled_from(["sk-", "abcdefghij", "Bearer", "bearer", " ", "  ", "\n", "xyz", "AIza", "0123456789",
                                    "hf_", "-", "_", "KLMNOPQRSTUVWXYZ", "."]), max_size=40).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=_KEYISH, cuts=st.lists(st.integers(0, 400), max_size=12), freeze=st.integers(1, 40),
       keep=st.integers(0, 20))
def test_incremental_redaction_equals_redacting_the_whole_reply(text, cuts, freeze, keep):
    from conductor.workers.secrets import redact

    sink = AnswerStream(1, 0).sink_for(0, 0)
    sink.FREEZE_AFTER, sink.KEEP_OPEN = freeze, keep
    sink.start()
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    for a, b in zip(bounds, bounds[1:], strict=False):
        sink.delta(text[a:b])
        assert sink.redacted() == redact(text[:b])


def test_a_client_leaving_mid_stream_cancels_the_workflow(server, client, emu):
    import time

    emu.configure(stream_pause_after=3)
    stream = ask(client, 6, stream=True)
    for c in stream:
        if content([c]):
            break
    stream.close()                                 # the client goes away while the writer is still writing
    deadline = time.monotonic() + 10
    while server.engine.default.in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.engine.default.in_flight == 0
    assert server.app.state.server.clients._local["tester"].in_flight == 0
    assert emu.streams() == {"paused": 1, "finished": 0}   # the worker's reply was abandoned, not awaited
    emu.release_streams()
