"""Seconds per question of the main job, the conductor against its best worker alone, on the same questions.

Every run is the real `conductor answer` in a subprocess (Prefect flow, the embedded llama.cpp servers started
on first use, conductor generation, the rate-limited executor, grading, lake, report), so the figures include
everything a user waits for. In one invocation, on the same questions:

- conductor first run: the default conductor (the untrained embedded one unless a champion exists), fresh
  output directory and response cache, and no saved prompt prefixes (as on a new machine);
- conductor cold: the same, except that the first run's saved prompt prefixes are there (as on every later
  run: conductor/local/prefix_cache.py);
- single cold: `--conductor fixed:0` (Qwen2.5-Coder-1.5B answers alone: the best local worker), fresh cache,
  on the product's default threads for it (a fixed strategy runs the serial layout: every core;
  conductor/local/layout.py);
- single best: the same at every other thread count (``$CONDUCTOR_LOCAL_THREADS`` = 1 .. cores), fresh cache each:
  the single worker as a user would run it alone, at its fastest setting on these cores; the fastest of all
  single runs is the fair baseline (``best_single_s_per_question``, ``fair_ratio``);
- warm: the conductor run again under a new run id and output directory, reading the cold run's cache: with a
  seeded conductor every generation and every worker call is a cache hit (conductor/policy/cached.py);
- resume: the cold conductor command again, unchanged: every shard is committed, nothing is redone.

Above the last line it prints the tokens behind the figures (conductor prefill after the shared prefix and
decode; worker prefill and decode on the 1.5B; other calls' seconds) and the floor they imply at this
machine's measured llama.cpp prefill and decode rates for the 1.5B.

With ``--busy`` it then runs the conductor (cold, saved prefixes) and the 1.5B alone again while another process
keeps one core busy (a spinning Python process, as a user's other job would), measures the llama.cpp rates
under that load, and prints the busy ratio and its floor beside the idle ones; the 1.5B alone runs at every
thread count there too, and ``busy_fair_ratio`` is the busy conductor over the fastest of them.

    python bench/answer_flow.py                                           # the quickstart mix, 10 questions
    python bench/answer_flow.py --busy                                    # and again with one core busy
    python bench/answer_flow.py --questions gsm8k_test:2,mmlu_stem:2      # a quick look
    python bench/answer_flow.py --quick                                   # a smoke run: 1+1 questions, shows the line
    python bench/answer_flow.py --conductor menu:fixed:0,chain:0:1 --conductor-threads 2   # another conductor

Last line: ``conductor_s_per_question=<x> single_s_per_question=<y> ratio=<x/y> floor_ratio=<f>
cold_questions_per_min=<c> warm_questions_per_min=<w> warm_speedup=<w/c> conductor_accuracy=<a>
single_accuracy=<b> resume_s=<s> first_run_s_per_question=<f> best_single_s_per_question=<z> best_single_threads=<t>
fair_ratio=<x/z> busy_fair_ratio=<r>`` (``nan`` without ``--busy``) and, with ``--busy``,
``busy_conductor_s_per_question=<x> busy_single_s_per_question=<y> busy_ratio=<x/y> busy_floor_ratio=<f>
busy_best_single_s_per_question=<z>``. A floor is the tokens' time at the
measured single-stream rates, the conductor's decode counted token by token (its prompt-lookup drafts are
verified in batches, so it can run below its floor).
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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIG = "qwen2.5-coder-1.5b-instruct"


class Slower(Exception):
    """A run stopped at its time limit (``_answer(limit_s=...)``): it could no longer be the fastest."""


def _answer(questions: str, out: Path, run_id: str, extra: list[str], cache: Path | None = None,
            prefixes: Path | None = None, threads: int | None = None,
            limit_s: float | None = None) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "conductor.cli", "answer", questions, "--out", str(out), "--run-id", run_id, *extra]
    if cache is not None:
        cmd += ["--cache", str(cache)]
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    if prefixes is not None:
        env["CONDUCTOR_PREFIX_CACHE"] = str(prefixes)
    env.pop("CONDUCTOR_LOCAL_THREADS", None)
    if threads is not None:
        env["CONDUCTOR_LOCAL_THREADS"] = str(threads)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit_s)
    except subprocess.TimeoutExpired:
        raise Slower(f"stopped after {limit_s:.0f} s") from None
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise SystemExit(f"answer_flow: `{' '.join(cmd[2:])}` exited {proc.returncode}: " + " | ".join(tail))
    return wall, json.loads((out / "summary.json").read_text())


@contextmanager
def busy_core() -> Iterator[None]:
    """Another process keeping one core busy for as long as the block runs."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def llama_rates(threads: int, scale: int = 1) -> tuple[float, float]:
    """(prefill, decode) tokens/s of the 1.5B under llama.cpp on this machine, measured now (on 1/``scale`` of
    the usual 480 prompt and 48 generated tokens: ``--quick``)."""
    from llama_cpp import Llama

    from conductor.local.embedded import model_path

    llm = Llama(model_path=str(model_path(BIG)), n_ctx=2048, n_threads=threads, verbose=False)
    prompt = llm.tokenize(("The quick brown fox jumps over the lazy dog. " * 60).encode())[:480 // scale]
    t0 = time.perf_counter()
    llm.eval(prompt)
    prefill = len(prompt) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    out = llm.create_completion("Count from one to fifty in words:", max_tokens=48 // scale, temperature=0)
    decode = out["usage"]["completion_tokens"] / (time.perf_counter() - t0)
    return prefill, decode


def token_budget(lake: Path, run_id: str, seen: Path | None = None, seen_run: str = "") -> dict[str, float]:
    """Per question: conductor prefill beyond what the previous prompt and the saved prefix states cover (the
    ``seen`` run saved those this run starts with), conductor decode, 1.5B worker prefill/decode, and the
    seconds of calls to other workers (smaller models, the python tool)."""
    import polars as pl
    from llama_cpp import Llama

    from conductor.lake.reader import scan
    from conductor.local.embedded import model_path

    tok = Llama(model_path=str(model_path(BIG)), vocab_only=True, verbose=False)
    trajs = scan(str(lake), "trajectories", run_id=run_id).select("question_id", "prompt", "completion",
                                                                 "completion_token_ids").collect()
    calls = scan(str(lake), "calls", run_id=run_id).select("model", "input_tokens", "output_tokens", "latency_s",
                                                           "cache_hit").collect()
    n = max(1, trajs["question_id"].n_unique())
    saved: list[list[int]] = []        # the prefix states the conductor backend holds (prefix_cache.py)
    if seen is not None:
        seen_prompts = scan(str(seen), "trajectories", run_id=seen_run).sort("question_id").collect()["prompt"]
        _prefills([tok.tokenize((p or "").encode()) for p in seen_prompts], saved)
    ordered = trajs.sort("question_id")
    prefill = sum(_prefills([tok.tokenize((p or "").encode()) for p in ordered["prompt"]], saved))
    # the tokens the model decoded: its stored token ids (a menu's are its few choice tokens; its completion text
    # is the chosen entry's whole workflow), else the completion's tokens
    decode = sum(len(ids) if ids is not None else len(tok.tokenize((c or "").encode(), add_bos=False))
                 for c, ids in zip(ordered["completion"], ordered["completion_token_ids"]))
    big = calls.filter(pl.col("model").str.contains("1.5b") & ~pl.col("cache_hit"))
    other = calls.filter(~pl.col("model").str.contains("1.5b") & ~pl.col("cache_hit"))
    return {"conductor_prefill": prefill / n, "conductor_decode": decode / n,
            "worker_prefill": big["input_tokens"].sum() / n, "worker_decode": big["output_tokens"].sum() / n,
            "other_call_s": float(other["latency_s"].sum() or 0.0) / n}


def _prefills(prompts: list[list[int]], saved: list[list[int]]) -> list[int]:
    """Tokens each prompt has to evaluate after the previous prompt's KV cache and the saved prefix states;
    like the backend, a long prefix shared with the previous prompt is saved (appended to ``saved``)."""
    from conductor.local.prefix_cache import MIN_SAVED_PREFIX, common_length

    out, prev = [], []
    for ids in prompts:
        with_prev = common_length(ids, prev)
        out.append(len(ids) - max([with_prev, *(common_length(ids, s) for s in saved)]))
        if with_prev >= MIN_SAVED_PREFIX:
            saved.append(ids[:with_prev])
        prev = ids
    return out


def best_single(a: argparse.Namespace, work: Path, common: list[str], default_s: float, tag: str = "") -> tuple[float, int]:
    """The 1.5B alone at every thread count other than the default one (measured already: ``default_s``), each
    with a fresh cache; (fastest seconds per question, its threads). A run still going when the fastest so far
    had finished is stopped there (it can no longer be the fastest): on a busy core a second spinning thread
    did not finish one question in 10 minutes, where one thread answered 10 in 394 s (2026-11-30)."""
    from conductor.policy.spec import parse_conductor_spec
    from conductor.run.runtime import layout_for

    n_default = layout_for(parse_conductor_spec("fixed:0")).threads   # the single cold run's
    n = n_questions(a.questions)
    best = (default_s, n_default)
    for threads in range(1, (os.cpu_count() or 1) + 1):
        if threads == n_default:
            continue
        label = f"[single{tag} {threads} thread{'s' if threads > 1 else ''}]"
        try:
            wall, summary = _answer(a.questions, work / f"single{tag}-t{threads}", f"bench-single{tag}-t{threads}",
                                    ["--conductor", "fixed:0", *common], threads=threads,
                                    limit_s=None if n is None else best[0] * n + 60)
        except Slower as e:
            print(f"{label} {e}: slower than the fastest so far ({best[0]:.1f} s/q on {best[1]})", flush=True)
            continue
        spq = wall / max(1, summary["questions"])
        print(f"{label} {summary['questions']} questions in "
              f"{wall:.1f}s ({spq:.1f} s/q; default {n_default}: {default_s:.1f} s/q) accuracy={summary['accuracy']}",
              flush=True)
        best = min(best, (spq, threads))
    return best


def n_questions(spec: str) -> int | None:
    """How many questions a ``name:N,...`` spec asks for (the bench's own form); None for another form.

    >>> n_questions("gsm8k_test:5,mmlu_stem:5"), n_questions("gsm8k_test[0:5]")
    (10, None)
    """
    counts = [part.rpartition(":")[2] for part in spec.split(",")]
    return sum(map(int, counts)) if all(c.isdigit() for c in counts) else None


def single_budget(lake: Path, run_id: str) -> dict[str, float]:
    from conductor.lake.reader import scan

    calls = scan(str(lake), "calls", run_id=run_id).select("question_id", "input_tokens", "output_tokens").collect()
    n = max(1, calls["question_id"].n_unique())
    return {"worker_prefill": calls["input_tokens"].sum() / n, "worker_decode": calls["output_tokens"].sum() / n,
            "calls": calls.height / n}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", default="gsm8k_test:5,mmlu_stem:5")
    ap.add_argument("--pool", default=None, help="pool manifest (default: the embedded local pool)")
    ap.add_argument("--conductor", default="auto")
    ap.add_argument("--max-steps", type=int, default=3)
    ap.add_argument("--shard-size", type=int, default=5)
    ap.add_argument("--keep", default=None, help="keep the run directories in this new directory (default: a temp dir, removed)")
    ap.add_argument("--conductor-threads", type=int, default=None,
                    help="$CONDUCTOR_LOCAL_THREADS for the conductor's runs (the worker servers' threads; default: "
                         "the product's default for that conductor: conductor/local/layout.py)")
    ap.add_argument("--busy", action="store_true", help="also run the conductor and the 1.5B alone with one core kept busy")
    ap.add_argument("--quick", action="store_true", help="a smoke run on gsm8k_test:1,mmlu_stem:1 (shows the last line; "
                    "two questions are no measurement)")
    a = ap.parse_args(argv)
    if a.quick:
        a.questions = "gsm8k_test:1,mmlu_stem:1"
    os.environ.pop("CONDUCTOR_LOCAL_THREADS", None)   # the default runs use the default threads

    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="conductor-answer-bench-"))
    if a.keep and work.exists() and any(work.iterdir()):   # never delete a directory we did not create
        raise SystemExit(f"answer_flow: --keep {work}: directory exists and is not empty; pick a new one")
    work.mkdir(parents=True, exist_ok=True)
    common = ["--max-steps", str(a.max_steps), "--shard-size", str(a.shard_size)] + (["--pool", a.pool] if a.pool else [])
    extra = ["--conductor", a.conductor, *common]
    try:
        print(f"answer flow bench: {a.questions} conductor={a.conductor} pool={a.pool or 'embedded local'} "
              f"max_steps={a.max_steps} load={os.getloadavg()[0]:.1f}", flush=True)
        if a.quick:   # a smoke run: the rates on one thread (no second thread spinning on a loaded machine)
            prefill_rate, decode_rate = llama_rates(1, scale=4)
        else:
            prefill_rate, decode_rate = llama_rates(os.cpu_count() or 1)
        print(f"[rates]  1.5B llama.cpp here: prefill {prefill_rate:.1f} tok/s, decode {decode_rate:.1f} tok/s", flush=True)
        prefixes = work / "prefix-cache"      # empty: the first run on a machine saves the conductor's prefixes
        ct = a.conductor_threads
        first_s, first = _answer(a.questions, work / "first", "bench-first", extra, prefixes=prefixes, threads=ct)
        print(f"[conductor first run] {first['questions']} questions in {first_s:.1f}s  (no saved prompt prefixes "
              f"yet) accuracy={first['accuracy']}", flush=True)
        cold_s, cold = _answer(a.questions, work / "cold", "bench-cold", extra, prefixes=prefixes, threads=ct)
        n = cold["questions"]
        print(f"[conductor cold] {n} questions in {cold_s:.1f}s  calls/q={cold['calls_per_question']:.2f} "
              f"accuracy={cold['accuracy']} parse_failures={cold['parse_failures']}", flush=True)
        single_s, single = _answer(a.questions, work / "single", "bench-single", ["--conductor", "fixed:0", *common])
        print(f"[single cold]    {single['questions']} questions in {single_s:.1f}s  accuracy={single['accuracy']}", flush=True)
        best_spq, best_threads = best_single(a, work, common, single_s / max(1, single["questions"]))
        warm_s, warm = _answer(a.questions, work / "warm", "bench-warm", extra, cache=work / "cold" / "cache.sqlite",
                               prefixes=prefixes, threads=ct)
        print(f"[warm]           {warm['questions']} questions in {warm_s:.1f}s  worker cache hits {warm['cache_hits']} "
              f"accuracy={warm['accuracy']}", flush=True)
        resume_s, resumed = _answer(a.questions, work / "cold", "bench-cold", extra, prefixes=prefixes, threads=ct)
        if resumed["trajectories"] != cold["trajectories"]:
            raise SystemExit(f"answer_flow: resume changed the row count {cold['trajectories']} -> {resumed['trajectories']}")
        print(f"[resume]         same command again: {resume_s:.1f}s, rows unchanged ({resumed['trajectories']})", flush=True)
        c = token_budget(work / "cold" / "lake", "bench-cold", seen=work / "first" / "lake", seen_run="bench-first")
        s = single_budget(work / "single" / "lake", "bench-single")
        floors = report_floors(c, s, (prefill_rate, decode_rate), cold_s / n, single_s / max(1, single["questions"]),
                               first_s / max(1, first["questions"]))
        busy = run_busy(a, work, extra, common, prefixes, c, s) if a.busy else " busy_fair_ratio=nan"
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    c_spq, s_spq = cold_s / n, single_s / max(1, single["questions"])
    cold_qpm, warm_qpm = 60 * n / cold_s, 60 * warm["questions"] / warm_s
    print(f"conductor_s_per_question={c_spq:.1f} single_s_per_question={s_spq:.1f} ratio={c_spq / s_spq:.2f} "
          f"floor_ratio={floors:.2f} cold_questions_per_min={cold_qpm:.3f} warm_questions_per_min={warm_qpm:.3f} "
          f"warm_speedup={warm_qpm / cold_qpm:.1f} conductor_accuracy={cold['accuracy']} "
          f"single_accuracy={single['accuracy']} resume_s={resume_s:.1f} "
          f"first_run_s_per_question={first_s / max(1, first['questions']):.1f} "
          f"best_single_s_per_question={best_spq:.1f} best_single_threads={best_threads} "
          f"fair_ratio={c_spq / best_spq:.2f}{busy}")


