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

CPU is this thread's CPU time per call; latency the median wall time per call. Each way runs ``--calls`` calls
after 50 warm-up calls.

Run: ``python bench/upstream_call.py`` (default 1,000 calls each). Last line:
``provider_cpu_ms=<ms> provider_p50_ms=<ms> sdk_post_cpu_ms=<ms> sdk_post_p50_ms=<ms> aiohttp_cpu_ms=<ms>
aiohttp_p50_ms=<ms> sdk_over_provider_cpu=<ratio>``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WAYS = ("provider", "sdk_post", "aiohttp")


def _ways(provider: object, session: object, url: str, text: str) -> dict[str, Callable[[], Awaitable[object]]]:
    import httpx

    from conductor.workers.providers.base import Message
    from conductor.workers.providers.openai import OpenAIChat

    assert isinstance(provider, OpenAIChat)
    msgs = [Message("user", text)]
    body = {**provider.body, "messages": [{"role": "user", "content": text}]}

    async def sdk_post() -> object:
        raw = await provider.client.post("/chat/completions", cast_to=httpx.Response, body=body)
        return provider._reply(raw.content, msgs, "bench")

    async def bare() -> object:
        async with session.post(url, json=body) as r:   # type: ignore[attr-defined]
            return await r.read()

    return {"provider": lambda: provider.complete(msgs), "sdk_post": sdk_post, "aiohttp": bare}


async def _measure(port: int, calls: int) -> dict[str, tuple[float, float]]:
    import aiohttp

    from conductor.workers.pool import Worker
    from conductor.workers.providers.base import make_provider

    base = f"http://127.0.0.1:{port}/v1"
    w = Worker.model_validate({"name": "emu", "provider": "openai_compatible", "model": "emu-model",
                               "base_url": base, "limits": {"timeout_s": 30}})
    provider = make_provider(w)
    async with aiohttp.ClientSession() as session:
        ways = _ways(provider, session, base + "/chat/completions", "What is 6 * 7? " * 20)
        for _ in range(50):
            for go in ways.values():
                await go()
        wall: dict[str, list[float]] = {k: [] for k in WAYS}
        cpu = dict.fromkeys(WAYS, 0.0)
        for i in range(calls):
            for k in WAYS:
                c0, t0 = time.thread_time(), time.perf_counter()
                await ways[k]()
                wall[k].append(time.perf_counter() - t0)
                cpu[k] += time.thread_time() - c0
            if (i + 1) % max(1, calls // 4) == 0:
                print(f"  {i + 1}/{calls} calls each", flush=True)
    await provider.aclose()
    return {k: (cpu[k] / calls * 1000, statistics.median(wall[k]) * 1000) for k in WAYS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=1000, help="measured calls per way (default 1000)")
    args = ap.parse_args()
    import uvloop

    from conductor.testing.gateway_ab import start_emulator
    from conductor.testing.simulated_load import free_port

    port = free_port()
    emu = start_emulator(port)
    try:
        res = uvloop.run(_measure(port, args.calls))
    finally:
        emu.terminate()
        emu.wait()
    for k in WAYS:
        print(f"{k:9} CPU {res[k][0]:.3f} ms a call, latency p50 {res[k][1]:.3f} ms")
    print(" ".join(f"{k}_cpu_ms={res[k][0]:.3f} {k}_p50_ms={res[k][1]:.3f}" for k in WAYS)
          + f" sdk_over_provider_cpu={res['sdk_post'][0] / res['provider'][0]:.2f}")


if __name__ == "__main__":
    main()
