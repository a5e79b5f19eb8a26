"""Trajectory explorer benchmark: a synthetic lake of 1,000,000 trajectories, then the time the running viewer
(`conductor lake view`, served by uvicorn on 127.0.0.1) takes to answer the first page of the trajectory table,
a filtered page, and one trajectory's page, each fetched over HTTP like a browser would.

    python bench/lake_view.py                       # 1,000,000 trajectories in /tmp/lake_view_bench
    python bench/lake_view.py --rows 100000 --dir /tmp/lv100k

The lake is built once and kept (``--dir``); building is resumable: each shard of ``--shard-size`` rows is
committed by ``write_shard`` and skipped on the next run once ``shard_done`` says so. Ten runs of 100,000
rows: eight rollout iterations (policy versions 0-7, with training records), and two evaluation runs of two
checkpoints on the same questions (the row count is split into ten runs the same way for other ``--rows``). Rows are lighter than bench/lake.py's (a 600-character prompt, 64 completion
tokens, 300-character replies): the viewer reads the table's small columns, and only the detail page reads a
whole row.

``first_page_ms`` is the first request a fresh server answers (the table's first page; nothing cached but the
Parquet footers DuckDB read at start), the median over ``--fresh`` servers started one after the other;
``filtered_page_ms`` the median over five different filter sets (one per dataset, each combining several
filters); ``detail_ms`` the median over the first trajectory of each of those pages (its page: the row, its calls,
the drawn graph). No page result is cached by the viewer; counts of filtered tables are not part of a page (they
arrive on their own request).

Last line (the contract):
    trajectories=<n> first_page_ms=<a> filtered_page_ms=<b> detail_ms=<c>
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import threading
import time
from typing import Any

from conductor.lake.synthetic import synthetic_trajectories
from conductor.lake.writer import shard_done, write_shard, write_training_record

N_RUNS = 10   # eight GRPO iterations and two evaluation runs


def plan_runs() -> list[tuple[str, str, str, int | None, float]]:
    """(run_id, kind, checkpoint, policy_version, accuracy shift) of the N_RUNS runs."""
    runs: list[tuple[str, str, str, int | None, float]] = [
        (f"grpo-it{i:02d}", "rollout", f"ckpt-{i:04d}", i, 0.02 * i) for i in range(8)]
    runs += [("eval-ckpt-0007", "eval", "ckpt-0007", None, 0.14), ("eval-ckpt-0008", "eval", "ckpt-0008", None, 0.18)]
    return runs


def build(root: str, rows: int, shard_size: int) -> None:
    per_run = rows // N_RUNS
    for r, (run_id, kind, ckpt, version, shift) in enumerate(plan_runs()):
        seed = 7 if kind == "eval" else r     # both evaluation runs get the same questions
        for start in range(0, per_run, shard_size):
            sid = f"{start // shard_size:05d}"
            if shard_done(root, kind, run_id, sid):
                continue
            t0 = time.perf_counter()
            n = min(shard_size, per_run - start)
            trajs = synthetic_trajectories(n, run_id=run_id, kind=kind, seed=seed, start=start, prompt_chars=600,
                                           completion_tokens=64, response_chars=300, checkpoint_id=ckpt,
                                           policy_version=version, accuracy_shift=shift)
            write_shard(root, trajs, sid)
            print(f"built {run_id} shard {sid}: {n} rows in {time.perf_counter() - t0:.1f} s", flush=True)
        if kind == "rollout":
            write_training_record(root, run_id, {
                "rollout_run": run_id, "checkpoint_id": f"ckpt-{r + 1:04d}", "iteration": r + 1,
                "policy_version": r, "metrics": {"iteration": r + 1, "kl_ref": 0.002 * r, "entropy": 0.9 - 0.05 * r,
                                                 "loss": 0.01, "reward_mean": 0.5 + 0.02 * r}})


def serve(root: str) -> tuple[str, Any, threading.Thread]:
    import uvicorn

    from conductor.lake.view.app import create_app

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = uvicorn.Server(uvicorn.Config(create_app([root]), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", server, thread


def ms(client: Any, url: str) -> float:
    t0 = time.perf_counter()
    client.get(url).raise_for_status()
    return (time.perf_counter() - t0) * 1000


FILTERS = ["dataset={d}&correct=false&steps_min=3&worker=gpt-5&cost_max=0.05",
           "dataset={d}&correct=true&steps_max=2&worker=claude-sonnet-4",
           "dataset={d}&failure=parse", "dataset={d}&q=verify%20answer&cost_min=0.01",
           "dataset={d}&training=unused&reward_min=0.5"]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dir", default="/tmp/lake_view_bench")
    ap.add_argument("--shard-size", type=int, default=20_000)
    ap.add_argument("--fresh", type=int, default=3, help="fresh servers whose first page is timed (median)")
    ap.add_argument("--build-only", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    build(args.dir, args.rows, args.shard_size)
    print(f"lake ready in {time.perf_counter() - t0:.1f} s", flush=True)
    if args.build_only:
        return
    import httpx

    firsts, starts = [], []
    for _ in range(args.fresh - 1):                   # first pages of fresh servers (noisy on a shared machine)
        t1 = time.perf_counter()
        base, server, thread = serve(args.dir)
        starts.append((time.perf_counter() - t1) * 1000)
        with httpx.Client(base_url=base, timeout=600) as client:
            firsts.append(ms(client, "/trajectories"))
        server.should_exit = True
        thread.join(timeout=30)
    t1 = time.perf_counter()
    base, server, thread = serve(args.dir)
    starts.append((time.perf_counter() - t1) * 1000)
    datasets = ("gsm8k", "math500", "mmlu", "gpqa", "rlpr")
    with httpx.Client(base_url=base, timeout=600) as client:
        firsts.append(ms(client, "/trajectories"))     # a fresh server: nothing cached but Parquet footers
        first, start_ms = statistics.median(firsts), statistics.median(starts)
        warm = statistics.median(ms(client, f"/trajectories?offset={k * 50}") for k in range(1, 6))
        urls = [f"/trajectories?{f.format(d=d)}" for f, d in zip(FILTERS, datasets)]
        filtered = statistics.median(ms(client, u) for u in urls)
        links = [m.replace("&amp;", "&") for u in urls for m in re.findall(r'href="(/t/[^"]+)"', client.get(u).text)[:1]]
        if not links:
            raise SystemExit("error: the filtered pages link no trajectory")
        detail = statistics.median(ms(client, link) for link in links)
        runs = ms(client, "/runs")
        n = int(client.get("/api/count").json()["count"])
    server.should_exit = True
    thread.join(timeout=30)
    print(f"server_start_ms={start_ms:.0f} (lists files, checks footers, builds the views) "
          f"first_pages_ms={','.join(f'{x:.0f}' for x in firsts)} first_page_warm_ms={warm:.0f} "
          f"runs_page_cold_ms={runs:.0f} detail_pages={len(links)}")
    print(f"trajectories={n} first_page_ms={first:.0f} filtered_page_ms={filtered:.0f} detail_ms={detail:.0f}")
    os._exit(0)   # skip interpreter teardown: DuckDB's bindings complain about objects alive at exit


if __name__ == "__main__":
    main()
