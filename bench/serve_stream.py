"""What a served stream costs the server: `conductor serve` over a remote (emulated) worker, streamed against whole.

`conductor serve` streams the answer step live when a client asks for ``stream: true`` (docs/serving.md): the
worker's reply is read as an event stream and each delta is passed on. This bench runs the server in its own
process with ``fixed:0`` over a one-worker pool pointing at the provider emulator (its own process), whose reply to
every question is ``--words`` words (one stream event each), and sends the same questions ``--requests`` times each
way, ``--concurrency`` at a time, alternating the two ways in blocks:

- ``stream``: ``stream: true``, the deltas read as they come (checked: every word arrives, in order);
- ``whole``: the same request without ``stream``.

Server CPU per request is the server process's CPU seconds over the requests of that way.

Run: ``python bench/serve_stream.py`` (defaults: 400 requests a way, 8 at a time, 300 words). Last line:
``requests=<n> words=<w> stream_cpu_ms_per_request=<ms> whole_cpu_ms_per_request=<ms> stream_over_whole=<x>
stream_p50_ms=<ms> whole_p50_ms=<ms> errors=<e>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

BLOCK = 50      # requests per block; the ways alternate block by block


async def _one(session: Any, url: str, question: str, stream: bool, words: list[str]) -> float:
    """One request; its latency in seconds. Raises unless the whole answer came back."""
    import orjson

    t0 = time.perf_counter()
    body = {"model": "conductor", "messages": [{"role": "user", "content": question}], **({"stream": True} if stream else {})}
    async with session.post(url, data=orjson.dumps(body), headers={"content-type": "application/json"}) as r:
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {(await r.text())[:200]}")
        if stream:
            parts = []
            async for line in r.content:
                if line.startswith(b"data: {"):
                    for choice in orjson.loads(line[6:]).get("choices") or ():
                        parts.append((choice.get("delta") or {}).get("content") or "")
            text = "".join(parts)
        else:
            text = (await r.json())["choices"][0]["message"]["content"]
    if text.split() != words:
        raise RuntimeError(f"the answer came back incomplete: {text[:80]!r}")
    return time.perf_counter() - t0


async def _measure(url: str, pid: int, n: int, concurrency: int, words: list[str]) -> tuple[dict[str, Any], int]:
    import aiohttp
    from serve import cpu_s

    cpu = {"stream": 0.0, "whole": 0.0}
    lat: dict[str, list[float]] = {"stream": [], "whole": []}
    errors = 0
    gate = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession() as session:
        async def lane(i: int, stream: bool) -> float | None:
            async with gate:
                try:
                    return await _one(session, url, f"Stream me the answer to question {i}.", stream, words)
                except (RuntimeError, aiohttp.ClientError):
                    return None
        for i in range(10):                                           # warm-up, both ways
            await lane(-i - 1, True)
            await lane(-i - 1, False)
        for start in range(0, n, BLOCK):
            for way in ("stream", "whole"):
                c0 = cpu_s(pid)
                got = await asyncio.gather(*(lane(i, way == "stream") for i in range(start, min(n, start + BLOCK))))
                cpu[way] += cpu_s(pid) - c0
                lat[way] += [x for x in got if x is not None]
                errors += sum(x is None for x in got)
            print(f"  {min(n, start + BLOCK)}/{n} requests each way", flush=True)
    return {w: (cpu[w] / n * 1000, statistics.median(lat[w]) * 1000 if lat[w] else float("nan")) for w in cpu}, errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=400, help="requests each way (default 400)")
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight (default 8)")
    ap.add_argument("--words", type=int, default=300, help="words in every answer, one stream event each (default 300)")
    args = ap.parse_args()
    from serve import start_server, stop

    from conductor.testing.gateway_ab import emulator_pool, start_emulator
    from conductor.testing.simulated_load import free_port

    words = [f"word{i}" for i in range(args.words)]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        config = tmp / "emulator.json"
        config.write_text(json.dumps({"scripted": [{"match": "Stream me", "reply": " ".join(words)}]}))
        emu_port, port = free_port(), free_port()
        emu = start_emulator(emu_port, "--config", str(config))
        try:
            proc = start_server(emulator_pool(tmp, emu_port), "fixed:0", port, tmp / "lake")
            try:
                res, errors = asyncio.run(_measure(f"http://127.0.0.1:{port}/v1/chat/completions", proc.pid,
                                                   args.requests, args.concurrency, words))
            finally:
                stop(proc)
        finally:
            emu.terminate()
            emu.wait()
    (s_cpu, s_p50), (w_cpu, w_p50) = res["stream"], res["whole"]
    print(f"stream: server CPU {s_cpu:.2f} ms a request, latency p50 {s_p50:.1f} ms")
    print(f"whole:  server CPU {w_cpu:.2f} ms a request, latency p50 {w_p50:.1f} ms")
    print(f"requests={args.requests} words={args.words} stream_cpu_ms_per_request={s_cpu:.2f} "
          f"whole_cpu_ms_per_request={w_cpu:.2f} stream_over_whole={s_cpu / w_cpu:.2f} stream_p50_ms={s_p50:.1f} "
          f"whole_p50_ms={w_p50:.1f} errors={errors}")


if __name__ == "__main__":
    main()
