"""Cost of one GRPO update on SmolLM2-135M (CPU, fp32), with and without the shared prompt forward.

One GRPO group (G samples of one real conductor prompt with the paper's few-shot examples, ~1.1k tokens)
is trained twice from the same checkpoint, side by side in one run: the padded layout (every sample
carries its prompt) and the shared layout (the prompt runs once per micro-batch, its KV cache is
repeated). Both compute the same loss and gradient (tests/test_grpo.py); only the time differs.

    python bench/grpo_step.py [--group-size 4] [--completion-tokens 64]

Last line: ``padded_s=<a> shared_s=<b> speedup=<a/b> prompt_tokens=<n> group_size=<g> grad_norm_rel_diff=<d>``
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _group(tr, prompt, args, rng, Round, Trajectory, trajectory_id):
    """G completions of random ordinary tokens with stored behaviour log-probs; rewards alternate 0/1."""
    vocab = list(range(1000, 30000))
    ts = []
    for i in range(args.group_size):
        ids = [rng.choice(vocab) for _ in range(args.completion_tokens)]
        ts.append(Trajectory(trajectory_id("bench", "q", i), "bench", "rollout", "q", "bench", "math", prompt,
                             sample_index=i, rounds=[Round(0, prompt, tr.tokenizer.decode(ids), ids,
                                                           [-2.0] * len(ids), "ok")],
                             reward=float(i % 2), correct=bool(i % 2)))
    return ts


def _warm_up(tr) -> None:
    """One small no-grad forward (imports, allocator) that leaves the weights untouched, so both layouts
    start the timed update from identical weights and must report identical loss and gradient norm."""
    import torch

    with torch.no_grad():
        tr.model(input_ids=torch.tensor([[1, 2, 3, 4]]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--completion-tokens", type=int, default=64)
    args = ap.parse_args()

    from conductor.learning.grpo.batching import render_prompt
    from conductor.learning.grpo.checkpoint import ensure_hf_checkpoint
    from conductor.learning.grpo.config import GRPOConfig
    from conductor.learning.grpo.trainer import PolicyTrainer
    from conductor.local.embedded import ensure_models
    from conductor.prompts import conductor_prompt
    from conductor.trajectory import Round, Trajectory, trajectory_id
    from conductor.workers.pool import load_pool

    gguf = ensure_models(which=["smollm2-135m-instruct"])["smollm2-135m-instruct"]
    ckpt = str(ensure_hf_checkpoint(gguf))
    pool = load_pool(Path(__file__).resolve().parent.parent / "data" / "pools" / "simulated.yaml")
    prompt = conductor_prompt("What is 17 * 3? Give your final answer inside <answer></answer> tags.", pool.full())
    rng = random.Random(0)
    results, norms = {}, {}
    ts = None
    n_prompt = 0
    for share in (False, True):
        cfg = GRPOConfig.cpu(learning_rate=1e-5, total_iterations=2, micro_batch_size=args.group_size,
                             share_prompt_forward=share, save_optimizer=False)
        tr = PolicyTrainer(ckpt, cfg)
        n_prompt = len(render_prompt(tr.tokenizer, prompt))
        if ts is None:                           # built once: both layouts train on the same group
            ts = _group(tr, prompt, args, rng, Round, Trajectory, trajectory_id)
        _warm_up(tr)
        t = time.perf_counter()
        m = tr.step(ts)
        results[share] = time.perf_counter() - t
        norms[share] = m["grad_norm"]
        print(f"share_prompt_forward={share}: {results[share]:.2f} s, loss={m['loss']:.4g} "
              f"grad_norm={m['grad_norm']:.4g}", flush=True)
    print(f"padded_s={results[False]:.2f} shared_s={results[True]:.2f} "
          f"speedup={results[False] / results[True]:.2f} prompt_tokens={n_prompt} group_size={args.group_size} "
          f"grad_norm_rel_diff={abs(norms[False] - norms[True]) / max(norms[False], 1e-30):.2e}")


if __name__ == "__main__":
    main()
