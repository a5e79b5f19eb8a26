"""Learning benchmark: GRPO-train SmolLM2-135M as the conductor of the SIMULATED pool, on CPU.

The simulated pool (data/pools/simulated.yaml) has a known best routing: math -> sim-mathwiz (0.85),
multiple choice -> sim-scholar (0.85); every single worker is at most ~0.58 on a half/half mix. So a
conductor that learns to route by domain must beat every single worker, and its worker shares per domain
must move toward the specialists. Everything runs through the production shard loop
(conductor/run/shards.py: plan -> generate -> execute -> score, the same ``Trajectory`` rows); the model stays
in memory (``PolicyTrainer``) and rollouts are sampled from the very object being trained
(``TransformersBackend`` over ``trainer.model``).

Routing prefill (``--prefill``; measured here, so not assumed): the untrained 135M model at T = 1.0 wrote 0
parseable workflows out of 32 samples with no few-shot examples and 0 of 8 with the full OOD few-shot
prompt (~1.1k tokens); with the prefix ``model_id = [`` it still wrote 0 of 12 (T = 0.7): it lists
1, 2, 3, ... or forgets a list. GRPO would get no signal. So by default the assistant turn starts with
``subtasks = ["Answer the user question ..."]`` / ``access_list = [[]]`` / ``model_id = [`` (the parser
accepts the three lists in any order): the subtask and access list are fixed to one direct step and the
model chooses the worker (and must close the list with exactly one valid index, else the reward is 0).
This benchmarks *routing* learning, which is what the simulated pool can check; it does not train the
small model to write subtasks. The prefix is part of the stored completion (text and token ids), so the
rows show exactly what was parsed, and the trainer trains on it like any other completion token
(behaviour log-probs are recomputed on-policy by the trainer; with one update per batch the ratio is
exactly 1; conductor/policy/prefill.py). ``--prefill '' --no-constrain --max-tokens 64`` runs the unassisted format.

Constrained routing (``--constrain``, default): after the prefix a logits processor lets the model write only
one worker index, ``]`` and end of turn, like the product's grammar-constrained decoding of the embedded
conductor. Without it (measured) the first updates mostly teach the list syntax, and because the few
well-formed samples carry the model's prior choice, that format signal pushed one worker up in BOTH domains
until the policy collapsed onto it (lr 3e-5: every sample chose sim-scholar by iteration 6, gradient 0).

    python bench/learning.py [--iterations 30] [--questions-per-iteration 4] [--group-size 8]
                             [--eval-questions 32] [--lr 3e-5] [--lr-schedule constant] [--seed 0]
                             [--threads 2] [--out docs/figures] [--quick]

Last line: ``untrained_reward=<a> trained_reward=<b> best_single_worker_reward=<c> untrained_accuracy=<d>
trained_accuracy=<e> best_single_worker_accuracy=<f>`` (held-out questions).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.argtypes import positive_float  # noqa: E402
from conductor.files import atomic_write_text, save_figure  # noqa: E402
from conductor.learning.routing import (  # noqa: E402
    DOMAINS,
    RoutingSettings,
    format_shares,
    make_routing_conductor,
    split_questions,
    summarize,
    train_routing,
)
from conductor.policy.prefill import ROUTING_PREFILL  # noqa: E402


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--questions-per-iteration", type=int, default=4, help="half math, half MCQ")
    ap.add_argument("--group-size", type=int, default=8, help="GRPO group size G (samples per question)")
    ap.add_argument("--eval-questions", type=int, default=32, help="held-out questions, half math half MCQ")
    ap.add_argument("--eval-samples", type=int, default=2, help="samples per held-out question")
    ap.add_argument("--lr", type=positive_float, default=3e-5)
    ap.add_argument("--lr-schedule", default="constant", choices=["cosine", "constant"])
    ap.add_argument("--min-lr-ratio", type=float, default=0.0, help="cosine floor as a fraction of --lr")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (training and eval)")
    ap.add_argument("--max-tokens", type=int, default=3, help="conductor completion limit after the prefill")
    ap.add_argument("--fewshot", default="none", choices=["none", "ood", "in_domain", "mixed"])
    ap.add_argument("--prefill", default=ROUTING_PREFILL, help="assistant-turn prefix ('' for none)")
    ap.add_argument("--constrain", action=argparse.BooleanOptionalAction, default=True,
                    help="constrained decoding after the prefill: one worker index, ']', end (see RoutingConstraint)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (use 1 on a busy 2-core box)")
    ap.add_argument("--batch-size", type=int, default=8, help="generation batch size")
    ap.add_argument("--micro-batch", type=int, default=0, help="trainer micro-batch (0 = the group size: one prompt pass per group)")
    ap.add_argument("--out", default="docs/figures", help="directory for learning.png and learning.json")
    ap.add_argument("--quick", action="store_true", help="2-iteration smoke run (small counts)")
    a = ap.parse_args(argv)
    if a.quick:
        a.iterations, a.questions_per_iteration, a.group_size, a.eval_questions, a.eval_samples = 2, 2, 4, 4, 1
        if a.out == "docs/figures":
            a.out = str(Path(tempfile.gettempdir()) / "conductor-learning-quick")
    for name in ("iterations", "questions_per_iteration", "group_size", "eval_questions", "eval_samples", "max_tokens"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.group_size < 2:
        ap.error("--group-size must be >= 2 (GRPO needs contrast within a group)")
    return a


def _plot(out: Path, curve: list[dict[str, Any]], evals: dict[str, Any], names: list[str]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    it = [c["iteration"] for c in curve]
    ax = axes[0]
    ax.plot(it, [c["reward"] for c in curve], "o-", label="train reward (rollouts)")
    ax.plot(it, [c["accuracy"] for c in curve], "s-", label="train accuracy")
    ax.plot(it, [c["parse_rate"] for c in curve], "^:", label="train parse rate")
    ax.axhline(evals["best_single"]["reward"], color="grey", ls="--", label=f"best single worker reward ({evals['best_single']['name']})")
    ax.axhline(evals["best_single"]["accuracy"], color="grey", ls=":", label="best single worker accuracy")
    ax.set_xlabel("GRPO iteration")
    ax.set_ylim(0, 1.02)
    ax.set_title("training rollouts")
    ax.legend(fontsize=7)
    ax = axes[1]
    labels = ["untrained", "trained"] + [w.removeprefix("sim-") for w in names]
    vals = [evals["untrained"], evals["trained"]] + [evals["single"][w] for w in names]
    x = range(len(labels))
    ax.bar([i - 0.2 for i in x], [v["reward"] for v in vals], 0.4, label="reward")
    ax.bar([i + 0.2 for i in x], [v["accuracy"] for v in vals], 0.4, label="accuracy")
    ax.set_xticks(list(x), labels, rotation=20, fontsize=8)
    ax.set_ylim(0, 1.02)
    ax.set_title(f"held-out ({evals['n_questions']} questions x {evals['samples']} samples)")
    ax.legend(fontsize=8)
    ax = axes[2]
    groups = [(f"{d}\n{when}", evals[when]["shares"].get(d, {})) for d in DOMAINS for when in ("untrained", "trained")]
    bottom = [0.0] * len(groups)
    for w in names:
        h = [g[1].get(w, 0.0) for g in groups]
        ax.bar(range(len(groups)), h, bottom=bottom, label=w)
        bottom = [b + v for b, v in zip(bottom, h)]
    ax.set_xticks(range(len(groups)), [g[0] for g in groups], fontsize=8)
    ax.set_ylim(0, 1.02)
    ax.set_title("held-out worker shares by domain (steps)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, out / "learning.png")


def main(argv: list[str] | None = None) -> None:
    a = _args(argv)
    import torch

    torch.set_num_threads(a.threads)
    from conductor.execution.executor import Executor
    from conductor.policy.fixed import FixedWorkflowPolicy
    from conductor.run.pipeline import RunSpec
    from conductor.run.shards import run_shard
    from conductor.workers.pool import load_pool

    t_start = time.time()
    pool = load_pool(Path(__file__).resolve().parent.parent / "data" / "pools" / "simulated.yaml")
    names = [w.name for w in pool.workers]
    settings = RoutingSettings(
        n_workers=len(names), iterations=a.iterations, lr=a.lr, lr_schedule=a.lr_schedule, min_lr_ratio=a.min_lr_ratio,
        temperature=a.temperature, group_size=a.group_size, micro_batch=a.micro_batch, seed=a.seed,
        max_tokens=a.max_tokens, prefill=a.prefill, constrain=a.constrain, batch_size=a.batch_size)
    trainer, policy = make_routing_conductor(settings)
    executor = Executor()
    train_math, train_mcq, held = split_questions(a.eval_questions, a.seed)
    common = dict(pool=pool, fewshot=a.fewshot, temperature=a.temperature, max_tokens=a.max_tokens)
    eval_spec = RunSpec(run_id="learning-eval", kind="eval", samples=a.eval_samples, seed=a.seed + 10_000, **common)
    print(f"learning bench: iterations={a.iterations} questions/iter={a.questions_per_iteration} G={a.group_size} "
          f"eval={len(held)}x{a.eval_samples} lr={a.lr} T={a.temperature} max_tokens={a.max_tokens} "
          f"fewshot={a.fewshot} prefill={a.prefill!r} constrain={a.constrain} threads={a.threads} load={os.getloadavg()[0]:.1f}", flush=True)

    def evaluate(tag: str) -> dict[str, Any]:
        t0 = time.time()
        rows = run_shard(held, replace(eval_spec, run_id=f"learning-eval-{tag}", checkpoint_id=tag), policy, executor)
        s = summarize(rows)
        print(f"[eval {tag}] reward={s['reward']:.3f} accuracy={s['accuracy']:.3f} parse={s['parse_rate']:.2f} "
              f"({time.time() - t0:.0f}s) shares {format_shares(s['shares'], names)}", flush=True)
        return s

    evals: dict[str, Any] = {"n_questions": len(held), "samples": a.eval_samples, "single": {}}
    for i, w in enumerate(names):   # each worker alone, same questions, same pipeline, same seeds
        rows = run_shard(held, replace(eval_spec, run_id=f"learning-single-{i}", checkpoint_id=f"fixed:{i}"),
                         FixedWorkflowPolicy.single_worker(i), executor)
        evals["single"][w] = summarize(rows)
        print(f"[single {w}] reward={evals['single'][w]['reward']:.3f} accuracy={evals['single'][w]['accuracy']:.3f}",
              flush=True)
    best = max(names, key=lambda w: (evals["single"][w]["reward"], evals["single"][w]["accuracy"]))
    evals["best_single"] = {"name": best, **{k: evals["single"][best][k] for k in ("reward", "accuracy")}}
    evals["untrained"] = evaluate("untrained")

    def rollout(qs: Any, run_id: str, samples: int, seed: int) -> Any:
        return run_shard(qs, RunSpec(run_id=run_id, kind="rollout", samples=samples, seed=seed, **common), policy, executor)

    curve = train_routing(trainer, rollout, train_math, train_mcq, settings, a.questions_per_iteration, names)

    evals["trained"] = evaluate("trained")
    out = Path(a.out)
    png = _plot(out, curve, evals, names)
    result = {"args": vars(a), "curve": curve, "evals": evals, "runtime_s": round(time.time() - t_start, 1),
              "load_avg_end": os.getloadavg()}
    atomic_write_text(out / "learning.json", json.dumps(result, indent=1))
    print(f"figure: {png}  data: {out / 'learning.json'}  runtime_s={result['runtime_s']}", flush=True)
    u, t, b = evals["untrained"], evals["trained"], evals["best_single"]
    print(f"untrained_reward={u['reward']:.4f} trained_reward={t['reward']:.4f} best_single_worker_reward={b['reward']:.4f} "
          f"untrained_accuracy={u['accuracy']:.4f} trained_accuracy={t['accuracy']:.4f} "
          f"best_single_worker_accuracy={b['accuracy']:.4f}")


if __name__ == "__main__":
    main()
