"""Executor benchmark: throughput against a rate limit, own overhead per call, graph-parallel speedup.

Measured side by side in one run:

1. ratio_to_limit: ``--workflows`` three-step workflows ([[], [], ["all"]]) on one
   OpenAI-compatible worker through the real ``openai`` SDK, against the provider
   emulator in a separate process with ``--latency`` per call and an ``--rpm``
   limit that the executor enforces and the emulator *also* enforces (it answers
   429 beyond it, with 2 s of burst). ratio = ideal wall / measured wall, where
   the ideal is the time the limit itself needs: (calls - the limiter's one
   second of burst) / rate, plus the dependency tail of the last workflow (two
   call latencies). The steady-state rate the server saw is printed too.
2. overhead_ms_per_call: CPU time per call of the whole executor path (parse,
   limits, retries, timeout, worker messages, records) over the in-process
   ``simulated`` provider with zero latency, minus that provider's own CPU time
   per call measured directly: what the executor adds to every call. CPU time,
   not wall time, so other load on the machine does not inflate it.
3. parallel_speedup: wall time of strictly sequential steps over graph-parallel
   steps for the same workflows (ideal 1.5 for [[], [], ["all"]]).
Also printed: the SDK client's own ceiling (calls/s with no limit), for context.

``--processes N`` (N > 1) measures the limit shared across OS processes instead:
N separate Python processes, each with its own executor, split the workflows
and spend ONE ``--rpm`` limit that the single emulator enforces for all of them,
through the shared store given by ``--limits`` (default: a SQLite file,
``conductor.execution.shared_limits``). They start together (a barrier after warm-up);
ratio = ideal wall / (last process done - start), leaked_429 = the 429s the
emulator had to send. ``--compare-local`` also runs the same load with
per-process limits, for contrast.

Run: ``python bench/executor.py`` (defaults finish in under a minute);
``python bench/executor.py --processes 4``. Last line: ``ratio_to_limit=<x> leaked_429=<n> ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from conductor.execution.executor import Executor
from conductor.execution.ratelimit import RateLimiter
from conductor.execution.recursion import execute_batch
from conductor.execution.shared_limits import open_shared
from conductor.testing.gateway_ab import start_emulator as start_emulator_process
from conductor.testing.simulated_load import free_port
from conductor.trajectory import Round, Trajectory
from conductor.workers.pool import Pool, Worker
from conductor.workers.providers.base import Message, make_provider

WF = ("model_id = [0, 0, 0]\nsubtasks = [\"Solve the problem.\", \"Solve it another way.\", "
      "\"Compare both attempts and give the final answer.\"]\naccess_list = [[], [], [\"all\"]]")


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def start_emulator(latency: float, rpm: float | None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    rate = ["--rpm", str(rpm), "--rpm-burst", "2"] if rpm else []
    return start_emulator_process(port, "--latency", str(latency), *rate), f"http://127.0.0.1:{port}"


def trajs(n: int, tag: str) -> list[Trajectory]:
    return [Trajectory(trajectory_id=f"{tag}{i}", run_id="bench", kind="eval", question_id=f"{tag}{i}",
                       dataset="bench", domain="math", question=f"Question {tag}{i}: what is {i} + {i}?",
                       rounds=[Round(depth=0, prompt="", completion=WF)]) for i in range(n)]


async def timed_batch(ts: list[Trajectory], pool: Pool, ex: Executor, **kw) -> float:
    t0 = time.perf_counter()
    await execute_batch(ts, pool.full(), ex, **kw)
    return time.perf_counter() - t0


def check(ts: list[Trajectory]) -> None:
    bad = [t.infra_cause for t in ts if t.infra_failed or t.rounds[0].parse_status != "ok"]
    if bad:
        raise SystemExit(f"error: {len(bad)} workflows failed, e.g. {bad[0]}")


def _limit_worker(url: str, args: argparse.Namespace, model: str = "bench-model") -> Worker:
    return Worker(name="emu", provider="openai_compatible", model=model, base_url=url + "/v1",
                  limits={"requests_per_minute": args.rpm, "max_concurrency": args.concurrency, "timeout_s": 30,
                          "max_retries": 10})


async def bench_limit(url: str, args: argparse.Namespace) -> tuple[float, dict]:
    pool = Pool(pool_id="bench", workers=(_limit_worker(url, args),))
    ex = Executor(limiter=RateLimiter(burst_s=1.0))
    await execute_batch(trajs(4, "warm"), pool.full(), ex)       # SDK import and connection set-up
    await asyncio.sleep(1.5)                                      # let both buckets refill
    _post(url + "/_emulator/reset", {})
    ts = trajs(args.workflows, "lim")
    wall = await timed_batch(ts, pool, ex)
    check(ts)
    await ex.aclose()
    calls = 3 * args.workflows
    rate = args.rpm / 60.0
    ideal = max(0.0, calls - rate * 1.0) / rate + 2 * args.latency
    st = _get(url + "/_emulator/stats")
    stats, span = st["counts"], st["arrival_span_s"]
    # the steady-state rate the server saw: skip the first two seconds' worth of requests (the burst
    # and start-up), then requests per second between that arrival and the last one, over the limit
    times = sorted(_get(url + "/_emulator/arrivals"))
    steady = times[int(2 * rate):]
    server_rate = (len(steady) - 1) / (steady[-1] - steady[0]) if len(steady) > 1 else 0.0
    retries = sum(c.retries for t in ts for c in t.calls)
    info = {"calls": calls, "wall_s": round(wall, 2), "ideal_wall_s": round(ideal, 2),
            "server_steady_calls_per_s": round(server_rate, 1), "server_span_s": round(span, 2),
            "achieved_calls_per_s": round(calls / wall, 1), "limit_calls_per_s": round(rate, 1),
            "emulator_429": stats.get("openai:429", 0), "retries": retries,
            "errors_in_results": sum(1 for t in ts for c in t.calls if c.error)}
    return ideal / wall, info


async def bench_overhead(n: int) -> tuple[float, dict]:
    w = Worker(name="sim", provider="simulated", model="sim", options={"skills": {"default": 0.5}, "verbose": False},
               limits={"max_concurrency": 256, "requests_per_minute": 10_000_000})
    pool = Pool(pool_id="sim", workers=(w,))
    from conductor.workers.providers.simulated import register_gold

    ex = Executor()
    ts, warm = trajs(n, "ovh"), trajs(20, "warm")
    for t in ts + warm:
        register_gold(t.question, "42", "math")
    await execute_batch(warm, pool.full(), ex)
    c0 = time.process_time()
    wall = await timed_batch(ts, pool, ex)
    cpu = time.process_time() - c0
    check(ts)
    calls = 3 * n
    # the provider's own cost per call, on the same messages, without the executor
    provider = make_provider(w)
    msgs = [Message("user", f"<overall_task>\n{ts[i % n].question}\n</overall_task>\nYour assigned subtask: "
                    "Solve the problem.") for i in range(calls)]
    c0 = time.process_time()
    for m in msgs:
        await provider.complete([m], sample_index=0)
    direct = (time.process_time() - c0) / calls
    per_call = cpu / calls
    return max(0.0, per_call - direct) * 1000, {"calls": calls, "wall_s": round(wall, 2),
                                                "cpu_ms_per_call_with_executor": round(per_call * 1000, 3),
                                                "cpu_ms_per_call_provider_alone": round(direct * 1000, 3)}


async def bench_parallel(url: str, args: argparse.Namespace) -> tuple[float, dict]:
    w = Worker(name="emu", provider="openai_compatible", model="par-model", base_url=url + "/v1",
               limits={"max_concurrency": 512, "timeout_s": 30})
    pool = Pool(pool_id="bench", workers=(w,))
    ex = Executor()
    await execute_batch(trajs(args.parallel_workflows, "warmp"), pool.full(), ex)   # open enough connections
    seq, par = [], []
    for rep in range(2):          # interleaved, best of two: less exposed to other load on the machine
        seq_ts, par_ts = trajs(args.parallel_workflows, f"seq{rep}-"), trajs(args.parallel_workflows, f"par{rep}-")
        seq.append(await timed_batch(seq_ts, pool, ex, sequential=True))
        par.append(await timed_batch(par_ts, pool, ex))
        check(seq_ts)
        check(par_ts)
    seq, par = min(seq), min(par)
    await ex.aclose()
    return seq / par, {"sequential_s": round(seq, 2), "parallel_s": round(par, 2), "ideal_speedup": 1.5,
                       "latency_s": args.parallel_latency}


async def bench_ceiling(url: str, args: argparse.Namespace) -> dict:
    """No rate limit: how many calls/s this machine's SDK client + executor can push (context for ratio)."""
    w = Worker(name="emu", provider="openai_compatible", model="ceil-model", base_url=url + "/v1",
               limits={"max_concurrency": args.concurrency, "timeout_s": 30})
    pool = Pool(pool_id="bench", workers=(w,))
    ex = Executor()
    await execute_batch(trajs(4, "warmc"), pool.full(), ex)
    ts = trajs(args.ceiling_workflows, "ceil")
    c0 = time.process_time()
    wall = await timed_batch(ts, pool, ex)
    cpu = time.process_time() - c0
    check(ts)
    await ex.aclose()
    n = 3 * len(ts)
    return {"calls": n, "calls_per_s": round(n / wall, 1), "client_cpu_ms_per_call": round(cpu / n * 1000, 2)}


