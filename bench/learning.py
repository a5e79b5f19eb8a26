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
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from conductor.files import atomic_write_text, save_figure  # noqa: E402
from conductor.policy.prefill import ROUTING_PREFILL, PrefilledBackend, RoutingConstraint  # noqa: E402

DOMAINS = ("math", "mcq")


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--questions-per-iteration", type=int, default=4, help="half math, half MCQ")
    ap.add_argument("--group-size", type=int, default=8, help="GRPO group size G (samples per question)")
    ap.add_argument("--eval-questions", type=int, default=32, help="held-out questions, half math half MCQ")
    ap.add_argument("--eval-samples", type=int, default=2, help="samples per held-out question")
    ap.add_argument("--lr", type=float, default=3e-5)
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


def _split(n_eval: int, seed: int) -> tuple[list[Any], list[Any], list[Any]]:
    """(train math, train mcq, held-out) — held-out math from gsm8k_test, held-out MCQ disjoint from training."""
    from conductor.data.datasets import load_dataset

    rng = random.Random(seed)
    train_math = load_dataset("gsm8k_train", limit=400)
    mcq = load_dataset("mmlu_stem")
    rng.shuffle(train_math)
    rng.shuffle(mcq)
    n_mcq_eval = n_eval - n_eval // 2
    eval_math = load_dataset("gsm8k_test", limit=200)
    rng.shuffle(eval_math)
    held = eval_math[: n_eval // 2] + mcq[:n_mcq_eval]
    train_mcq = mcq[n_mcq_eval:n_mcq_eval + 400]
    assert not {q.id for q in held} & {q.id for q in train_math + train_mcq}
    return train_math, train_mcq, held


def _shares(trajs: list[Any]) -> dict[str, dict[str, float]]:
    """Per domain: the fraction of workflow steps given to each worker (parsed workflows, root round)."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for t in trajs:
        for c in t.calls:
            if c.depth == 0:
                counts[t.domain][c.worker] += 1
    return {d: {w: n / sum(c.values()) for w, n in sorted(c.items())} for d, c in counts.items()}


def _summary(trajs: list[Any]) -> dict[str, Any]:
    scored = [t for t in trajs if not t.infra_failed and t.reward is not None]
    n = max(1, len(scored))
    by_dom = {}
    for d in DOMAINS:
        ds = [t for t in scored if t.domain == d]
        if ds:
            by_dom[d] = {"reward": sum(t.reward for t in ds) / len(ds), "accuracy": sum(bool(t.correct) for t in ds) / len(ds)}
    return {
        "reward": sum(t.reward for t in scored) / n,
        "accuracy": sum(bool(t.correct) for t in scored) / n,
        "parse_rate": sum(t.rounds[0].parse_status == "ok" for t in scored) / n,
        "n": len(scored), "infra_failed": sum(t.infra_failed for t in trajs),
        "by_domain": by_dom, "shares": _shares(scored),
    }


def _fmt_shares(shares: dict[str, dict[str, float]], names: list[str]) -> str:
    short = {w: w.removeprefix("sim-")[:5] for w in names}
    return " | ".join(f"{d}: " + " ".join(f"{short[w]}={shares.get(d, {}).get(w, 0):.2f}" for w in names)
                      for d in DOMAINS)


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
    from conductor.learning.grpo import GRPOConfig, PolicyTrainer
    from conductor.learning.grpo.checkpoint import ensure_hf_checkpoint
    from conductor.local.embedded import ensure_models
    from conductor.policy.fixed import FixedWorkflowPolicy
    from conductor.policy.transformers_backend import TransformersBackend
    from conductor.run.pipeline import RunSpec
    from conductor.run.shards import run_shard
    from conductor.workers.pool import load_pool

    t_start = time.time()
    pool = load_pool(Path(__file__).resolve().parent.parent / "data" / "pools" / "simulated.yaml")
    names = [w.name for w in pool.workers]
    gguf = ensure_models(which=["smollm2-135m-instruct"])["smollm2-135m-instruct"]
    cfg = GRPOConfig.cpu(learning_rate=a.lr, lr_schedule=a.lr_schedule, min_lr_ratio=a.min_lr_ratio,
                         total_iterations=a.iterations, temperature=a.temperature,
                         micro_batch_size=a.micro_batch or a.group_size,
                         seed=a.seed, max_completion_tokens=a.max_tokens + 256)
    trainer = PolicyTrainer(str(ensure_hf_checkpoint(gguf)), cfg)
    inner = TransformersBackend(trainer.model, trainer.tokenizer, batch_size=a.batch_size)
    constraint = None
    if a.constrain:
        if not a.prefill:
            raise SystemExit("learning bench: --constrain needs a --prefill that ends at the worker index (or pass --no-constrain)")
        constraint = RoutingConstraint(trainer.tokenizer, len(names), trainer.tokenizer.convert_tokens_to_ids("<|im_end|>"))
    policy = PrefilledBackend(inner, a.prefill, constraint)
    n_prefill = len(trainer.tokenizer(a.prefill, add_special_tokens=False)["input_ids"])
    if n_prefill + a.max_tokens > cfg.max_completion_tokens:   # the trainer would cut off the routing tokens
        raise SystemExit(f"learning bench: prefill ({n_prefill} tokens) + --max-tokens exceeds the trainer's "
                         f"max_completion_tokens ({cfg.max_completion_tokens})")
    executor = Executor()
    train_math, train_mcq, held = _split(a.eval_questions, a.seed)
    common = dict(pool=pool, fewshot=a.fewshot, temperature=a.temperature, max_tokens=a.max_tokens)
    eval_spec = RunSpec(run_id="learning-eval", kind="eval", samples=a.eval_samples, seed=a.seed + 10_000, **common)
    print(f"learning bench: iterations={a.iterations} questions/iter={a.questions_per_iteration} G={a.group_size} "
          f"eval={len(held)}x{a.eval_samples} lr={a.lr} T={a.temperature} max_tokens={a.max_tokens} "
          f"fewshot={a.fewshot} prefill={a.prefill!r} constrain={a.constrain} threads={a.threads} load={os.getloadavg()[0]:.1f}", flush=True)

    def evaluate(tag: str) -> dict[str, Any]:
        t0 = time.time()
        rows = run_shard(held, replace(eval_spec, run_id=f"learning-eval-{tag}", checkpoint_id=tag), policy, executor)
        s = _summary(rows)
        print(f"[eval {tag}] reward={s['reward']:.3f} accuracy={s['accuracy']:.3f} parse={s['parse_rate']:.2f} "
              f"({time.time() - t0:.0f}s) shares {_fmt_shares(s['shares'], names)}", flush=True)
        return s

    evals: dict[str, Any] = {"n_questions": len(held), "samples": a.eval_samples, "single": {}}
    for i, w in enumerate(names):   # each worker alone, same questions, same pipeline, same seeds
        rows = run_shard(held, replace(eval_spec, run_id=f"learning-single-{i}", checkpoint_id=f"fixed:{i}"),
                         FixedWorkflowPolicy.single_worker(i), executor)
        evals["single"][w] = _summary(rows)
        print(f"[single {w}] reward={evals['single'][w]['reward']:.3f} accuracy={evals['single'][w]['accuracy']:.3f}",
              flush=True)
    best = max(names, key=lambda w: (evals["single"][w]["reward"], evals["single"][w]["accuracy"]))
    evals["best_single"] = {"name": best, **{k: evals["single"][best][k] for k in ("reward", "accuracy")}}
    evals["untrained"] = evaluate("untrained")

    curve = []
    n_math = a.questions_per_iteration // 2
    n_mcq = a.questions_per_iteration - n_math
    for it in range(1, a.iterations + 1):
        t0 = time.time()
        qs = ([train_math[(j + (it - 1) * n_math) % len(train_math)] for j in range(n_math)] +
              [train_mcq[(j + (it - 1) * n_mcq) % len(train_mcq)] for j in range(n_mcq)])
        spec = RunSpec(run_id=f"learning-it{it:03d}", kind="rollout", samples=a.group_size, seed=a.seed + it, **common)
        trajs = run_shard(qs, spec, policy, executor)
        t_gen = sum(t.conductor_s for t in trajs)     # each row holds its share of the generation time
        s = _summary(trajs)
        m = trainer.step(trajs)
        row = {"iteration": it, **{k: s[k] for k in ("reward", "accuracy", "parse_rate", "shares", "by_domain")},
               "loss": m["loss"], "grad_norm": m["grad_norm"], "lr": m["lr"],
               "zero_adv_groups": m["n_zero_advantage_groups"], "gen_s": round(t_gen, 1),
               "iter_s": round(time.time() - t0, 1)}
        curve.append(row)
        print(f"[it {it:3d}] reward={s['reward']:.3f} acc={s['accuracy']:.3f} parse={s['parse_rate']:.2f} "
              f"no-contrast={m['n_zero_advantage_groups']}/{len(qs)} loss={m['loss']:+.4f} |g|={m['grad_norm']:.3f} "
              f"lr={m['lr']:.2e} {row['iter_s']:.0f}s (gen {t_gen:.0f}s) shares {_fmt_shares(s['shares'], names)}",
              flush=True)

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
