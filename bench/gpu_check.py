"""GPU check: GRPO updates and grammar-constrained decoding on random-initialised Qwen2.5 shapes, rerunnable anywhere.

On a CUDA machine, for the Qwen2.5-1.5B and -7B shapes (transformers configs written from the architecture,
weights random, nothing downloaded) with the real Qwen2.5 tokenizer (the embedded Qwen2.5-Coder GGUF's, cached
as a tokenizer directory under ``$CONDUCTOR_HOME/hf``; ``--tokenizer DIR`` on a machine without it):

* the GRPO trainer (``PolicyTrainer.step``) on one group of G samples of one real conductor prompt (the simulated
  pool, few-shot examples; ~1.2k tokens) with random completion tokens and stored behaviour log-probs, in modes
    ``full``    bf16-mixed full fine-tuning (fp32 weights, bf16 autocast) with gradient checkpointing;
    ``shared``  the same without checkpointing, the group's prompt forward shared (``share_prompt_forward``);
    ``lora``    LoRA (``--lora-r``, all linear layers) on bf16 base weights, gradient checkpointing;
  each: seconds per step (mean of ``--steps`` after one warm-up step), trained tokens/s and peak memory;
* the transformers policy backend at batch ``--decode-batch`` under the workflow grammar and free, over the
  same number of decoding steps per batch: tokens/s both ways, their ratio, and the parse rate of the grammar
  completions that finished (every one must parse: the grammar-parser contract, tests/test_grammar_contract.py).

``--tiny``: a 2-layer shape on the CPU (the test suite runs it, tests/test_gpu_check.py). ``--model DIR``: decode
with a real checkpoint instead (no training). A mode that runs out of GPU memory reports ``oom`` and the rest go on.

    python bench/gpu_check.py                          # CUDA: 1.5b full/shared/lora, 7b full/lora, 1.5b decoding
    python bench/gpu_check.py --shapes 1.5b --modes full --decode-shapes 1.5b
    python bench/gpu_check.py --tiny                   # CPU, seconds
    python bench/gpu_check.py --model ~/.cache/conductor/hf/smollm2-135m-instruct-q4_1-98362432 --device cpu

Last line: ``device=<name> <shape>_<mode>_step_s=<s> <shape>_<mode>_tok_per_s=<x> <shape>_<mode>_peak_gib=<g> ...
<shape>_free_tok_per_s=<f> <shape>_grammar_tok_per_s=<g> <shape>_grammar_ratio=<g/f> <shape>_parse_rate=<p>
<shape>_finished=<n>/<m>``. Peak memory is the GPU's peak allocation on CUDA, the process's peak RSS on the CPU.
"""

from __future__ import annotations