def report_floors(c: dict[str, float], s: dict[str, float], rates: tuple[float, float], c_spq: float, s_spq: float,
                  first_spq: float | None = None, label: str = "") -> float:
    """Print the tokens per question behind both runs and the floors they imply at ``rates``; the floor ratio."""
    prefill_rate, decode_rate = rates
    c_floor = ((c["conductor_prefill"] + c["worker_prefill"]) / prefill_rate
               + (c["conductor_decode"] + c["worker_decode"]) / decode_rate + c["other_call_s"])
    s_floor = s["worker_prefill"] / prefill_rate + s["worker_decode"] / decode_rate
    first = f"; first run {first_spq:.1f}" if first_spq is not None else ""
    print(f"[tokens/q{label}] conductor: prefill {c['conductor_prefill']:.0f} (after reused prefixes) decode "
          f"{c['conductor_decode']:.0f}; 1.5B worker prefill {c['worker_prefill']:.0f} decode {c['worker_decode']:.0f}; "
          f"other calls {c['other_call_s']:.1f}s -> floor {c_floor:.1f}s/q (measured {c_spq:.1f}{first})", flush=True)
    print(f"[tokens/q{label}] single:    1.5B prefill {s['worker_prefill']:.0f} decode {s['worker_decode']:.0f} "
          f"-> floor {s_floor:.1f}s/q (measured {s_spq:.1f}); floor ratio "
          f"{c_floor / s_floor if s_floor else float('nan'):.2f}", flush=True)
    return c_floor / s_floor if s_floor else float("nan")


