"""`conductor serve` under load: the official ``openai`` SDK (async) as N concurrent clients on loopback.

1. Direct: the same workflows executed by the executor alone (``execute_batch`` in ``--clients`` lanes, one
   workflow at a time per lane, one shared ``Executor``) over the simulated pool with ``--latency`` seconds per worker call (the
   fixed latency option of the simulated provider, as the provider emulator's ``--latency`` adds to a reply).
2. Served: ``conductor serve`` in its own process (``python -m conductor serve``), and ``--clients`` async
   SDK clients sending ``--requests`` chat completions between them, each client one request at a time.
   overhead_i = served latency of question i - direct latency of question i (same workflow, same question:
   the simulated workers' latency and answers are deterministic), reported at its median.
3. Interleaved A/B (conductor/testing/gateway_ab.py): the same chat completions sent directly to the provider emulator and
   through `conductor serve` (``fixed:0`` over a one-worker pool on the emulator) and LiteLLM's proxy (when
   installed in its own virtual environment) over the same emulator, one at a time, alternating, ``--ab-rounds``
   rounds of ``--ab-per-round``; a gateway's overhead is the median over rounds of its round median minus the
   direct round median. Beside it, each gateway's own figure from its response header (``x-conductor-overhead-ms``,
   ``x-litellm-overhead-duration-ms``: total minus the time waiting on the upstream).
4. Embedded (``--embedded N``, N > 0): a short run of N requests through ``conductor serve`` over the embedded
   pool's installed models (real llama.cpp workers on loopback), to show the same server with real models.
5. Light load generator (``--light-requests``, default 2,000): after the SDK clients, the same server answers the
   same kind of requests, 64 at a time, from aiohttp keep-alive connections (about 0.26 ms of client CPU a request
   against the SDK clients' 1.7 ms); the server's CPU per request under it is the figure in the last line, as a
   gateway measures itself with its load generator elsewhere. Beside it, ``server_cpu_ms_per_request_sdk``: the
   server's CPU under the 64 SDK clients, which share its two cores, are CPU-bound, and send each request's headers
   and body in two writes that then arrive milliseconds apart, waking the server twice (docs/serving.md,
   "Seventh look").

Run: ``python bench/serve.py`` (defaults: 64 clients, 2,000 requests, 0.25 s per call, the ``moa:0+1:2``
strategy: two proposers in parallel, then an aggregator: 3 worker calls and 0.5 s per request; 40 A/B rounds of
10). Server CPU per request: the server process's CPU seconds (user + system, /proc) from the load's start until
the lake writer has written every row, over the requests. Beside it the bench prints the server's CPU over the
SDK clients' CPU in the same run (the host's phase moves both; the ratio stays) and this machine's price of
waking (``wake_cost``: the same piece of Python back to back and after a 4 ms sleep), docs/serving.md "Sixth look".
Last line: ``requests=<n> errors=<e> concurrency=<c> server_cpu_ms_per_request=<ms> ab_overhead_p50_ms=<ms>
litellm_ab_overhead_p50_ms=<ms> inside_overhead_p50_ms=<ms> throughput_rps=<r> server_cpu_ms_per_request_sdk=<ms>``;
``server_cpu_ms_per_request`` is under the light load generator (5. above; the SDK clients' figure beside it),
``errors`` counts both loads', ``inside_overhead_p50_ms`` is the median of the ``x-conductor-overhead-ms`` header
over the A/B's requests through `conductor serve`.
Targets (issue #49): 0 errors at 64 clients and 2,000 requests, server CPU at most 1.0 ms per request, A/B
overhead at most 2.0 ms and below LiteLLM's in the same run."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from conductor.testing.gateway_ab import (
    Target,
    emulator_pool,
    interleaved,
    litellm_executable,
    median_ms,
    round_median_overhead,
    sdk_floor,
    start_emulator,
    start_litellm,
)
from conductor.testing.simulated_load import free_port, questions, simulated_pool

ROOT = Path(__file__).resolve().parent.parent


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def direct(pool_path: Path, items: list[tuple[str, str]], strategy: str, clients: int,
           ramp_s: float) -> tuple[list[float], float]:
    """Per-question latency (s) and wall time of the executor alone on the same workflows, in ``clients`` lanes
    that start ``ramp_s / clients`` apart and run one workflow at a time each, as the served clients do."""
    from conductor.data.questions import Question
    from conductor.execution.executor import Budget, Executor
    from conductor.execution.ratelimit import RateLimiter
    from conductor.execution.recursion import execute_batch
    from conductor.policy.spec import parse_conductor_spec
    from conductor.policy.strategies import make_strategy, strategy_pool
    from conductor.run.pipeline import RunSpec, generate, plan
    from conductor.workers.pool import load_pool

    typed = parse_conductor_spec(strategy)
    pool = strategy_pool(typed, load_pool(pool_path))
    spec = RunSpec(run_id="bench-direct", kind="served", pool=pool, checkpoint_id=strategy, temperature=0.0)
    qs = [Question(id=f"served/bench-{i}", dataset="served", domain="free", prompt=q) for i, (q, _) in enumerate(items)]
    policy = make_strategy(typed, pool)
    trajs = plan(qs, spec)
    generate(trajs, policy, spec)
    ex = Executor(limiter=RateLimiter())

    async def main() -> float:
        todo = iter(trajs)

        async def lane(k: int) -> None:
            await asyncio.sleep(k * ramp_s / clients)
            for t in todo:
                await execute_batch([t], lambda t: spec.subpool_for(t.question_id), ex, budget=Budget(),
                                    max_steps=spec.max_steps)

        t0 = time.perf_counter()
        await asyncio.gather(*(lane(k) for k in range(clients)))
        wall = time.perf_counter() - t0
        await ex.aclose()
        return wall

    wall = asyncio.run(main())
    failed = sum(t.infra_failed for t in trajs)
    if failed:
        raise SystemExit(f"direct run: {failed} workflows failed")
    return [t.wall_s for t in trajs], wall


def start_server(pool_path: Path, strategy: str, port: int, lake: Path, extra: list[str] | None = None,
                 timeout: float = 300.0, *, tree: Path = ROOT,
                 env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`conductor serve` in its own process, once it answers ``/health``; ``tree``: the source tree it runs
    from (another worktree for a side-by-side comparison, bench/serve_pair.py), ``env``: variables added."""
    import httpx

    cmd = [sys.executable, "-m", "conductor", "serve", "--pool", str(pool_path), "--conductor", strategy,
           "--port", str(port), "--key-rpm", "0", "--key-concurrency", "100000", "--lake", str(lake),
           "--registry", str(lake.parent / "registry"), *(extra or [])]
    environ = None
    if tree != ROOT or env:
        path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)
        environ = {**os.environ, **(env or {}), "PYTHONPATH": path}
    proc = subprocess.Popen(cmd, cwd=tree, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"conductor serve exited: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit("conductor serve did not come up")


Load = tuple[dict[int, float], dict[int, tuple[float, float]], int, float, list[str]]


async def load(clients: list, items: list[tuple[str, str]], warmup: list[tuple[str, str]],
               ramp_s: float, measure: Callable[[], None]) -> Load:
    """Each client sends one request at a time until ``items`` are all asked. The clients are made and
    connected (``warmup``) before the clock starts, as long-lived application clients are: building one
    ``AsyncOpenAI`` loads the CA certificates (~40 ms of CPU each here), which is not serving cost."""
    import openai

    async def ask(c: openai.AsyncOpenAI, q: str) -> tuple[str, str, float]:
        raw = await c.chat.completions.with_raw_response.create(model="conductor",
                                                                messages=[{"role": "user", "content": q}])
        r = raw.parse()
        return (r.choices[0].message.content or "", raw.headers.get("server-timing", ""),
                float(raw.headers.get("x-conductor-overhead-ms", "nan")))

    warm = iter(warmup)
    await asyncio.gather(*(ask(c, next(warm)[0]) for c in clients))
    measure()                          # CPU counted from here: the warm-up requests and first-request imports are not
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(items)):
        queue.put_nowait(i)
    lat: dict[int, float] = {}
    server: dict[int, tuple[float, float]] = {}   # per request: Server-Timing total (s), x-conductor-overhead-ms
    errors: list[str] = []

    async def client(k: int, c: openai.AsyncOpenAI) -> None:
        await asyncio.sleep(k * ramp_s / len(clients))
        while not queue.empty():
            i = queue.get_nowait()
            t0 = time.perf_counter()
            try:
                text, timing, own_ms = await ask(c, items[i][0])
            except openai.OpenAIError as e:
                errors.append(f"{i}: {type(e).__name__}: {str(e)[:200]}")
                continue
            if not text:
                errors.append(f"{i}: empty answer")
                continue
            lat[i] = time.perf_counter() - t0
            parts = dict(p.strip().split(";dur=") for p in timing.split(",") if ";dur=" in p)
            server[i] = (float(parts.get("total", "nan")) / 1000, own_ms)

    t0 = time.perf_counter()
    await asyncio.gather(*(client(k, c) for k, c in enumerate(clients)))
    return lat, server, len(errors), time.perf_counter() - t0, errors