import argparse
import gc
import random
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# Qwen2.5 architectures (the published configs' shapes); vocab is the output layer's size.
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, tie_word_embeddings=True, vocab_size=0),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, tie_word_embeddings=True, vocab_size=151936),
    "7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, tie_word_embeddings=False, vocab_size=152064),
}
PLAN = {"tiny": ("full", "shared", "lora"), "1.5b": ("full", "shared", "lora"), "7b": ("full", "lora")}
QUESTION = "What is 17 * 3? Give your final answer inside <answer></answer> tags."
TOKENIZER_GGUF = "qwen2.5-coder-1.5b-instruct"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="a 2-layer shape on the CPU, small sizes (seconds)")
    ap.add_argument("--shapes", help="shapes to train: tiny, 1.5b, 7b (default 1.5b,7b; tiny with --tiny)")
    ap.add_argument("--modes", help="training modes: full, shared, lora (default per shape: 1.5b all, 7b full,lora)")
    ap.add_argument("--decode-shapes", help="shapes to decode with (default 1.5b; tiny with --tiny); '' for none")
    ap.add_argument("--model", help="a HF checkpoint directory to decode with instead of random shapes (no training)")
    ap.add_argument("--tokenizer", help=f"a tokenizer directory or .gguf (default: the embedded {TOKENIZER_GGUF}'s)")
    ap.add_argument("--device", help="cuda or cpu (default: cuda when available; cpu with --tiny)")
    ap.add_argument("--group", type=int, help="GRPO group size G (default 8; 4 with --tiny)")
    ap.add_argument("--completion-tokens", type=int, help="completion tokens per sample (default 256; 32 with --tiny)")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--steps", type=int, help="timed steps after the warm-up (default 3; 1 with --tiny)")
    ap.add_argument("--lora-r", type=int, default=64)
    ap.add_argument("--fewshot", help="the conductor prompt's few-shot setting (default ood; none with --tiny)")
    ap.add_argument("--decode-batch", type=int, help="rows per generate call (default 8; 4 with --tiny)")
    ap.add_argument("--decode-samples", type=int, help="completions each way (default 32; 8 with --tiny)")
    ap.add_argument("--decode-tokens", type=int, help="max new tokens under the grammar (default 384; 256 with --tiny)")
    ap.add_argument("--plan-chars", type=int, help="the grammar's plan length (default 80; 16 with --tiny)")
    ap.add_argument("--subtask-chars", type=int, help="the grammar's subtask length (default 120; 24 with --tiny)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads on the CPU (one beats two contending)")
    a = ap.parse_args(argv)
    tiny = a.tiny
    defaults = dict(shapes="tiny" if tiny else "1.5b,7b", decode_shapes="tiny" if tiny else "1.5b",
                    device="cpu" if tiny else None, group=4 if tiny else 8, completion_tokens=32 if tiny else 256,
                    steps=1 if tiny else 3, fewshot="none" if tiny else "ood", decode_batch=4 if tiny else 8,
                    decode_samples=8 if tiny else 32, decode_tokens=256 if tiny else 384,
                    plan_chars=16 if tiny else 80, subtask_chars=24 if tiny else 120)
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.shapes = [] if a.model else _names(a.shapes, "--shapes")
    a.decode_shapes = _names(a.decode_shapes, "--decode-shapes")
    if a.modes is not None and any(m not in ("full", "shared", "lora") for m in a.modes.split(",")):
        ap.error(f"--modes {a.modes!r}: give full, shared and/or lora")
    return a


def _names(text: str, flag: str) -> list[str]:
    names = [s for s in text.split(",") if s]
    bad = [s for s in names if s not in SHAPES]
    if bad:
        raise SystemExit(f"error: {flag}: unknown shape(s) {', '.join(bad)}; use {', '.join(SHAPES)}")
    return names


