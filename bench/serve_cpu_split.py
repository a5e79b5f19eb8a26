"""Where `conductor serve`'s CPU per request goes: the whole ASGI app in this process, three ways, one run.

`bench/serve.py` measures the server as clients see it (its own process, HTTP on loopback, 64 SDK clients);
this bench takes the HTTP side away to split what is left (issue #49's ``server_cpu_ms_per_request``):

1. ``full``: the app as `conductor serve` builds it (``create_app`` over a ``ServeConfig``), called through
   ASGI directly (no socket), ``--concurrency`` requests at a time, the simulated pool answering after
   ``--latency`` seconds per call, the lake on (the ASGI scope is built here rather than through httpx's
   ``ASGITransport``: a client's own work would count in the same process's CPU);
2. ``no_lake``: the same without the served-traffic lake (its writer thread and Parquet shards);
3. ``stub_workers``: the same as ``full`` with the simulated workers' own work (finding the gold answer in the
   prompt, a seeded draw, the reply's text) replaced by a fixed reply after the same latency: the stand-in for
   remote models costs the server nothing of its own there.

CPU per request is this process's CPU time (every thread: the loop and the lake writer) over the measured
requests, after a warm-up of 100, with the writer flushed at the end. Each variant runs ``--repeats`` times,
interleaved, and reports its median.

Run: ``python bench/serve_cpu_split.py`` (defaults: 2,000 requests, 64 at a time, 0.25 s per call, ``moa:0+1:2``).
Last line: ``full_cpu_ms_per_request=<ms> no_lake_cpu_ms_per_request=<ms> stub_workers_cpu_ms_per_request=<ms>
lake_ms_per_request=<ms> simulated_workers_ms_per_request=<ms>``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VARIANTS = ("full", "no_lake", "stub_workers")
_HEADERS = [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"), (b"authorization", b"Bearer bench"),
            (b"accept", b"application/json"), (b"user-agent", b"AsyncOpenAI/Python")]


async def _call(app: Any, question: str) -> None:
    """One chat completion through the ASGI app, as uvicorn would hand it over; fails on anything but 200."""
    import orjson

    body = orjson.dumps({"model": "conductor", "messages": [{"role": "user", "content": question}]})
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"",
             "root_path": "", "headers": [*_HEADERS, (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 5555), "server": ("127.0.0.1", 8000), "state": {}}
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)          # the client stays connected
        return {"type": "http.disconnect"}

    messages: list[dict] = []

    async def send(message: dict) -> None:
        messages.append(message)

    await app(scope, receive, send)
    if messages[0]["status"] != 200:
        raise SystemExit(f"request failed: {messages}")


def _stub_simulated_workers() -> None:
    """Replace the simulated workers' own work by a fixed reply after their latency (variant ``stub_workers``)."""
    from conductor.workers.providers.base import Completion
    from conductor.workers.providers.simulated import SimulatedProvider

    async def complete(self: SimulatedProvider, messages: list, *, sample_index: int = 0) -> Completion:
        if self.options.latency_s:
            await asyncio.sleep(self.options.latency_s)
        return Completion(text="The final answer is 3.\n<answer>3</answer>", input_tokens=100, output_tokens=10,
                          finish_reason="stop")

    SimulatedProvider.complete = complete   # type: ignore[method-assign]


def measure(variant: str, requests: int, concurrency: int, latency: float, strategy: str) -> float:
    """CPU milliseconds per request of one variant (run in a process of its own: ``_run_variant``)."""
    from conductor.serve.app import create_app
    from conductor.serve.config import ServeConfig
    from conductor.testing.simulated_load import questions, simulated_pool

    with tempfile.TemporaryDirectory() as d:
        items = questions(requests + 100)
        pool = simulated_pool(Path(d), items, latency_s=latency)
        cfg = ServeConfig(pool=str(pool), conductor=strategy, lake=None if variant == "no_lake" else str(Path(d) / "lake"),
                          registry=str(Path(d) / "registry"), key_rpm=0, key_concurrency=100_000)
        app = create_app(cfg)

        async def run() -> float:
            async with app.app.router.lifespan_context(app.app):
                for q, _ in items[:100]:
                    await _call(app, q)
                gate = asyncio.Semaphore(concurrency)

                async def one(q: str) -> None:
                    async with gate:
                        await _call(app, q)

                c0 = time.process_time()
                await asyncio.gather(*(one(q) for q, _ in items[100:]))
                writer = app.state.server.engine.writer
                if writer is not None:
                    await asyncio.to_thread(writer.flush)
                return (time.process_time() - c0) / requests * 1000

        return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--latency", type=float, default=0.25, help="seconds per simulated worker call")
    ap.add_argument("--strategy", default="moa:0+1:2")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    got: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(a.repeats):
        for v in VARIANTS:                  # interleaved, so a change in the machine's load hits every variant
            got[v].append(_run_variant(v, a))
            print(f"round {r + 1}/{a.repeats} {v}: {got[v][-1]:.3f} ms CPU per request", flush=True)
    med = {v: statistics.median(x) for v, x in got.items()}
    print(f"full_cpu_ms_per_request={med['full']:.3f} no_lake_cpu_ms_per_request={med['no_lake']:.3f} "
          f"stub_workers_cpu_ms_per_request={med['stub_workers']:.3f} lake_ms_per_request={med['full'] - med['no_lake']:.3f} "
          f"simulated_workers_ms_per_request={med['full'] - med['stub_workers']:.3f}")
    return 0


def _run_variant(variant: str, a: argparse.Namespace) -> float:
    """Each variant in its own subprocess, so the stub and the app's module state never leak between them."""
    import subprocess

    cmd = [sys.executable, __file__, "--one", variant, str(a.requests), str(a.concurrency), str(a.latency), a.strategy]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"variant {variant} failed: {(out.stderr or out.stdout).strip().splitlines()[-1:]}")
    return float(out.stdout.strip().splitlines()[-1])


def _one(argv: list[str]) -> int:
    variant, requests, concurrency, latency, strategy = argv
    if variant == "stub_workers":
        _stub_simulated_workers()
    print(f"{measure(variant, int(requests), int(concurrency), float(latency), strategy):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(_one(sys.argv[2:]) if sys.argv[1:2] == ["--one"] else main())