async def run_load(base_url: str, items: list[tuple[str, str]], warmup: list[tuple[str, str]], n_clients: int,
                   cpu_pid: int, ramp_s: float = 0.0) -> tuple[Load, float, float]:
    """(load results, server CPU seconds, client CPU seconds) over the measured part only."""
    import openai

    clients = [openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=120)
               for _ in range(n_clients)]
    start: list[float] = []
    try:
        res = await load(clients, items, warmup, ramp_s, lambda: start.extend((cpu_s(cpu_pid), time.process_time())))
        client_s = time.process_time() - start[1]
        await lake_written(base_url, len(items) + len(warmup))   # the writer's CPU for every row counts
        return res, cpu_s(cpu_pid) - start[0], client_s
    finally:
        await asyncio.gather(*(c.close() for c in clients))


async def light_load(base_url: str, items: list[tuple[str, str]], warmup: list[tuple[str, str]], n_clients: int,
                     cpu_pid: int, lake_rows_total: int) -> tuple[int, float, float, float]:
    """The same chat completions from a light load generator: aiohttp (the client OpenAI-wire workers post on,
    ``DirectPost``), ``n_clients`` keep-alive connections, each one request at a time, without the SDK's own layers. Returns
    (errors, server CPU seconds, client CPU seconds, wall seconds) over the measured part, the lake's writes included
    (``lake_rows_total``: the rows the server will have written by then, earlier phases' included).

    WHY beside the SDK clients: a gateway is measured with its load generator elsewhere (LiteLLM's figures come
    from separate machines). Here the generator shares the server's two cores, and its CPU costs the server's
    CPU too: the server's caches are shared with it (docs/serving.md, "Seventh look"). The SDK clients spend about
    1.7 ms of CPU a request, this generator about 0.26 ms."""
    import aiohttp

    url = f"{base_url}/chat/completions"
    errors = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=n_clients)) as http:
        async def ask(q: str) -> bool:
            async with http.post(url, json={"model": "conductor", "messages": [{"role": "user", "content": q}]}) as r:
                body = await r.json()
                return r.status == 200 and bool(body["choices"][0]["message"]["content"])

        await asyncio.gather(*(ask(q) for q, _ in warmup))      # the connections open before the clock starts
        todo = iter(q for q, _ in items)
        server0, client0, t0 = cpu_s(cpu_pid), time.process_time(), time.perf_counter()

        async def lane() -> None:
            nonlocal errors
            for q in todo:
                try:
                    ok = await ask(q)
                except aiohttp.ClientError:
                    ok = False
                errors += not ok

        await asyncio.gather(*(lane() for _ in range(n_clients)))
        wall, client_s = time.perf_counter() - t0, time.process_time() - client0
    await lake_written(base_url, lake_rows_total)
    return errors, cpu_s(cpu_pid) - server0, client_s, wall


