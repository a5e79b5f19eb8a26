"""Questions per minute of the whole answer flow (`conductor answer`), cold cache vs warm cache, in one run.

Each run is the real command in a subprocess: Prefect flow in ephemeral mode, the embedded llama.cpp servers
started and stopped, conductor generation, the rate-limited executor, grading, the lake and the report. So
the figure includes start-up (servers loading their GGUF files), which is what a user waits for.

- cold: a fresh output directory and an empty response cache;
- warm: a new run (new run id, new output directory) over the same questions reading the cold run's cache:
  the conductor still generates (its generations are not cached), but worker calls that repeat hit the
  cache; the hit rate is printed because it depends on the conductor writing the same workflows (same seed);
- resume: the cold command again, unchanged: every shard is already committed, so nothing is redone.

    python bench/answer_flow.py                                     # embedded pool, 2 GSM8K + 2 MMLU-STEM
    python bench/answer_flow.py --questions gsm8k_test:5,mmlu_stem:5 --max-steps 3
    python bench/answer_flow.py --pool data/pools/simulated.yaml --conductor llamacpp:FILE.gguf   # quick

Last line: ``cold_questions_per_min=<x> warm_questions_per_min=<y> warm_speedup=<z> warm_cache_hit_rate=<h>
resume_s=<s>``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _answer(questions: str, out: Path, run_id: str, extra: list[str], cache: Path | None = None) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "conductor.cli", "answer", questions, "--out", str(out), "--run-id", run_id, *extra]
    if cache is not None:
        cmd += ["--cache", str(cache)]
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise SystemExit(f"answer_flow: `{' '.join(cmd[2:])}` exited {proc.returncode}: " + " | ".join(tail))
    return wall, json.loads((out / "summary.json").read_text())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", default="gsm8k_test:2,mmlu_stem:2")
    ap.add_argument("--pool", default=None, help="pool manifest (default: the embedded local pool)")
    ap.add_argument("--conductor", default="auto")
    ap.add_argument("--max-steps", type=int, default=3)
    ap.add_argument("--shard-size", type=int, default=2)
    ap.add_argument("--keep", default=None, help="keep the run directories in this new directory (default: a temp dir, removed)")
    a = ap.parse_args(argv)

    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="conductor-answer-bench-"))
    if a.keep and work.exists() and any(work.iterdir()):   # never delete a directory we did not create
        raise SystemExit(f"answer_flow: --keep {work}: directory exists and is not empty; pick a new one")
    work.mkdir(parents=True, exist_ok=True)
    extra = ["--conductor", a.conductor, "--max-steps", str(a.max_steps), "--shard-size", str(a.shard_size)]
    if a.pool:
        extra += ["--pool", a.pool]
    try:
        print(f"answer flow bench: {a.questions} conductor={a.conductor} pool={a.pool or 'embedded local'} "
              f"max_steps={a.max_steps} load={os.getloadavg()[0]:.1f}", flush=True)
        cold_s, cold = _answer(a.questions, work / "cold", "bench-cold", extra)
        n = cold["questions"]
        print(f"[cold]   {n} questions in {cold_s:.1f}s  calls/q={cold['calls_per_question']:.2f} "
              f"cache_hits={cold['cache_hits']} accuracy={cold['accuracy']} parse_failures={cold['parse_failures']}",
              flush=True)
        warm_s, warm = _answer(a.questions, work / "warm", "bench-warm", extra, cache=work / "cold" / "cache.sqlite")
        calls = warm["calls_per_question"] * max(1, warm["questions"])
        hit_rate = warm["cache_hits"] / calls if calls else 0.0
        print(f"[warm]   {warm['questions']} questions in {warm_s:.1f}s  cache hits {warm['cache_hits']}/{calls:.0f} "
              f"calls", flush=True)
        resume_s, resumed = _answer(a.questions, work / "cold", "bench-cold", extra)
        if resumed["trajectories"] != cold["trajectories"]:
            raise SystemExit(f"answer_flow: resume changed the row count {cold['trajectories']} -> {resumed['trajectories']}")
        print(f"[resume] same command again: {resume_s:.1f}s, rows unchanged ({resumed['trajectories']})", flush=True)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    cold_qpm, warm_qpm = 60 * n / cold_s, 60 * warm["questions"] / warm_s
    print(f"cold_questions_per_min={cold_qpm:.3f} warm_questions_per_min={warm_qpm:.3f} "
          f"warm_speedup={warm_qpm / cold_qpm:.2f} warm_cache_hit_rate={hit_rate:.2f} resume_s={resume_s:.1f}")


if __name__ == "__main__":
    main()
