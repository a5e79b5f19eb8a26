"""Trajectory lake benchmark: write throughput, standard-report query time, and the same questions
answered from the same data as JSONL scanned naively (json.loads per line), measured in one run.

    python bench/lake.py --rows 10000

Last line (the contract):
    rows=<N> write_rows_per_s=<x> report_s=<y> query_speedup_vs_jsonl=<z>

The JSONL side is given every advantage: one line per trajectory holding exactly the
lake row (derived columns precomputed, calls nested), and ONE pass computing all the
questions at once, whereas the lake answers each question with its own lazy scan.

Compaction (``--compaction``): the layout bulk answering leaves, one run of
``--questions`` trajectories committed by ``write_shard`` in shards of
``--shard-size`` (5: the answer flow's default), so 100,000 questions are 20,000
shards and 40,000 files. Then files and standard-report time before, ``compact``,
files and report time after, and the report tables compared (same values):

    python bench/lake.py --compaction --questions 100000 --dir /tmp/lk100k

Last line: questions=<N> files_before=<n> files_after=<m> report_s_before=<x>
report_s_after=<y> query_speedup=<x/y> compact_s=<z>
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from conductor.lake.queries import standard_report
from conductor.lake.reader import open_lake
from conductor.lake.schema import call_rows, trajectory_row
from conductor.lake.synthetic import synthetic_trajectories
from conductor.lake.writer import write_shard

RUN_ID = "answer-bench100k"


def _jsonl_line(t) -> str:
    row = trajectory_row(t)
    row["calls"] = call_rows(t)
    return json.dumps(row)


def jsonl_report(path: Path) -> dict:
    """The standard questions over JSONL, one naive pass with json.loads per line."""
    by = {k: defaultdict(lambda: [0, 0, 0, 0.0, 0, 0, 0, 0.0]) for k in ("dataset", "pool_id", "checkpoint_id")}
    by_worker: dict = defaultdict(lambda: [0, 0, 0, 0.0, 0, 0, 0, 0.0])
    per_q: dict = defaultdict(lambda: [0, 0, 0, 0.0, 0, 0])
    usage_dom: Counter = Counter()
    usage_step: Counter = Counter()
    length: Counter = Counter()
    failures: Counter = Counter()
    vs_cost: dict = defaultdict(lambda: [set(), 0, 0, 0, 0.0, 0])

    def add(acc, r):
        acc[0] += 1
        if r["correct"] is not None:
            acc[1] += 1
            acc[2] += r["correct"]
        if r["reward"] is not None:
            acc[3] += r["reward"]
            acc[4] += 1
        acc[5] += r["parse_status"] == "ok"
        acc[6] += r["infra_failed"]
        acc[7] += r["cost_usd"]

    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            for k, table in by.items():
                add(table[r[k]], r)
            for w in {c["worker"] for c in r["calls"]}:
                add(by_worker[w], r)
            q = per_q[(r["dataset"], r["question_id"])]
            q[0] += 1
            q[1] += r["n_calls"]
            q[2] += r["tokens"]
            q[3] += r["cost_usd"]
            if r["correct"] is not None:
                q[4] += 1
                q[5] += r["correct"]
            for c in r["calls"]:
                if c["depth"] == 0:
                    usage_dom[(r["domain"], c["worker"])] += 1
                    usage_step[(c["step"], c["worker"])] += 1
                if c["error"] or c["error_kind"]:
                    failures[("call", c["error_kind"] or "unknown")] += 1
            if r["parse_status"] == "ok":
                length[(r["domain"], r["n_steps"])] += 1
            elif r["parse_status"] in ("parse_error", "invalid"):
                failures[(r["parse_status"], (r["parse_error"] or "unknown").split(":")[0].strip().lower())] += 1
            if r["infra_failed"]:
                failures[("infra", (r["infra_cause"] or "unknown").split(":")[0].strip().lower())] += 1
            v = vs_cost[(r["run_id"], r["checkpoint_id"], r["dataset"])]
            v[0].add(r["question_id"])
            v[1] += 1
            if r["correct"] is not None:
                v[2] += 1
                v[3] += r["correct"]
            v[4] += r["cost_usd"]
    acc = {k: {g: a[2] / a[1] if a[1] else None for g, a in t.items()} for k, t in by.items()}
    acc["worker"] = {g: a[2] / a[1] if a[1] else None for g, a in by_worker.items()}
    return {"accuracy": acc, "per_question": per_q, "usage_domain": usage_dom, "usage_step": usage_step,
            "length": length, "failures": failures, "vs_cost": vs_cost}


def write_range(lake: str, first: int, last: int, shard_size: int, questions: int) -> int:
    """Shards ``first..last-1`` of the answer-run layout (one process of the writers)."""
    for sh in range(first, last):
        n = min(shard_size, questions - sh * shard_size)
        ts = list(synthetic_trajectories(n, start=sh * shard_size, seed=11, run_id=RUN_ID, kind="answer"))
        write_shard(lake, ts, f"{sh:06d}")
    return last - first


def build_layout(lake: Path, questions: int, shard_size: int, writers: int) -> float:
    """Write the layout with ``writers`` processes (each shard: two fsynced files, as in a real run)."""
    from concurrent.futures import ProcessPoolExecutor

    shards = -(-questions // shard_size)
    step = 500
    t0 = time.perf_counter()
    done = 0
    with ProcessPoolExecutor(max_workers=writers) as pool:
        futures = [pool.submit(write_range, str(lake), a, min(shards, a + step), shard_size, questions)
                   for a in range(0, shards, step)]
        for f in futures:
            done += f.result()
            print(f"  {done}/{shards} shards written, {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
    return time.perf_counter() - t0


def _files(lake: Path) -> int:
    return sum(1 for p in lake.rglob("*.parquet") if not p.name.startswith("."))


def _timed_report(lake: Path, repeat: int) -> tuple[float, dict]:
    best, tables = float("inf"), {}
    for _ in range(repeat):
        t0 = time.perf_counter()
        tables = standard_report(open_lake(str(lake)))   # fresh open: listing and footers included
        best = min(best, time.perf_counter() - t0)
    return best, tables


def canonical(df):
    """Rows in an order that does not depend on float rounding (a report sorted by a mean can swap ties)."""
    keys = [c for c, t in df.schema.items() if not t.is_float()]
    return df.sort(keys, nulls_last=True) if keys else df


def main_compaction(args: argparse.Namespace) -> None:
    from polars.testing import assert_frame_equal

    from conductor.lake.compact import compact

    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="lake-compact-bench-"))
    lake = work / "lake"
    try:
        if args.reuse and (lake / "trajectories").exists():
            build_s = float("nan")
        else:
            shutil.rmtree(lake, ignore_errors=True)
            build_s = build_layout(lake, args.questions, args.shard_size, args.writers)
        files_before = _files(lake)
        mb_before = sum(p.stat().st_size for p in lake.rglob("*.parquet")) / 1e6
        before_s, before = _timed_report(lake, args.repeat)
        print(f"before: {files_before} files, {mb_before:.0f} MB, report {before_s:.2f}s", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        rep = compact(str(lake), run_id=RUN_ID, target_mb=args.target_mb)
        compact_s = time.perf_counter() - t0
        files_after = _files(lake)
        mb_after = sum(p.stat().st_size for p in lake.rglob("*.parquet")) / 1e6
        after_s, after = _timed_report(lake, args.repeat)
        print(f"compaction {compact_s:.1f}s: {rep.line()}", file=sys.stderr, flush=True)
        for name, df in before.items():      # the same answers (floats up to summation order)
            assert_frame_equal(canonical(df), canonical(after[name]), check_exact=False, rel_tol=1e-9)
        print(f"layout written in {build_s:.0f}s; compaction: {rep.line()}; {mb_before:.0f} MB -> {mb_after:.0f} MB; "
              f"report {before_s:.2f}s -> {after_s:.2f}s (best of {args.repeat}); report tables equal", file=sys.stderr)
        print(f"questions={args.questions} files_before={files_before} files_after={files_after} "
              f"report_s_before={before_s:.3f} report_s_after={after_s:.3f} query_speedup={before_s / after_s:.1f} "
              f"compact_s={compact_s:.1f}")
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000, help="synthetic trajectories (default 10000: well under a minute)")
    ap.add_argument("--shard-size", type=int, default=None,
                    help="trajectories per shard file (default 10000; with --compaction 5, as bulk answering)")
    ap.add_argument("--dir", default=None, help="work directory (default: a temp dir, removed afterwards)")
    ap.add_argument("--repeat", type=int, default=2, help="query timings: best of this many runs")
    ap.add_argument("--no-jsonl", action="store_true",
                    help="skip the JSONL side (huge N: measures write and report only; speedup prints as nan)")
    ap.add_argument("--compaction", action="store_true",
                    help="measure compaction instead: files and report time before/after on an answer-run layout")
    ap.add_argument("--questions", type=int, default=100_000, help="--compaction: trajectories in the run")
    ap.add_argument("--writers", type=int, default=2, help="--compaction: processes writing the layout")
    ap.add_argument("--target-mb", type=float, default=128.0, help="--compaction: size of the compacted files")
    ap.add_argument("--reuse", action="store_true", help="--compaction: keep a layout already in --dir")
    args = ap.parse_args()
    if args.compaction:
        if args.questions <= 0 or args.writers <= 0:
            sys.exit("error: --questions and --writers must be positive")
        args.shard_size = args.shard_size or 5
        if args.shard_size <= 0:
            sys.exit("error: --shard-size must be positive")
        main_compaction(args)
        return
    args.shard_size = args.shard_size or 10_000
    if args.rows <= 0 or args.shard_size <= 0:
        sys.exit("error: --rows and --shard-size must be positive")

    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="lake-bench-"))
    lake, jsonl = work / "lake", work / "trajectories.jsonl"
    shutil.rmtree(lake, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    write_s = 0.0
    t_start = time.perf_counter()
    try:
        with open(os.devnull if args.no_jsonl else jsonl, "w", encoding="utf-8") as jf:
            for shard, start in enumerate(range(0, args.rows, args.shard_size)):
                n = min(args.shard_size, args.rows - start)
                batch = list(synthetic_trajectories(n, start=start, seed=7))
                t0 = time.perf_counter()
                write_shard(str(lake), batch, f"{shard:05d}")
                write_s += time.perf_counter() - t0
                if not args.no_jsonl:
                    jf.writelines(_jsonl_line(t) + "\n" for t in batch)
                print(f"  shard {shard:05d}: {start + n}/{args.rows} rows, lake write {write_s:.1f}s total, "
                      f"elapsed {time.perf_counter() - t_start:.0f}s", file=sys.stderr, flush=True)
        lake_mb = sum(p.stat().st_size for p in lake.rglob("*.parquet")) / 1e6
        jsonl_mb = 0.0 if args.no_jsonl else jsonl.stat().st_size / 1e6

        report_s = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            tables = standard_report(open_lake(str(lake)))   # fresh open: file listing + footers included
            report_s = min(report_s, time.perf_counter() - t0)
        jsonl_s = float("nan")
        naive = None
        for _ in range(0 if args.no_jsonl else max(1, args.repeat - 1)):
            t0 = time.perf_counter()
            naive = jsonl_report(jsonl)
            elapsed = time.perf_counter() - t0
            jsonl_s = elapsed if jsonl_s != jsonl_s else min(jsonl_s, elapsed)

        if naive is not None:   # both sides answered the same questions: spot-check that the answers agree
            for row in tables["accuracy_by_dataset"].iter_rows(named=True):
                a, b = row["accuracy"], naive["accuracy"]["dataset"][row["dataset"]]
                assert a is None and b is None or abs(a - b) < 1e-9, (row["dataset"], a, b)
            assert sum(naive["length"].values()) == tables["workflow_length_by_domain"]["n"].sum()
            assert sum(naive["usage_step"].values()) == tables["worker_usage_by_step"]["n_calls"].sum()

        print(f"lake: {lake_mb:.1f} MB Parquet vs {jsonl_mb:.1f} MB JSONL; "
              f"write {write_s:.2f}s; report {report_s:.3f}s (best of {args.repeat}); jsonl scan {jsonl_s:.2f}s",
              file=sys.stderr)
        print(f"rows={args.rows} write_rows_per_s={args.rows / write_s:.0f} report_s={report_s:.3f} "
              f"query_speedup_vs_jsonl={jsonl_s / report_s:.1f}")
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("POLARS_MAX_THREADS", str(os.cpu_count() or 2))
    main()