async def lake_written(base_url: str, rows: int, timeout_s: float = 60.0) -> None:
    """Wait until the lake writer has written ``rows`` rows (it flushes every few seconds); at once without a lake."""
    import httpx

    async with httpx.AsyncClient(base_url=base_url.removesuffix("/v1")) as http:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = lake_rows((await http.get("/metrics")).text)
            if got is None or got >= rows:
                return
            await asyncio.sleep(0.25)


def lake_rows(metrics: str) -> float | None:
    return next((float(ln.split()[-1]) for ln in metrics.splitlines()
                 if ln.startswith("conductor_serve_lake_rows_written")), None)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def wake_cost(n: int = 400, gap_s: float = 0.004) -> tuple[float, float]:
    """(microseconds of CPU a fixed piece of Python takes run back to back, the same piece after a ``gap_s``
    sleep): what this machine charges a process each time it wakes from idle (cold caches, the hypervisor's
    halt and resume), as the server wakes between its requests' events at the bench's pace."""
    def piece() -> int:
        d = {str(i): i for i in range(300)}
        return sum(d.values())

    out = []
    for gap in (0.0, gap_s):
        c0 = time.thread_time()
        for _ in range(n):
            if gap:
                time.sleep(gap)
            piece()
        out.append((time.thread_time() - c0) / n * 1e6)
    return out[0], out[1]