def load_tokenizer(spec: str | None) -> Any:
    """The real Qwen2.5 tokenizer: a directory, a .gguf (converted once, cached beside the converted models)."""
    from transformers import AutoTokenizer

    from conductor.local.embedded import conductor_home, installed

    path = Path(spec).expanduser() if spec else installed().get(TOKENIZER_GGUF)
    if path is None:
        raise SystemExit(f"error: --tokenizer: no tokenizer given and {TOKENIZER_GGUF} is not installed "
                         "(conductor models install, or pass a tokenizer directory)")
    if not path.exists():
        raise SystemExit(f"error: --tokenizer: {path} does not exist")
    if path.is_dir():
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    cached = conductor_home() / "hf" / f"{path.stem}-tokenizer"
    if (cached / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(cached, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    tok.save_pretrained(cached)
    print(f"tokenizer converted from {path.name}, cached at {cached}", flush=True)
    return tok


def random_model(shape: str, tok: Any, device: str) -> Any:
    """A Qwen2 model of ``shape`` with random weights, built on ``device`` (bf16 on CUDA, fp32 on the CPU)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from conductor.decoding.vocabulary import eos_token_ids

    dims = dict(SHAPES[shape])
    dims["vocab_size"] = max(dims["vocab_size"], -(-len(tok) // 64) * 64)
    cfg = Qwen2Config(**dims, max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                      pad_token_id=tok.pad_token_id, bos_token_id=None, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16 if device.startswith("cuda") else torch.float32)
    model.generation_config.eos_token_id = sorted(eos_token_ids(model, tok))
    return model.eval()


def conductor_prompt_text(fewshot: str) -> tuple[str, int]:
    """The real conductor prompt over the simulated pool, and its number of workers."""
    from conductor.prompts import conductor_prompt
    from conductor.workers.pool import load_pool

    sub = load_pool(ROOT / "data" / "pools" / "simulated.yaml").full()
    return conductor_prompt(QUESTION, sub, fewshot=fewshot), len(sub)


# ------------------------------------------------------------------ decoding


def decode_check(model: Any, tok: Any, prompt: str, n_workers: int, args: argparse.Namespace) -> dict[str, Any]:
    """Grammar against free decoding with the transformers backend, batch by batch over equal step counts."""
    from conductor.decoding.grammar import workflow_grammar
    from conductor.generation import GenerationParams
    from conductor.policy.transformers_backend import TransformersBackend

    tok.padding_side = "left"
    backend = TransformersBackend(model, tok, batch_size=args.decode_batch)
    grammar = workflow_grammar(n_workers, 3, plan_chars=args.plan_chars, subtask_chars=args.subtask_chars)
    rows = args.decode_batch
    for g in (grammar, None):                                    # warm-up: kernels, llguidance's vocabulary
        backend.generate([prompt], rows, GenerationParams(max_tokens=2, seed=0, grammar=g))
    t_grammar = t_free = 0.0
    steps_grammar = steps_free = 0
    done: list[Any] = []
    total = 0
    for b in range(-(-args.decode_samples // rows)):
        t0 = _now(model)
        (gens,) = backend.generate([prompt], rows, GenerationParams(max_tokens=args.decode_tokens, seed=b, grammar=grammar))
        t_grammar += _now(model) - t0
        steps = max(len(g.token_ids or []) for g in gens)
        t0 = _now(model)
        (free,) = backend.generate([prompt], rows, GenerationParams(max_tokens=steps, seed=b))
        t_free += _now(model) - t0
        steps_grammar += rows * steps
        steps_free += rows * max(len(g.token_ids or []) for g in free)
        done += [g for g in gens if g.finish_reason == "stop"]
        total += len(gens)
    return _decode_figures(done, total, n_workers, steps_grammar / t_grammar, steps_free / t_free)


def _decode_figures(done: list[Any], total: int, n_workers: int, grammar_tps: float, free_tps: float) -> dict[str, Any]:
    from conductor.parser import parse_workflow
    from conductor.workflow import Workflow

    parsed = [parse_workflow(g.text, n_workers=n_workers, max_steps=3) for g in done]
    for g, wf in zip(done, parsed):
        if not isinstance(wf, Workflow):
            print(f"  unparseable grammar completion ({wf}): {g.text!r}", flush=True)
    ok = sum(isinstance(wf, Workflow) for wf in parsed)
    return {"free_tok_per_s": round(free_tps, 2), "grammar_tok_per_s": round(grammar_tps, 2),
            "grammar_ratio": round(grammar_tps / free_tps, 3),
            "parse_rate": round(ok / len(done), 4) if done else "n/a", "finished": f"{len(done)}/{total}"}


def _now(model: Any) -> float:
    """Wall time after the device has finished its queued work."""
    import torch

    if str(getattr(model, "device", "cpu")).startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter()


# ------------------------------------------------------------------ training


def group(tok: Any, prompt: str, args: argparse.Namespace) -> list[Any]:
    """G completions of random ordinary tokens with stored behaviour log-probs; rewards alternate 0/1."""
    from conductor.trajectory import Round, Trajectory, trajectory_id

    rng = random.Random(0)
    special = set(tok.all_special_ids)
    vocab = [i for i in range(min(len(tok), getattr(tok, "vocab_size", len(tok)))) if i not in special]
    out = []
    for i in range(args.group):
        ids = [rng.choice(vocab) for _ in range(args.completion_tokens)]
        out.append(Trajectory(trajectory_id("gpu-check", "q", i), "gpu-check", "rollout", "q", "bench", "math", prompt,
                              sample_index=i, rounds=[Round(0, prompt, tok.decode(ids), ids, [-2.0] * len(ids), "ok")],
                              reward=float(i % 2), correct=bool(i % 2)))
    return out


def train_config(mode: str, device: str, args: argparse.Namespace) -> Any:
    from conductor.learning.grpo.config import GRPOConfig

    cuda = device.startswith("cuda")
    dtype = ("bfloat16" if mode == "lora" else "bf16-mixed") if cuda else "float32"
    return GRPOConfig(dtype=dtype, device=device, gradient_checkpointing=mode != "shared",
                      share_prompt_forward=mode == "shared", lora_r=args.lora_r if mode == "lora" else 0,
                      micro_batch_size=args.micro_batch, max_completion_tokens=args.completion_tokens,
                      max_prompt_tokens=16384, learning_rate=1e-6, total_iterations=args.steps + 1, save_optimizer=False)


def train_mode(ckpt: Path, mode: str, device: str, trajs: list[Any], tokens: int, args: argparse.Namespace) -> dict[str, Any]:
    """One warm-up step, then ``--steps`` timed ones; peak memory over construction and steps."""
    import torch

    from conductor.learning.grpo.trainer import PolicyTrainer

    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    trainer = PolicyTrainer(str(ckpt), train_config(mode, device, args))
    try:
        trainer.step(trajs)
        times = []
        for _ in range(args.steps):
            t0 = _now(trainer.model)
            trainer.step(trajs)
            times.append(_now(trainer.model) - t0)
    finally:
        del trainer
        gc.collect()
    step_s = sum(times) / len(times)
    return {"step_s": round(step_s, 3), "tok_per_s": round(tokens / step_s, 1), "peak_gib": round(_peak_gib(cuda), 2)}


def _peak_gib(cuda: bool) -> float:
    import resource

    import torch

    if cuda:
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20      # KiB on Linux


def train_shape(shape: str, tok: Any, prompt: str, device: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every mode of ``shape`` from one random checkpoint written to a temporary directory."""
    import torch

    from conductor.learning.grpo.batching import render_prompt

    trajs = group(tok, prompt, args)
    tokens = args.group * (len(render_prompt(tok, prompt)) + args.completion_tokens)
    modes = args.modes.split(",") if args.modes else PLAN[shape]
    out: dict[str, Any] = {}
    oom = getattr(torch, "OutOfMemoryError", RuntimeError)
    with tempfile.TemporaryDirectory(prefix=f"gpu-check-{shape}-") as d:
        model = random_model(shape, tok, device)
        model.save_pretrained(d)
        tok.save_pretrained(d)
        del model
        gc.collect()
        for mode in modes:
            try:
                figures = train_mode(Path(d), mode, device, trajs, tokens, args)
            except oom:
                figures = {"step_s": "oom", "tok_per_s": "oom", "peak_gib": "oom"}
                gc.collect()
                torch.cuda.empty_cache()
            print(f"train shape={shape} mode={mode} G={args.group} tokens_per_step={tokens} "
                  + " ".join(f"{k}={v}" for k, v in figures.items()), flush=True)
            out.update({f"{shape}_{mode}_{k}": v for k, v in figures.items()})
    return out


# ------------------------------------------------------------------ main


def device_name(device: str) -> str:
    import platform

    import torch

    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else f"cpu-{platform.machine()}"
    return name.replace(" ", "_")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda: no CUDA device here (use --tiny or --device cpu)")
    if not device.startswith("cuda"):
        torch.set_num_threads(args.threads)
    results: dict[str, Any] = {"device": device_name(device)}
    if args.model:
        from conductor.policy.transformers_backend import TransformersBackend

        loaded = TransformersBackend.load(args.model, device=device)
        prompt, k = conductor_prompt_text(args.fewshot)
        figures = decode_check(loaded.model, loaded.tokenizer, prompt, k, args)
        print("decode model=" + Path(args.model).name + " " + " ".join(f"{a}={b}" for a, b in figures.items()), flush=True)
        results.update({f"model_{a}": b for a, b in figures.items()})
    else:
        tok = load_tokenizer(args.tokenizer)
        prompt, k = conductor_prompt_text(args.fewshot)
        for shape in args.decode_shapes:
            model = random_model(shape, tok, device)
            figures = decode_check(model, tok, prompt, k, args)
            print(f"decode shape={shape} batch={args.decode_batch} " + " ".join(f"{a}={b}" for a, b in figures.items()),
                  flush=True)
            results.update({f"{shape}_{a}": b for a, b in figures.items()})
            del model
            gc.collect()
        for shape in args.shapes:
            results.update(train_shape(shape, tok, prompt, device, args))
    print(" ".join(f"{k}={v}" for k, v in results.items()))


if __name__ == "__main__":
    main()