def run_busy(a: argparse.Namespace, work: Path, extra: list[str], common: list[str], prefixes: Path,
             c: dict[str, float], s: dict[str, float]) -> str:
    """The conductor (cold, saved prefixes) and the 1.5B alone again with one core kept busy; the last line's
    busy fields. The floor uses the idle runs' tokens (the same questions) at the rates measured under load."""
    with busy_core():
        rates = llama_rates(os.cpu_count() or 1)
        print(f"[busy]   one core kept busy by another process; 1.5B rates: prefill {rates[0]:.1f} tok/s, decode "
              f"{rates[1]:.1f} tok/s", flush=True)
        bc_s, bc = _answer(a.questions, work / "busy-cold", "bench-busy-cold", extra, prefixes=prefixes)
        print(f"[busy conductor] {bc['questions']} questions in {bc_s:.1f}s  accuracy={bc['accuracy']}", flush=True)
        bs_s, bs = _answer(a.questions, work / "busy-single", "bench-busy-single", ["--conductor", "fixed:0", *common])
        print(f"[busy single]    {bs['questions']} questions in {bs_s:.1f}s  accuracy={bs['accuracy']}", flush=True)
        c_spq, s_spq = bc_s / max(1, bc["questions"]), bs_s / max(1, bs["questions"])
        best_spq, _ = best_single(a, work, common, s_spq, tag="-busy")
    floor = report_floors(c, s, rates, c_spq, s_spq, label=" busy")
    return (f" busy_fair_ratio={c_spq / best_spq:.2f} busy_conductor_s_per_question={c_spq:.1f} "
            f"busy_single_s_per_question={s_spq:.1f} busy_ratio={c_spq / s_spq:.2f} busy_floor_ratio={floor:.2f} "
            f"busy_best_single_s_per_question={best_spq:.1f}")


if __name__ == "__main__":
    main()
