"""Streaming below the server: each SDK provider's ``complete_stream`` against the emulator's streamed replies
(the same Completion as ``complete``), the default for providers that cannot stream, and the executor's hook
(only the last step of the answer round streams; never a faulty worker; a retry starts the reply over)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from conductor.execution.executor import ANSWER_STREAM, Executor
from conductor.execution.recursion import run_batch
from conductor.execution.retry import RetryPolicy
from conductor.testing.emulator import Emulator
from conductor.workers.pool import Pool
from conductor.workers.providers.base import Completion, Message, make_provider, stream_completion
from tests.fixtures_emulator import emu, emulator, lists, make_traj, worker  # noqa: F401

PROVIDERS = ["openai", "anthropic", "google", "openai_compatible", "local"]
ROUTE = {"openai": "openai", "openai_compatible": "openai", "local": "openai", "anthropic": "anthropic", "google": "gemini"}
PREFIX = "a reply long enough to come in several pieces: "


class Sink:
    def __init__(self) -> None:
        self.attempts: list[list[str]] = []

    def start(self) -> None:
        self.attempts.append([])

    def delta(self, text: str) -> None:
        self.attempts[-1].append(text)


async def _both(w: Any, text: str) -> tuple[Completion, Completion, Sink]:
    p = make_provider(w)
    try:
        whole = await p.complete([Message("user", text)])
        sink = Sink()
        sink.start()
        streamed = await stream_completion(p, [Message("user", text)], sink)
        return whole, streamed, sink
    finally:
        await p.aclose()


CASES = [(p, s) for p in PROVIDERS for s in ({}, {"max_tokens": 5})] + \
    [(p, {"thinking_budget": 2000}) for p in ("anthropic", "google")]     # thinking: Anthropic's and Gemini's


@pytest.mark.parametrize(("provider", "sampling"), CASES)
def test_streamed_completion_equals_the_whole_one(emu: Emulator, provider: str, sampling: dict[str, Any]) -> None:
    emu.configure(reply_prefix=PREFIX, stream_delay_s=0.0)
    w = worker(emu, f"w-{provider}", provider, sampling=sampling)
    whole, streamed, sink = asyncio.run(_both(w, "x" * 200))
    assert streamed == whole and whole.text
    assert len(sink.attempts[0]) > 1 and "".join(sink.attempts[0]) == whole.text
    if "max_tokens" in sampling:
        assert whole.finish_reason == "length" and len(whole.text) == 20
    bodies = [r["body"] for r in emu.requests()]
    assert emu.stats()[f"{ROUTE[provider]}:ok"] == 2 and len(bodies) == 2


def test_a_provider_without_streaming_passes_its_reply_whole(emu: Emulator) -> None:
    class Whole:
        async def complete(self, messages: list[Message], *, sample_index: int = 0) -> Completion:
            return Completion("all at once", 3, 3, "stop")

        async def aclose(self) -> None:
            return None

    sink = Sink()
    sink.start()
    c = asyncio.run(stream_completion(Whole(), [Message("user", "q")], sink))
    assert c.text == "all at once" and sink.attempts == [["all at once"]]


class Sinks:
    """An ``AnswerSinks`` that records which (sample, depth) the executor asked for."""

    def __init__(self, depth: int = 0) -> None:
        self.depth = depth
        self.asked: list[tuple[int, int]] = []
        self.sinks: dict[int, Sink] = {}

    def sink_for(self, sample_index: int, depth: int) -> Sink | None:
        self.asked.append((sample_index, depth))
        return self.sinks.setdefault(sample_index, Sink()) if depth == self.depth else None


def _run(trajs: list[Any], pool: Pool, sinks: Sinks, ex: Executor | None = None) -> list[Any]:
    token = ANSWER_STREAM.set(sinks)
    try:
        return run_batch(trajs, pool.full(), ex or Executor())
    finally:
        ANSWER_STREAM.reset(token)


def test_only_the_last_step_streams_and_its_record_is_unchanged(emu: Emulator) -> None:
    emu.configure(reply_prefix=PREFIX)
    pool = Pool(pool_id="p", workers=(worker(emu, "a", "openai_compatible"), worker(emu, "b", "anthropic")))
    wf = lists([0, 1, 1], ["first", "second", "write the answer"], [[], [], ["all"]])
    sinks = Sinks()
    [t] = _run([make_traj(wf, sample=0)], pool, sinks)
    [plain] = run_batch([make_traj(wf, sample=0)], pool.full(), Executor())
    assert sinks.asked == [(0, 0)]                      # asked once: for the last step
    assert "".join(sinks.sinks[0].attempts[0]) == t.final_answer == plain.final_answer
    keep = ("worker", "response", "input_tokens", "output_tokens", "cost_usd", "finish_reason", "retries")
    assert [[getattr(c, k) for k in keep] for c in t.calls] == [[getattr(c, k) for k in keep] for c in plain.calls]
    streamed = [r["body"].get("stream", False) for r in emu.requests()]
    assert streamed.count(True) == 1


def test_a_round_that_is_not_the_answer_round_and_a_faulty_worker_do_not_stream(emu: Emulator) -> None:
    pool = Pool(pool_id="p", workers=(worker(emu, "a", "openai_compatible"),
                                      worker(emu, "f", "openai_compatible", faults={"inject": {"rate": 1.0, "text": "X"}})))
    sinks = Sinks(depth=1)                               # only a recursion round 1 would be the answer
    _run([make_traj(lists([0], ["answer"], [[]]))], pool, sinks)
    assert sinks.asked == [(0, 0)] and not sinks.sinks
    sinks = Sinks()
    [t] = _run([make_traj(lists([0, 1], ["draft", "final"], [[], ["all"]]))], pool, sinks)
    assert sinks.asked == [] and t.final_answer.endswith("X")    # the faulty last step is buffered
    assert not any(r["body"].get("stream") for r in emu.requests())


def test_a_retried_call_starts_its_streamed_reply_over(emu: Emulator) -> None:
    pool = Pool(pool_id="p", workers=(worker(emu, "a", "openai_compatible", limits={"max_retries": 2}),))
    sinks = Sinks()
    fast = RetryPolicy(base_s=0.01, max_wait_s=0.05)
    [t] = _run([make_traj(lists([0], ["answer [[fault:500*1]]"], [[]]))], pool, sinks, Executor(retry=fast))
    attempts = sinks.sinks[0].attempts
    assert len(attempts) == 2 and attempts[0] == [] and "".join(attempts[1]) == t.final_answer
    assert t.calls[0].retries == 1
