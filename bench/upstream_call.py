"""What one worker call's HTTP client costs: the OpenAI-compatible provider against the SDK's post and bare aiohttp.

Every remote worker call of a served request or a batch run goes through ``OpenAIChat.complete``; its HTTP client is
the largest piece of a served request's own cost over a remote worker (docs/serving.md, "Overhead"). Three ways to
send the same chat completion to the provider emulator (its own process, no added latency), in this process,
sequentially, alternating call by call:

1. ``provider``: ``OpenAIChat.complete`` as the executor calls it (``DirectPost``: aiohttp with the SDK's URL and
   headers, the reply read as plain JSON);
2. ``sdk_post``: what the provider did before: the SDK's ``client.post`` (``cast_to=httpx.Response``) on its own
   aiohttp transport, the reply read the same way;
3. ``aiohttp``: a bare ``ClientSession.post`` of the same body, the reply's bytes read: the floor of any client.

Then the same three for a streamed reply of ``--chunks`` word pieces (the emulator's scripted reply, one event
each): ``provider_stream`` (``OpenAIChat.complete_stream``), ``sdk_stream`` (what it did before: the SDK's typed
stream, a pydantic model a chunk) and ``aiohttp_stream`` (the body's lines read and each event's JSON parsed).

CPU is this thread's CPU time per call; latency the median wall time per call. Each way runs ``--calls`` calls
(``--stream-calls`` for streams) after a warm-up.

Run: ``python bench/upstream_call.py`` (defaults: 1,000 calls, 100 streams of 300 chunks). Last line:
``provider_cpu_ms=<ms> provider_p50_ms=<ms> sdk_post_cpu_ms=<ms> sdk_post_p50_ms=<ms> aiohttp_cpu_ms=<ms>
aiohttp_p50_ms=<ms> provider_stream_cpu_ms=<ms> provider_stream_p50_ms=<ms> sdk_stream_cpu_ms=<ms>
sdk_stream_p50_ms=<ms> aiohttp_stream_cpu_ms=<ms> aiohttp_stream_p50_ms=<ms> sdk_over_provider_cpu=<ratio>
sdk_over_provider_stream_cpu=<ratio>``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WAYS = ("provider", "sdk_post", "aiohttp")
STREAM_WAYS = ("provider_stream", "sdk_stream", "aiohttp_stream")
Way = Callable[[], Awaitable[object]]


class _Sink:
    def delta(self, text: str) -> None:
        pass


def _ways(provider: Any, sdk: Any, session: Any, url: str, text: str) -> dict[str, Way]:
    import httpx

    from conductor.workers.providers.base import Message

    msgs = [Message("user", text)]
    body = {**provider.body, "messages": [{"role": "user", "content": text}]}

    async def sdk_post() -> object:
        raw = await sdk.post("/chat/completions", cast_to=httpx.Response, body=body)
        return provider._reply(raw.content, msgs, "bench")

    async def bare() -> object:
        async with session.post(url, json=body) as r:
            return await r.read()

    return {"provider": lambda: provider.complete(msgs), "sdk_post": sdk_post, "aiohttp": bare}


def _stream_ways(provider: Any, sdk: Any, session: Any, url: str, text: str) -> dict[str, Way]:
    import orjson

    from conductor.workers.providers.base import Message

    msgs = [Message("user", text)]
    body = {**provider.body, "messages": [{"role": "user", "content": text}], "stream": True,
            "stream_options": {"include_usage": True}}

    async def sdk_stream() -> object:
        parts = []
        stream = await sdk.chat.completions.create(
            messages=body["messages"], stream=True, stream_options={"include_usage": True}, **provider.params)
        async with stream:
            async for chunk in stream:
                for choice in chunk.choices or ():
                    if choice.index == 0 and choice.delta and choice.delta.content:
                        parts.append(choice.delta.content)
        return "".join(parts)

    async def bare() -> object:
        n = 0
        async with session.post(url, json=body) as r:
            async for line in r.content:
                if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                    orjson.loads(line[6:])
                    n += 1
        return n

    return {"provider_stream": lambda: provider.complete_stream(msgs, _Sink()), "sdk_stream": sdk_stream,
            "aiohttp_stream": bare}


async def _alternate(ways: dict[str, Way], calls: int, warm: int) -> dict[str, tuple[float, float]]:
    """(CPU ms, p50 ms) per call of each way, the ways alternating call by call."""
    for _ in range(warm):
        for go in ways.values():
            await go()
    wall: dict[str, list[float]] = {k: [] for k in ways}
    cpu = dict.fromkeys(ways, 0.0)
    for i in range(calls):
        for k, go in ways.items():
            c0, t0 = time.thread_time(), time.perf_counter()
            await go()
            wall[k].append(time.perf_counter() - t0)
            cpu[k] += time.thread_time() - c0
        if (i + 1) % max(1, calls // 4) == 0:
            print(f"  {i + 1}/{calls} calls each of {', '.join(ways)}", flush=True)
    return {k: (cpu[k] / calls * 1000, statistics.median(wall[k]) * 1000) for k in ways}


async def _measure(port: int, calls: int, stream_calls: int) -> dict[str, tuple[float, float]]:
    import aiohttp
    import openai

    from conductor.workers.pool import Worker
    from conductor.workers.providers.base import make_provider

    base = f"http://127.0.0.1:{port}/v1"
    w = Worker.model_validate({"name": "emu", "provider": "openai_compatible", "model": "emu-model",
                               "base_url": base, "limits": {"timeout_s": 30}})
    provider = make_provider(w)
    # the SDK as the provider ran it before: its client with its own aiohttp transport, no retries
    sdk = openai.AsyncOpenAI(api_key="no-key-needed", base_url=base, max_retries=0, timeout=30,
                             http_client=openai.DefaultAioHttpClient())
    url = base + "/chat/completions"
    async with aiohttp.ClientSession() as session:
        res = await _alternate(_ways(provider, sdk, session, url, "What is 6 * 7? " * 20), calls, 50)
        res |= await _alternate(_stream_ways(provider, sdk, session, url, "Stream me a long answer."), stream_calls, 5)
    await provider.aclose()
    await sdk.close()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=1000, help="measured whole calls per way (default 1000)")
    ap.add_argument("--stream-calls", type=int, default=100, help="measured streams per way (default 100)")
    ap.add_argument("--chunks", type=int, default=300, help="word pieces in the streamed reply (default 300)")
    args = ap.parse_args()
    import uvloop

    from conductor.testing.gateway_ab import start_emulator
    from conductor.testing.simulated_load import free_port

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "emulator.json"
        reply = " ".join(f"word{i}" for i in range(args.chunks))
        config.write_text(json.dumps({"scripted": [{"match": "Stream me", "reply": reply}]}))
        emu = start_emulator(port, "--config", str(config))
        try:
            res = uvloop.run(_measure(port, args.calls, args.stream_calls))
        finally:
            emu.terminate()
            emu.wait()
    for k in WAYS + STREAM_WAYS:
        print(f"{k:15} CPU {res[k][0]:.3f} ms a call, latency p50 {res[k][1]:.3f} ms")
    print(" ".join(f"{k}_cpu_ms={res[k][0]:.3f} {k}_p50_ms={res[k][1]:.3f}" for k in WAYS + STREAM_WAYS)
          + f" sdk_over_provider_cpu={res['sdk_post'][0] / res['provider'][0]:.2f}"
          + f" sdk_over_provider_stream_cpu={res['sdk_stream'][0] / res['provider_stream'][0]:.2f}")


if __name__ == "__main__":
    main()
