"""Each provider's batch API through its real SDK (openai, anthropic, google-genai) against the emulator.

The adapters submit, poll and read results exactly as they would against the vendor; every test compares
with the synchronous call of the same worker, or checks how failures, expiry and cancellation come back
(by custom id).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from conductor.execution.batch.adapters.base import BatchRequest, adapter_class
from conductor.testing.emulator import Emulator
from conductor.workers.providers.base import Message, make_provider
from tests.fixtures_emulator import emu as _emu  # noqa: F401 - pytest fixtures, used by name
from tests.fixtures_emulator import emulator, worker  # noqa: F401

BATCH_DEFAULTS = {"batch_delay_s": 0.0, "batch_window_s": None, "batch_error_p": 0.0, "cached_input_fraction": 0.0}


@pytest.fixture()
def emu(_emu: Emulator) -> Emulator:
    """The shared emulator with the batch settings back at their defaults too."""
    _emu.configure(**BATCH_DEFAULTS)
    return _emu

PROVIDERS = ["openai", "anthropic", "google"]
SAMPLING = {"temperature": 0.3, "max_tokens": 64, "system_prompt": "Answer tersely.", "top_p": 0.9}


def _requests(provider: object, w: object, texts: list[str]) -> list[BatchRequest]:
    return [BatchRequest(f"req-{i}", w, [Message("user", t)], provider) for i, t in enumerate(texts)]  # type: ignore[arg-type]


async def _until_ended(adapter: object, batch_id: str, ids: list[str], limit_s: float = 60.0):
    deadline = time.monotonic() + limit_s
    while True:
        p = await adapter.poll(batch_id, ids)  # type: ignore[attr-defined]
        if p.ended or time.monotonic() > deadline:
            return p
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_batched_reply_and_request_equal_the_synchronous_ones(emu: Emulator, provider: str) -> None:
    w = worker(emu, f"w-{provider}", provider, sampling=SAMPLING)
    texts = ["What is 6 * 7?", "Name a prime above 10.", "Spell 'cat' backwards."]
    emu.configure(batch_delay_s=0.2)

    async def go():
        p = make_provider(w)
        adapter = adapter_class(provider)(p)
        reqs = _requests(p, w, texts)
        bid = await adapter.submit(reqs)
        polled = await _until_ended(adapter, bid, [r.custom_id for r in reqs])
        sync = [await p.complete(r.messages) for r in reqs]
        await p.aclose()
        return bid, polled, sync

    bid, polled, sync = asyncio.run(go())
    assert polled.ended and len(polled.outcomes) == 3
    for i, s in enumerate(sync):
        o = polled.outcomes[f"req-{i}"]
        c = o.completion
        assert c is not None, o
        assert (c.text, c.input_tokens, c.output_tokens, c.finish_reason) == \
            (s.text, s.input_tokens, s.output_tokens, s.finish_reason)
        assert c.text.startswith(f"reply from {w.model} to ")
    bodies = [r["body"] for r in emu.requests()]
    batched = [r["body"] for r in emu.requests() if r.get("batch")]
    direct = [b for b, r in zip(bodies, emu.requests()) if not r.get("batch")]
    assert len(batched) == 3 and len(direct) == 3
    for b, d in zip(batched, direct):     # the wire body inside the batch is the synchronous call's body
        assert b == d
    [summary] = [b for b in emu.batches() if b["route"] == {"google": "gemini"}.get(provider, provider)]
    assert summary["custom_ids"] == ["req-0", "req-1", "req-2"] and summary["status"] == "completed"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_errors_and_expiry_come_back_by_custom_id(emu: Emulator, provider: str) -> None:
    w = worker(emu, f"w-{provider}", provider)
    emu.configure(batch_delay_s=0.3)
    texts = ["fine one", "broken [[batchfault:error]]", "stuck [[batchfault:expire]]", "fine two"]

    async def go():
        p = make_provider(w)
        adapter = adapter_class(provider)(p)
        reqs = _requests(p, w, texts)
        bid = await adapter.submit(reqs)
        out = await _until_ended(adapter, bid, [r.custom_id for r in reqs])
        await p.aclose()
        return out

    polled = asyncio.run(go())
    o = polled.outcomes
    assert o["req-0"].completion is not None and o["req-3"].completion is not None
    assert o["req-1"].completion is None and o["req-1"].kind == "server" and o["req-1"].retryable
    assert o["req-2"].completion is None and o["req-2"].kind == "expired" and o["req-2"].retryable
    assert polled.status in {"openai": ("expired",), "anthropic": ("ended",),
                             "google": ("JOB_STATE_EXPIRED",)}[provider]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_cancelled_batch_reports_its_unprocessed_requests_cancelled(emu: Emulator, provider: str) -> None:
    w = worker(emu, f"w-{provider}", provider)
    emu.configure(batch_delay_s=600.0)      # nothing finishes before the cancel arrives

    async def go():
        p = make_provider(w)
        adapter = adapter_class(provider)(p)
        reqs = _requests(p, w, ["a", "b", "c"])
        bid = await adapter.submit(reqs)
        first = await adapter.poll(bid, [r.custom_id for r in reqs])
        await adapter.cancel(bid)
        out = await _until_ended(adapter, bid, [r.custom_id for r in reqs])
        await p.aclose()
        return first, out

    first, polled = asyncio.run(go())
    assert not first.ended
    assert polled.ended and {o.kind for o in polled.outcomes.values()} == {"cancelled"}
    assert all(o.retryable for o in polled.outcomes.values())


@pytest.mark.parametrize("provider", PROVIDERS)
def test_prompt_cache_reads_are_reported_apart(emu: Emulator, provider: str) -> None:
    w = worker(emu, f"w-{provider}", provider)
    emu.configure(cached_input_fraction=0.5)

    async def go():
        p = make_provider(w)
        adapter = adapter_class(provider)(p)
        reqs = _requests(p, w, ["a long enough question to have some tokens in it, twice over"])
        bid = await adapter.submit(reqs)
        out = await _until_ended(adapter, bid, ["req-0"])
        await p.aclose()
        return out

    c = asyncio.run(go()).outcomes["req-0"].completion
    assert c is not None and 0 < c.cached_input_tokens < c.input_tokens


def test_openai_batch_with_two_models_is_refused_as_a_whole(emu: Emulator) -> None:
    a, b = worker(emu, "a", "openai"), worker(emu, "b", "openai")

    async def go():
        pa, pb = make_provider(a), make_provider(b)
        adapter = adapter_class("openai")(pa)
        reqs = [BatchRequest("x", a, [Message("user", "hi")], pa), BatchRequest("y", b, [Message("user", "hi")], pb)]
        bid = await adapter.submit(reqs)
        out = await _until_ended(adapter, bid, ["x", "y"])
        await pa.aclose()
        await pb.aclose()
        return out

    polled = asyncio.run(go())
    assert polled.status == "failed"
    assert {o.kind for o in polled.outcomes.values()} == {"server"}
    assert "model_mismatch" in polled.outcomes["x"].message


def test_anthropic_refuses_custom_ids_it_cannot_take(emu: Emulator) -> None:
    from conductor.workers.providers.base import ProviderError

    w = worker(emu, "c", "anthropic")

    async def go():
        p = make_provider(w)
        adapter = adapter_class("anthropic")(p)
        try:
            await adapter.submit([BatchRequest("not/allowed", w, [Message("user", "hi")], p)])
        finally:
            await p.aclose()

    with pytest.raises(ProviderError) as e:
        asyncio.run(go())
    assert e.value.kind == "permanent" and e.value.status == 400