def wake_footprint(n: int = 100) -> tuple[float, float, float, float]:
    """What the price of waking depends on (docs/serving.md, "Seventh look"): microseconds of CPU of a loop that
    touches almost no memory, back to back and after a 20 ms sleep, then of a piece reading 2,000 long-lived
    objects scattered over a large heap (as a request reads the server's modules, pool and tables), the same two
    ways. Where the first ratio is near 1 and the second is several times, the machine evicts the process's
    caches while it sleeps: the cost of a wake-up grows with the memory the woken code touches."""
    objs = [{"a": i, "b": str(i)} for i in range(200_000)]

    def tight() -> int:
        x = 0
        for i in range(1500):
            x += i
        return x

    def wide() -> int:
        return sum(objs[j]["a"] for j in range(0, 200_000, 100))

    return _timed(tight, n, 0.0), _timed(tight, n, 0.02), _timed(wide, n, 0.0), _timed(wide, n, 0.02)


def _timed(piece: Callable[[], int], n: int, gap_s: float) -> float:
    """Median thread CPU (us) of ``piece`` over ``n`` runs, each after a ``gap_s`` sleep."""
    out = []
    for _ in range(n):
        if gap_s:
            time.sleep(gap_s)
        c0 = time.thread_time()
        piece()
        out.append(time.thread_time() - c0)
    return statistics.median(out) * 1e6


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.terminate()        # SIGTERM: uvicorn finishes in-flight requests, the lake writer flushes
    try:
        return proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def embedded_run(n: int, tmp: Path, port: int, model: str) -> str:
    """N requests through `conductor serve` over the embedded pool (its ``model`` worker if installed, else the
    installed ones; the fixed:0 strategy, so no conductor model competes with the worker for the CPU)."""
    import yaml

    from conductor.local.embedded import installed

    have = installed()
    doc = yaml.safe_load((ROOT / "data/pools/local.yaml").read_text())
    doc["workers"] = [w for w in doc["workers"] if w["provider"] == "local" and w["model"] in have]
    if any(w["model"] == model for w in doc["workers"]):
        doc["workers"] = [w for w in doc["workers"] if w["model"] == model]
    if not doc["workers"]:
        return "embedded: skipped (no embedded model installed; `conductor models install`)"
    pool = tmp / "embedded.yaml"
    pool.write_text(yaml.safe_dump(doc))
    proc = start_server(pool, "fixed:0", port, tmp / "lake-embedded")
    try:
        import openai

        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="bench", max_retries=0, timeout=600)
        lat, answers = [], 0
        for i in range(n):
            t0 = time.perf_counter()
            r = c.chat.completions.create(model="conductor", messages=[{"role": "user", "content": f"What is {i + 2} * 3?"}],
                                          extra_body={"conductor": {"trace": True}})
            lat.append(time.perf_counter() - t0)
            answers += bool(r.choices[0].message.content.strip())
        workers = ",".join(w["name"] for w in doc["workers"])
        return (f"embedded: requests={n} answered={answers} workers={workers} "
                f"p50_s={statistics.median(lat):.2f} max_s={max(lat):.2f}")
    finally:
        stop(proc)


