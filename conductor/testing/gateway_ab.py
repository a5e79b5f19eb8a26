"""A gateway's overhead, measured by an interleaved A/B (``bench/serve.py`` step 3): the same chat completions sent
directly to the provider emulator and through a gateway in front of it (`conductor serve`, and LiteLLM's proxy when installed), one request at a time,
alternating, many rounds; overhead = a gateway's round median minus the direct round median, reported at its
median over rounds (the "median of round medians" of independent gateway comparisons). Sequential requests
from one client keep the client's own CPU and any queueing out of the difference; both paths pay it equally.

The emulator (``python -m conductor.testing.emulator``) runs in its own process with no added latency, so a
round is milliseconds and the differences are the gateways' own time. `conductor serve` runs ``fixed:0`` over a
one-worker pool pointing at it: exactly one worker call per request, as a gateway makes one upstream call.
LiteLLM is a bench-only peer, never a project dependency: ``pip install 'litellm[proxy]'`` into a separate
virtual environment (default /work/venv-litellm, or ``$BENCH_LITELLM``: the ``litellm`` executable).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

LITELLM_DEFAULT = "/work/venv-litellm/bin/litellm"
# uvicorn's access log off for LiteLLM too (`conductor serve` runs without one): neither writes a line a request
LITELLM_LOG_CONFIG = """{"version": 1, "disable_existing_loggers": false,
 "loggers": {"uvicorn.access": {"level": "WARNING"}, "LiteLLM": {"level": "WARNING"}, "LiteLLM Proxy": {"level": "WARNING"}}}"""


@dataclass
class Target:
    """One path to the emulator: a URL, the body's model name, headers, and what each round measured."""

    name: str
    url: str
    model: str
    headers: dict[str, str] = field(default_factory=dict)
    own_header: str | None = None            # the gateway's own overhead header, if it sends one
    rounds: list[list[float]] = field(default_factory=list)    # latencies (s) per round
    own: list[float] = field(default_factory=list)             # its own header's values (ms)
    errors: int = 0


