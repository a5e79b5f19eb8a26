"""Batch mode against synchronous calls on the same questions: cost, answers, losses, latency, in one run.

Both runs are the real `conductor answer` command in a subprocess with the unchanged paper pool (GPT-5,
Gemini 2.5 Pro, Claude Sonnet 4 and four vLLM-served open models), every SDK pointed at the in-process
emulator by the SDKs' base-URL variables, and the conductor scripted per question (a mix of one- to
three-step workflows over all seven workers). The batch run goes through the OpenAI, Anthropic and Gemini
batch APIs of the emulator with a processing delay, partial failures (each request errors with
probability ``--error-p``) and expiry (each batch expires at ``--window`` of its processing time, so the
requests it had not reached come back expired): failed and expired requests are resubmitted once, then
called synchronously. The vLLM workers have no batch API and call synchronously in both runs.

    python bench/batch.py                          # 200 questions
    python bench/batch.py --questions 400 --delay 5

Last line: ``batch_cost_ratio=<batch dollars / sync dollars> answers_match=<0|1> lost=<questions answered
synchronously but not in batch mode>`` (targets: <= 0.55, 1, 0).
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

CONDUCTOR = "bench-conductor"
WORKFLOWS = [   # paper pool ordinals: 0 gpt-5, 1 gemini-2.5-pro, 2 claude-sonnet-4, 3..6 open models on vLLM
    ("[0, 1, 2]", '["Solve.", "Solve independently.", "Compare both and answer."]', '[[], [], ["all"]]'),
    ("[2, 3, 0]", '["Plan.", "Work it out.", "Check and answer."]', '[[], [0], ["all"]]'),
    ("[1]", '["Answer directly."]', "[[]]"),
    ("[5, 6, 2]", '["Solve.", "Solve with care.", "Reconcile."]', '[[], [], ["all"]]'),
    ("[0, 4]", '["Solve.", "Verify and answer."]', '[[], ["all"]]'),
    ("[3]", '["Answer."]', "[[]]"),
]
KEYS = {"OPENAI_API_KEY": "sk-bench-openai-0000", "ANTHROPIC_API_KEY": "sk-ant-bench-0000",
        "GEMINI_API_KEY": "bench-gemini-0000", "VLLM_API_KEY": "bench-vllm-0000"}


def _workflow(i: int) -> str:
    m, s, a = WORKFLOWS[i % len(WORKFLOWS)]
    return f"Plan for question {i}.\nmodel_id = {m}\nsubtasks = {s}\naccess_list = {a}"


def _run(cmd: list[str], env: dict[str, str], out: Path) -> tuple[float, dict]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise SystemExit(f"batch bench: `{' '.join(cmd[2:6])} ...` exited {proc.returncode}: " + " | ".join(tail))
    return wall, json.loads((out / "summary.json").read_text())


def _answers(out: Path) -> dict[str, str | None]:
    rows = [json.loads(x) for x in (out / "answers.jsonl").read_text().splitlines() if x.strip()]
    return {r["question_id"]: r.get("final_answer") for r in rows}


def _dollars(out: Path) -> float:
    from conductor.lake.reader import scan

    df = scan(str(out / "lake"), "trajectories").select("cost_usd").collect()
    return float(df["cost_usd"].sum())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=int, default=200)
    ap.add_argument("--delay", type=float, default=2.0, help="emulated processing time of one batch (s)")
    ap.add_argument("--window", type=float, default=0.9, help="a batch expires at this share of its processing time")
    ap.add_argument("--error-p", type=float, default=0.02, help="probability that a batched request errors")
    ap.add_argument("--poll", type=float, default=0.25, help="seconds between polls")
    ap.add_argument("--shard-size", type=int, default=25)
    ap.add_argument("--keep", default=None, help="keep the run directories in this new directory")
    a = ap.parse_args(argv)

    from conductor.execution.batch.store import BatchStore
    from conductor.testing.emulator import Emulator, EmulatorConfig

    n = a.questions
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="conductor-batch-bench-"))
    if a.keep and work.exists() and any(work.iterdir()):
        raise SystemExit(f"batch bench: --keep {work}: directory exists and is not empty; pick a new one")
    work.mkdir(parents=True, exist_ok=True)
    scripted = [{"match": f"Question {i}:", "model": CONDUCTOR, "reply": _workflow(i)} for i in range(n)]
    emu = Emulator(EmulatorConfig(scripted=scripted, batch_delay_s=a.delay, batch_window_s=a.delay * a.window,
                                  batch_error_p=a.error_p)).start()
    try:
        q = work / "questions.jsonl"
        q.write_text("".join(json.dumps({"id": f"q{i:04d}", "question": f"Question {i}: what is {i} * 7?",
                                         "answer": str(i * 7)}) + "\n" for i in range(n)))
        env = {**os.environ, **KEYS, "PREFECT_HOME": str(work / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
               "OPENAI_BASE_URL": f"{emu.base_url}/v1", "ANTHROPIC_BASE_URL": emu.base_url,
               "GOOGLE_GEMINI_BASE_URL": emu.base_url, "VLLM_BASE_URL": f"{emu.base_url}/v1"}

        def cmd(out: Path, *extra: str) -> list[str]:
            return [sys.executable, "-m", "conductor.cli", "answer", str(q), "--out", str(out),
                    "--pool", str(ROOT / "data" / "pools" / "paper.yaml"), "--shard-size", str(a.shard_size),
                    "--conductor", f"openai:{CONDUCTOR}@{emu.base_url}/v1", *extra]

        print(f"batch bench: {n} questions, paper pool on the emulator, batch delay {a.delay:g}s, expiry at "
              f"{a.window:.0%} of it, request error p={a.error_p:g}, poll {a.poll:g}s, load={os.getloadavg()[0]:.1f}",
              flush=True)
        sync_s, sync = _run(cmd(work / "sync"), env, work / "sync")
        sync_counts = emu.stats()
        print(f"[sync]  {sync['questions']} questions in {sync_s:.1f}s  calls/q={sync['calls_per_question']:.2f} "
              f"${_dollars(work / 'sync'):.4f}  provider requests: openai-route {sync_counts.get('openai', 0)} "
              f"anthropic {sync_counts.get('anthropic', 0)} gemini {sync_counts.get('gemini', 0)}", flush=True)
        emu.reset()
        batch_s, batch = _run(cmd(work / "batch", "--batch", "--batch-poll", str(a.poll)), env, work / "batch")
        counts = emu.stats()
        store = BatchStore(work / "batch" / "cache.batches.sqlite")
        subs = store.submissions()
        batches = store.batches()
        store.close()
        waves = max((b["wave"] for b in batches), default=0)
        print(f"[batch] {batch['questions']} questions in {batch_s:.1f}s  calls/q={batch['calls_per_question']:.2f} "
              f"${_dollars(work / 'batch'):.4f}  batches {len(batches)} ({sum(b['n'] for b in batches)} requests, "
              f"{sum(1 for v in subs.values() if v > 1)} resubmitted), synchronous: anthropic {counts.get('anthropic', 0)} "
              f"gemini {counts.get('gemini', 0)} openai-route {counts.get('openai', 0)} (conductor + vLLM + "
              f"GPT-5 stragglers)", flush=True)
        s_ans, b_ans = _answers(work / "sync"), _answers(work / "batch")
    finally:
        emu.stop()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    ratio = (batch["dollars_per_question"] / sync["dollars_per_question"]) if sync["dollars_per_question"] else 0.0
    lost = sum(1 for k, v in s_ans.items() if v and not b_ans.get(k))
    match = int(s_ans == b_ans)
    print(f"[latency] {waves} waves; each waits out one batch turnaround (here {a.delay:g}s emulated; real "
          f"providers: minutes to 24 h), so a batch run takes about {waves} x the turnaround. Wall here: batch "
          f"{batch_s:.1f}s, sync {sync_s:.1f}s (sync runs shard by shard, batch mode executes all shards at once)",
          flush=True)
    print(f"batch_cost_ratio={ratio:.3f} answers_match={match} lost={lost}")


if __name__ == "__main__":
    main()