def ab_run(tmp: Path, rounds: int, per_round: int) -> tuple[float, float, float, list[str]]:
    """The interleaved A/B (conductor/testing/gateway_ab.py): (conductor's overhead ms, LiteLLM's or nan, the median of
    conductor's own header ms, the lines to print)."""
    lines: list[str] = []
    emu_port, port = free_port(), free_port()
    emu = start_emulator(emu_port)
    procs: list[subprocess.Popen[bytes]] = [emu]
    try:
        proc = start_server(emulator_pool(tmp, emu_port), "fixed:0", port, tmp / "lake-ab")
        procs.append(proc)
        direct_t = Target("direct", f"http://127.0.0.1:{emu_port}/v1/chat/completions", "emu-model")
        ours = Target("conductor serve", f"http://127.0.0.1:{port}/v1/chat/completions", "conductor",
                      own_header="x-conductor-overhead-ms")
        targets = [direct_t, ours]
        exe = litellm_executable()
        peer: Target | None = None
        if exe is None:
            lines.append("litellm: skipped (no `litellm` executable: pip install 'litellm[proxy]' into a separate "
                         "virtual environment, e.g. /work/venv-litellm, or set $BENCH_LITELLM)")
        else:
            ll_port = free_port()
            try:
                ll, key = start_litellm(exe, tmp, emu_port, ll_port)
            except RuntimeError as e:
                lines.append(f"litellm: skipped ({exe}: {e})")
            else:
                procs.append(ll)
                peer = Target("litellm proxy", f"http://127.0.0.1:{ll_port}/v1/chat/completions", "emu",
                              headers={"Authorization": f"Bearer {key}"}, own_header="x-litellm-overhead-duration-ms")
                targets.append(peer)
        prompts = [q for q, _ in questions(per_round * 4, offset=50_000)]
        interleaved(targets, prompts, rounds, per_round)
    finally:
        for p in reversed(procs):
            stop(p)
    for t in targets:
        n = sum(len(r) for r in t.rounds)
        lines.append(f"  {t.name:16s} {n} requests, {t.errors} errors, p50 {median_ms([x for r in t.rounds for x in r]) * 1000:.2f} ms"
                     + (f", its own overhead header p50 {median_ms(t.own):.2f} ms" if t.own_header else ""))
    ab, lo, hi = round_median_overhead(ours, direct_t)
    lines.append(f"  A/B overhead, conductor serve - direct: {ab:.2f} ms (median of {rounds} round medians; "
                 f"rounds p10 {lo:.2f}, p90 {hi:.2f})")
    peer_ab = float("nan")
    if peer is not None:
        peer_ab, lo, hi = round_median_overhead(peer, direct_t)
        lines.append(f"  A/B overhead, litellm proxy - direct:   {peer_ab:.2f} ms (rounds p10 {lo:.2f}, p90 {hi:.2f})")
    if any(t.errors for t in targets):
        lines.append("  A/B errors: " + ", ".join(f"{t.name} {t.errors}" for t in targets))
    return ab, peer_ab, median_ms(ours.own), lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--latency", type=float, default=0.25, help="seconds per simulated worker call")
    ap.add_argument("--strategy", default="moa:0+1:2")
    ap.add_argument("--embedded", type=int, default=3, help="requests of the embedded-pool run (0: skip)")
    ap.add_argument("--ramp-s", type=float, default=0.0,
                    help="client k starts k/N of this many seconds later (default 0: all at once, in lock-step); "
                         "the direct run's lanes start the same way")
    ap.add_argument("--embedded-model", default="smollm2-135m-instruct")
    ap.add_argument("--warmup", type=int, default=64, help="one request per client before the clock starts")
    ap.add_argument("--ab-rounds", type=int, default=40, help="rounds of the interleaved A/B (0: skip it)")
    ap.add_argument("--ab-per-round", type=int, default=10, help="requests per target in each A/B round")
    ap.add_argument("--light-requests", type=int, default=2000,
                    help="requests from the light load generator after the SDK clients' (0: skip it)")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    items = questions(args.requests)
    warm = questions(max(args.warmup, args.clients), offset=args.requests)
    light = questions(args.light_requests, offset=args.requests + len(warm))
    light_warm = questions(args.clients if args.light_requests else 0, offset=args.requests + len(warm) + len(light))
    pool = simulated_pool(tmp, items + warm + light + light_warm, latency_s=args.latency)
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; pool simulated-4 (+gold), "
          f"{args.latency:g} s per worker call, strategy {args.strategy}; clients start over "
          f"{args.ramp_s:g} s", flush=True)

    c0 = time.process_time()
    ramp = args.ramp_s
    direct_lat, direct_wall = direct(pool, items, args.strategy, args.clients, ramp)
    direct_cpu = time.process_time() - c0
    direct_rps = len(items) / direct_wall
    print(f"direct: executor alone, {len(items)} workflows, {args.clients} in flight: wall {direct_wall:.2f} s, "
          f"{direct_rps:.1f} workflows/s, p50 {statistics.median(direct_lat) * 1000:.1f} ms", flush=True)

    port = free_port()
    proc = start_server(pool, args.strategy, port, tmp / "lake")
    try:
        base = f"http://127.0.0.1:{port}/v1"
        (lat, server_lat, n_err, wall, errors), server_cpu, client_cpu = asyncio.run(
            run_load(base, items, warm, args.clients, proc.pid, ramp))
        import httpx

        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        light_err, light_server, light_client, light_wall = (asyncio.run(light_load(
            base, light, light_warm, args.clients, proc.pid, len(items) + len(warm) + len(light) + len(light_warm)))
            if light else (0, float("nan"), float("nan"), float("nan")))
    finally:
        code = stop(proc)
    for e in errors[:5]:
        print(f"error: {e}")
    served = list(lat.values())
    over = [lat[i] - direct_lat[i] for i in lat]
    rps = len(items) / wall
    print(f"served: {len(items)} requests, {args.clients} clients: wall {wall:.2f} s, {rps:.1f} req/s "
          f"({rps / direct_rps:.3f} of the executor alone), latency p50 {pct(served, 0.5) * 1000:.1f} ms, "
          f"p99 {pct(served, 0.99) * 1000:.1f} ms; server exit code on SIGTERM {code}", flush=True)
    print(f"overhead per request (served - direct, same question): p50 {pct(over, 0.5) * 1000:.2f} ms, "
          f"p90 {pct(over, 0.9) * 1000:.2f} ms", flush=True)
    inside = [server_lat[i][0] - direct_lat[i] for i in server_lat]
    own = [v[1] for v in server_lat.values()]
    print(f"  of which inside the server (Server-Timing total - direct): p50 {pct(inside, 0.5) * 1000:.2f} ms; "
          f"the rest is HTTP on loopback and the SDK client", flush=True)
    server_cpu_ms = server_cpu / len(items) * 1000
    print(f"CPU per request: server {server_cpu_ms:.2f} ms, SDK clients "
          f"{client_cpu / len(items) * 1000:.2f} ms (direct executor: {direct_cpu / len(items) * 1000:.2f} ms); "
          f"the SDK alone on a canned reply: {sdk_floor(questions(1)[0][0]) * 1000:.2f} ms; load {os.getloadavg()[0]:.2f}",
          flush=True)
    hot, woken = wake_cost()
    print(f"server CPU over the SDK clients' CPU in the same run: {server_cpu / client_cpu:.3f} (the host's phase "
          f"moves both together); this machine's wake-up cost: a piece of Python taking {hot:.0f} us back to back "
          f"takes {woken:.0f} us after a 4 ms sleep ({woken / hot:.2f}x)", flush=True)
    t_hot, t_woken, w_hot, w_woken = wake_footprint()
    print(f"what waking costs depends on the memory touched: a loop touching almost none {t_hot:.0f} us back to back, "
          f"{t_woken:.0f} us after a 20 ms sleep ({t_woken / t_hot:.2f}x); reading 2,000 long-lived objects "
          f"{w_hot:.0f} us back to back, {w_woken:.0f} us after a 20 ms sleep ({w_woken / w_hot:.2f}x)", flush=True)
    print(f"the server's own time under load (x-conductor-overhead-ms): p50 {pct(own, 0.5):.2f} ms, "
          f"p90 {pct(own, 0.9):.2f} ms (at {args.clients} clients it includes waiting for the event loop "
          f"while other requests' CPU runs)", flush=True)
    print(f"lake rows written by the time of the metrics scrape: {lake_rows(metrics)}", flush=True)
    light_ms = light_server / max(1, len(light)) * 1000
    if light:
        print(f"light load generator (aiohttp, {args.clients} keep-alive connections, the same requests, "
              f"{len(light) / light_wall:.1f} req/s): server CPU {light_ms:.2f} ms per request, the generator's "
              f"{light_client / len(light) * 1000:.2f} ms; errors {light_err} (under the SDK clients: "
              f"{server_cpu_ms:.2f} ms and {client_cpu / len(items) * 1000:.2f} ms)", flush=True)
    ab = peer_ab = inside = float("nan")
    if args.ab_rounds > 0:
        print(f"interleaved A/B: {args.ab_rounds} rounds x {args.ab_per_round} requests per target, sequential, "
              f"over the provider emulator (its own process, no added latency); load {os.getloadavg()[0]:.2f}",
              flush=True)
        ab, peer_ab, inside, lines = ab_run(tmp, args.ab_rounds, args.ab_per_round)
        for line in lines:
            print(line, flush=True)
    if args.embedded > 0:
        print(embedded_run(args.embedded, tmp, free_port(), args.embedded_model), flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"requests={len(items)} errors={n_err + light_err} concurrency={args.clients} "
          f"server_cpu_ms_per_request={light_ms:.2f} ab_overhead_p50_ms={ab:.2f} litellm_ab_overhead_p50_ms={peer_ab:.2f} "
          f"inside_overhead_p50_ms={inside:.2f} throughput_rps={rps:.1f} server_cpu_ms_per_request_sdk={server_cpu_ms:.2f}")


if __name__ == "__main__":
    main()