def wait_up(url: str, proc: subprocess.Popen[bytes], what: str, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{what} did not come up within {timeout:g} s")


def start_emulator(port: int, *options: str) -> subprocess.Popen[bytes]:
    """The provider emulator in its own process on ``port`` (``options``: its command line, e.g. ``--latency``),
    returned once it answers."""
    proc = subprocess.Popen([sys.executable, "-m", "conductor.testing.emulator", "--port", str(port), *options],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_up(f"http://127.0.0.1:{port}/v1/models", proc, "the emulator", 60)
    return proc


def emulator_pool(tmp: Path, emu_port: int) -> Path:
    pool = tmp / "emulator-pool.yaml"
    pool.write_text(f"""pool_id: emulator-1
workers:
  - name: emu
    provider: openai_compatible
    model: emu-model
    base_url: http://127.0.0.1:{emu_port}/v1
    limits: {{max_concurrency: 64, timeout_s: 30, max_retries: 0}}
""")
    return pool


def litellm_executable() -> str | None:
    exe = os.environ.get("BENCH_LITELLM", LITELLM_DEFAULT)
    return exe if Path(exe).is_file() and os.access(exe, os.X_OK) else shutil.which("litellm")


def start_litellm(exe: str, tmp: Path, emu_port: int, port: int) -> tuple[subprocess.Popen[bytes], str]:
    """LiteLLM's proxy with one model routed to the emulator; returns the process and its master key."""
    cfg = tmp / "litellm.yaml"
    cfg.write_text(f"""model_list:
  - model_name: emu
    litellm_params:
      model: openai/emu-model
      api_base: http://127.0.0.1:{emu_port}/v1
      api_key: sk-emulator
litellm_settings:
  telemetry: false
""")
    (tmp / "litellm-log.json").write_text(LITELLM_LOG_CONFIG)
    key = "sk-bench-" + secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}   # its own venv, alone
    env.update(LITELLM_MASTER_KEY=key, LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_LOG="ERROR")
    proc = subprocess.Popen([exe, "--config", str(cfg), "--port", str(port), "--host", "127.0.0.1",
                             "--num_workers", "1", "--log_config", str(tmp / "litellm-log.json")],
                            cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_up(f"http://127.0.0.1:{port}/health/liveliness", proc, "the LiteLLM proxy")
    return proc, key


def interleaved(targets: list[Target], prompts: list[str], rounds: int, per_round: int, warmup: int = 20,
                measure: Callable[[], None] | None = None) -> None:
    """``rounds`` rounds; in each, ``per_round`` prompts, each sent to every target in turn (the order rotates
    from one prompt to the next, so no target always goes first), one request at a time."""
    clients = {t.name: httpx.Client(headers=t.headers, timeout=30) for t in targets}

    def send(t: Target, prompt: str) -> float | None:
        t0 = time.perf_counter()
        try:
            r = clients[t.name].post(t.url, json={"model": t.model, "messages": [{"role": "user", "content": prompt}]})
            r.raise_for_status()
            r.json()["choices"][0]["message"]["content"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            t.errors += 1
            return None
        took = time.perf_counter() - t0
        if t.own_header and t.own_header in r.headers:
            t.own.append(float(r.headers[t.own_header]))
        return took

    try:
        for i in range(warmup):                    # connections open, first-request imports done
            for t in targets:
                send(t, prompts[i % len(prompts)])
        for t in targets:
            t.own.clear()
            t.errors = 0
        if measure is not None:
            measure()                              # the measured part starts here
        k = 0
        for _ in range(rounds):
            lat: dict[str, list[float]] = {t.name: [] for t in targets}
            for _ in range(per_round):
                order = targets[k % len(targets):] + targets[:k % len(targets)]
                prompt = prompts[k % len(prompts)]
                k += 1
                for t in order:
                    took = send(t, prompt)
                    if took is not None:
                        lat[t.name].append(took)
            for t in targets:
                t.rounds.append(lat[t.name])
    finally:
        for c in clients.values():
            c.close()


def round_median_overhead(gateway: Target, direct: Target) -> tuple[float, float, float]:
    """(median, p10, p90) over rounds of (gateway's round median - direct's round median), in ms."""
    diffs = sorted((statistics.median(g) - statistics.median(d)) * 1000
                   for g, d in zip(gateway.rounds, direct.rounds) if g and d)
    if not diffs:
        return float("nan"), float("nan"), float("nan")
    return statistics.median(diffs), diffs[len(diffs) // 10], diffs[(len(diffs) * 9) // 10]


def median_ms(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def sdk_floor(question: str, n: int = 500) -> float:
    """CPU seconds the async ``openai`` SDK spends on one chat completion by itself: the same call against a
    canned reply through httpx's MockTransport (no server, no socket). Part of every served request's
    latency that no server can remove; the direct run has none of it."""
    import json

    import httpx
    import openai

    body = json.dumps({"id": "chatcmpl-0", "object": "chat.completion", "created": 0, "model": "conductor@bench",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": "<answer>42</answer> " * 8,
                                                            "refusal": None}, "logprobs": None, "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 40, "completion_tokens": 30, "total_tokens": 70, "cost": 0.001}}).encode()

    def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "application/json"})

    async def main() -> float:
        c = openai.AsyncOpenAI(base_url="http://sdk-floor/v1", api_key="bench",
                               # typed as the SDK's vendored httpx2 client; httpx's own is what it wraps at runtime
                               http_client=httpx.AsyncClient(transport=httpx.MockTransport(reply)))  # type: ignore[arg-type]
        q = question

        async def ask() -> None:
            raw = await c.chat.completions.with_raw_response.create(model="conductor",
                                                                    messages=[{"role": "user", "content": q}])
            raw.parse()

        for _ in range(50):
            await ask()
        t0 = time.process_time()
        for _ in range(n):
            await ask()
        spent = time.process_time() - t0
        await c.close()
        return spent / n

    return asyncio.run(main())
