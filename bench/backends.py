"""Conductor policy backends side by side: completions/s and tokens/s at batch 1 and batch 8.

Same model, same 8 conductor prompts (the real few-shot conductor prompt over the
embedded pool), same sampling settings, measured in one run. Batch 1 = the 8
prompts one call each; batch 8 = one call with all 8. Load time is reported
separately and excluded. vLLM runs when importable here, or in the separate venv
given by --vllm-python (default /opt/conductor-vllm-venv/bin/python, if present);
otherwise it is skipped with a note.

    python bench/backends.py                                  # SmolLM2-135M, transformers + llama.cpp (+ vllm)
    python bench/backends.py --model qwen2.5-coder-1.5b-instruct --max-tokens 64

The last line is ``<backend>_batch8_tok_per_s=<x> ...`` for every backend that ran.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

QUESTIONS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did she sell altogether?",
    "What is the derivative of x^3 * sin(x)?",
    "Which gas makes up most of Earth's atmosphere? (A) oxygen (B) nitrogen (C) argon (D) carbon dioxide",
    "Write a Python function that returns the n-th Fibonacci number.",
    "A train travels 120 km in 1.5 hours. What is its average speed in km/h?",
    "Is 221 a prime number? Answer yes or no.",
    "What is the time complexity of binary search?",
    "If a rectangle has a perimeter of 30 and a width of 5, what is its area?",
]


def prompts() -> list[str]:
    from conductor.prompts import conductor_prompt
    from conductor.workers.pool import load_pool

    pool = load_pool(ROOT / "data" / "pools" / "local.yaml")
    return [conductor_prompt(q, pool.full()) for q in QUESTIONS]


def build(backend: str, model: str, threads: int):
    from conductor.local.embedded import model_path

    path = model_path(model)
    if backend == "llamacpp":
        from conductor.policy.llamacpp_backend import LlamaCppBackend

        return LlamaCppBackend(path, n_ctx=4096, n_threads=threads)
    if backend == "transformers":
        from conductor.policy.transformers_backend import TransformersBackend

        return TransformersBackend.load(path, threads=threads, batch_size=8)
    if backend == "vllm":
        from conductor.local.transformers_server import converted_dir
        from conductor.policy.vllm_backend import VLLMBackend

        hf = converted_dir(path)     # vLLM reads the float checkpoint the transformers backend converted
        if not (hf / "config.json").is_file():
            raise SystemExit(f"error: {hf} missing; run the transformers backend once to convert {model}")
        return VLLMBackend(str(hf), max_model_len=4096, dtype="float32" if "cpu" in _vllm_device() else "auto")
    raise SystemExit(f"error: unknown backend {backend}")


def _vllm_device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def measure(backend_name: str, model: str, max_tokens: int, threads: int, texts: list[str]) -> dict:
    from conductor.generation import GenerationParams

    t0 = time.perf_counter()
    backend = build(backend_name, model, threads)
    load_s = time.perf_counter() - t0
    params = GenerationParams(temperature=1.0, max_tokens=max_tokens, seed=0)
    backend.generate(texts[:1], 1, GenerationParams(temperature=1.0, max_tokens=4, seed=0))   # warm-up
    out = {"backend": backend_name, "model": model, "load_s": round(load_s, 1),
           "prompt_tokens_mean": 0}
    for label, calls in (("batch1", [[t] for t in texts]), ("batch8", [texts])):
        tokens = completions = 0
        start = time.perf_counter()
        for call in calls:
            for group in backend.generate(call, 1, params):
                for g in group:
                    completions += 1
                    tokens += len(g.token_ids) if g.token_ids is not None else 0
                    out["prompt_tokens_mean"] = len(g.prompt_token_ids or [])
        secs = time.perf_counter() - start
        out[f"{label}_s"] = round(secs, 2)
        out[f"{label}_completions_per_s"] = round(completions / secs, 3)
        out[f"{label}_tok_per_s"] = round(tokens / secs, 2)
        out[f"{label}_tokens"] = tokens
    backend.close()
    return out


def run_vllm_elsewhere(python: str, args: argparse.Namespace) -> dict | None:
    cmd = [python, str(Path(__file__).resolve()), "--backends", "vllm", "--model", args.model,
           "--max-tokens", str(args.max_tokens), "--threads", str(args.threads), "--json"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"note: vllm in {python} failed: {tail}", file=sys.stderr)
        return None
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--backends", default="transformers,llamacpp,vllm")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 1) - 1))
    ap.add_argument("--vllm-python", default="/opt/conductor-vllm-venv/bin/python")
    ap.add_argument("--json", action="store_true", help="print one JSON line per backend (used for the vLLM venv)")
    args = ap.parse_args()

    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    texts = prompts()
    results = []
    for name in [b.strip() for b in args.backends.split(",") if b.strip()]:
        if name == "vllm" and importlib.util.find_spec("vllm") is None:
            if not args.json and Path(args.vllm_python).is_file():
                with console.status(f"vllm ({args.vllm_python})"):
                    r = run_vllm_elsewhere(args.vllm_python, args)
                if r:
                    results.append(r)
            else:
                console.print("note: vllm skipped (not importable here and no vLLM venv found)")
            continue
        if name == "llamacpp" and importlib.util.find_spec("llama_cpp") is None:
            console.print("note: llamacpp skipped (llama-cpp-python not installed)")
            continue
        if name == "transformers" and importlib.util.find_spec("transformers") is None:
            console.print("note: transformers skipped (not installed)")
            continue
        with console.status(f"{name} on {args.model}"):
            load0 = os.getloadavg()[0]
            r = measure(name, args.model, args.max_tokens, args.threads, texts)
            r["loadavg_before_after"] = [round(load0, 1), round(os.getloadavg()[0], 1)]
        results.append(r)
        print(json.dumps(r), flush=True)   # each backend's figures as soon as they exist
    if args.json:
        return
    load = os.getloadavg()[0]
    table = Table(title=f"{args.model}, {len(texts)} conductor prompts, max_tokens={args.max_tokens}, T=1.0, "
                        f"threads={args.threads}, load average at end {load:.1f} on {os.cpu_count()} cores")
    for col in ("backend", "load s", "prompt tok", "b1 compl/s", "b1 tok/s", "b8 compl/s", "b8 tok/s"):
        table.add_column(col)
    for r in results:
        table.add_row(r["backend"], str(r["load_s"]), str(r["prompt_tokens_mean"]), str(r["batch1_completions_per_s"]),
                      str(r["batch1_tok_per_s"]), str(r["batch8_completions_per_s"]), str(r["batch8_tok_per_s"]))
    console.print(table)
    base = next((r for r in results if r["backend"] == "llamacpp"), None)
    if base:
        for r in results:
            if r is not base:
                print(f"{r['backend']}/llamacpp batch8 tok/s ratio = {r['batch8_tok_per_s'] / max(base['batch8_tok_per_s'], 1e-9):.2f}")
    print(" ".join(f"{r['backend']}_batch8_tok_per_s={r['batch8_tok_per_s']}" for r in results))


if __name__ == "__main__":
    main()