async def child_run(cfg: dict) -> dict:
    """One of the --processes: warm up, wait for the common start, run its share of workflows."""
    args = argparse.Namespace(**cfg["args"])
    pool = Pool(pool_id="bench", workers=(_limit_worker(cfg["url"], args),))
    ex = Executor(limiter=RateLimiter(burst_s=1.0, shared=open_shared(cfg["limits"])))
    await execute_batch(trajs(2, f"warm{cfg['index']}-"), pool.full(), ex)
    Path(cfg["ready"]).touch()
    while not os.path.exists(cfg["go"]):
        await asyncio.sleep(0.005)
    ts = trajs(cfg["workflows"], f"p{cfg['index']}-")
    await execute_batch(ts, pool.full(), ex)
    end = time.time()
    await ex.aclose()
    bad = [t.infra_cause for t in ts if t.infra_failed or t.rounds[0].parse_status != "ok"]
    return {"end": end, "calls": sum(len(t.calls) for t in ts), "retries": sum(c.retries for t in ts for c in t.calls),
            "failed_workflows": len(bad), "first_failure": bad[0] if bad else None}


def bench_processes(url: str, args: argparse.Namespace, limits: str, work: Path) -> tuple[float, dict]:
    """--processes OS processes against one emulator limit; (ratio, info)."""
    n = args.processes
    shares = [args.workflows // n + (1 if i < args.workflows % n else 0) for i in range(n)]
    go = work / f"go-{limits.split(':')[0]}"
    procs = []
    for i, w in enumerate(shares):
        cfg = {"index": i, "url": url, "limits": limits, "workflows": w, "go": str(go),
               "ready": str(work / f"ready-{limits.split(':')[0]}-{i}"), "args": vars(args)}
        procs.append(subprocess.Popen([sys.executable, __file__, "--child", json.dumps(cfg)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    deadline = time.time() + 600
    while not all((work / f"ready-{limits.split(':')[0]}-{i}").exists() for i in range(n)):
        dead = [p for p in procs if p.poll() is not None]
        if dead or time.time() > deadline:
            for p in procs:
                p.kill()
            raise SystemExit(f"error: a bench process failed to start: {dead[0].stderr.read()[-800:] if dead else 'timeout'}")
        time.sleep(0.05)
    time.sleep(1.5)                                  # let the shared buckets refill after the warm-ups
    _post(url + "/_emulator/reset", {})
    start = time.time()
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=1200)
        if p.returncode != 0:
            raise SystemExit(f"error: a bench process failed: {err.strip().splitlines()[-1] if err.strip() else p.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    wall = max(r["end"] for r in results) - start
    calls = sum(r["calls"] for r in results)
    rate = args.rpm / 60.0
    ideal = max(0.0, calls - rate * 1.0) / rate + 2 * args.latency
    st = _get(url + "/_emulator/stats")
    times = sorted(_get(url + "/_emulator/arrivals"))
    steady = times[int(2 * rate):]
    server_rate = (len(steady) - 1) / (steady[-1] - steady[0]) if len(steady) > 1 else 0.0
    info = {"processes": n, "limits": limits.split(":")[0], "calls": calls, "wall_s": round(wall, 2),
            "ideal_wall_s": round(ideal, 2), "server_steady_calls_per_s": round(server_rate, 1),
            "limit_calls_per_s": round(rate, 1), "emulator_429": st["counts"].get("openai:429", 0),
            "retries": sum(r["retries"] for r in results),
            "failed_workflows": sum(r["failed_workflows"] for r in results)}
    return ideal / wall, info


def main_processes(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-limits-"))
    limits = args.limits or f"sqlite:{work / 'limits.sqlite'}"
    proc, url = start_emulator(args.latency, args.rpm)
    try:
        if args.compare_local:
            lratio, linfo = bench_processes(url, args, "local", work)
            print(f"per-process limits (contrast): {json.dumps(linfo)}", flush=True)
            time.sleep(2.5)                          # the emulator's bucket refills before the shared run
        ratio, info = bench_processes(url, args, limits, work)
        print(f"shared limits: {json.dumps(info)}", flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)     # barrier files (and the default limits file)
    extra = f" local_ratio={lratio:.3f} local_429={linfo['emulator_429']}" if args.compare_local else ""
    print(f"ratio_to_limit={ratio:.3f} leaked_429={info['emulator_429']} processes={args.processes} "
          f"limits={info['limits']}{extra}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workflows", type=int, default=170, help="three-step workflows for the rate-limit run")
    ap.add_argument("--rpm", type=float, default=1500, help="requests/min limit (executor and emulator)")
    ap.add_argument("--latency", type=float, default=0.05, help="emulated seconds per call")
    ap.add_argument("--concurrency", type=int, default=64, help="max_concurrency of the worker")
    ap.add_argument("--overhead-workflows", type=int, default=1000)
    ap.add_argument("--parallel-workflows", type=int, default=8)
    ap.add_argument("--ceiling-workflows", type=int, default=100, help="unlimited run: the SDK client's own ceiling")
    ap.add_argument("--parallel-latency", type=float, default=0.5)
    ap.add_argument("--processes", type=int, default=1,
                    help="N > 1: N OS processes share the --rpm limit through --limits (only that is measured)")
    ap.add_argument("--limits", default=None,
                    help="shared store for --processes: sqlite:PATH (default: a temp file) or prefect[:PREFIX]")
    ap.add_argument("--compare-local", action="store_true",
                    help="with --processes: also run the same load with per-process limits, for contrast")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if args.child:
        print(json.dumps(asyncio.run(child_run(json.loads(args.child)))), flush=True)
        return
    if args.processes < 1 or args.workflows < 1:
        raise SystemExit("error: --processes and --workflows must be at least 1")
    if args.processes > 1:
        main_processes(args)
        return

    proc, url = start_emulator(args.latency, args.rpm)
    try:
        ratio, info = asyncio.run(bench_limit(url, args))
        print(f"rate limit: {json.dumps(info)}", flush=True)
        _post(url + "/_emulator/config", {"latency_s": args.parallel_latency, "rpm": None})
        speedup, pinfo = asyncio.run(bench_parallel(url, args))
        print(f"parallel steps: {json.dumps(pinfo)}", flush=True)
        _post(url + "/_emulator/config", {"latency_s": args.latency})
        print(f"client ceiling: {json.dumps(asyncio.run(bench_ceiling(url, args)))}", flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
    overhead, oinfo = asyncio.run(bench_overhead(args.overhead_workflows))
    print(f"overhead: {json.dumps(oinfo)}", flush=True)
    print(f"ratio_to_limit={ratio:.3f} leaked_429={info['emulator_429']} overhead_ms_per_call={overhead:.3f} "
          f"parallel_speedup={speedup:.2f}")


if __name__ == "__main__":
    main()
