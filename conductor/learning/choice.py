"""A one-choice conductor trained with GRPO: a small model whose whole output is ONE index (a worker or a menu entry).

SmolLM2-135M in memory (``PolicyTrainer``), rollouts sampled from the object being trained through the production
shard loop, the assistant turn prefilled so that an index is the only free choice (``ONE_STEP_PREFILL`` or
``conductor.policy.menu.MENU_PREFILL``, ``IndexConstraint``; why: docs/learning.md "Routing prefill"). This module
holds that setup, the per-iteration loop and the summaries; ``bench/workflow_replay.py`` (a menu conductor over a
recording) uses them, as did the finished simulated-pool and robustness experiments (docs/learning.md,
docs/faults.md).

Torch is imported inside the functions: ``conductor`` stays importable without it.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conductor.data.questions import Question
    from conductor.learning.grpo import PolicyTrainer
    from conductor.policy.prefill import PrefilledBackend
    from conductor.trajectory import Trajectory

DOMAINS = ("math", "mcq")
# Runs one batch of questions as a rollout: (questions, run_id, samples, seed) -> trajectories. A caller passes
# its own so it can choose the pool per question (a random-faulty regime) or replay a recording.
Rollout = Callable[[Sequence["Question"], str, int, int], list["Trajectory"]]


class ChoiceSettingsError(ValueError):
    """Settings that cannot train a one-choice conductor (the message names the setting)."""


@dataclass(frozen=True)
class ChoiceSettings:
    """What decides a one-choice conductor's training (a bench's command-line options)."""

    n_workers: int                # the number of indices to choose from (workers or menu entries)
    iterations: int = 30
    lr: float = 3e-5
    lr_schedule: str = "constant"
    min_lr_ratio: float = 0.0
    temperature: float = 1.0
    group_size: int = 8
    micro_batch: int = 0          # 0: the group size (one prompt pass per group)
    seed: int = 0
    max_tokens: int = 3
    prefill: str = ""
    constrain: bool = True
    batch_size: int = 8
    kl_beta: float = 0.0          # > 0: penalise KL to the starting policy, which keeps a collapsed choice exploring
    cost_lambda: float = 0.0      # > 0: the success-gated cost objective (conductor.grading.objective)


def make_choice_conductor(s: ChoiceSettings, model_path: str | None = None) -> tuple[PolicyTrainer, PrefilledBackend]:
    """(trainer, policy): SmolLM2-135M (or a saved ``model_path``) and the prefilled, constrained backend that
    samples from the very model being trained. Raises ``ChoiceSettingsError`` for inconsistent settings."""
    from conductor.grading.objective import CostObjective
    from conductor.learning.grpo import GRPOConfig, PolicyTrainer
    from conductor.learning.grpo.checkpoint import ensure_hf_checkpoint
    from conductor.local.embedded import ensure_models
    from conductor.policy.prefill import IndexConstraint, PrefilledBackend
    from conductor.policy.transformers_backend import TransformersBackend

    if model_path is None:
        gguf = ensure_models(which=["smollm2-135m-instruct"])["smollm2-135m-instruct"]
        model_path = str(ensure_hf_checkpoint(gguf))
    cfg = GRPOConfig.cpu(learning_rate=s.lr, lr_schedule=s.lr_schedule, min_lr_ratio=s.min_lr_ratio,
                         total_iterations=s.iterations, temperature=s.temperature,
                         micro_batch_size=s.micro_batch or s.group_size,
                         seed=s.seed, max_completion_tokens=s.max_tokens + 256, kl_beta=s.kl_beta,
                         objective=CostObjective(cost_lambda=s.cost_lambda))
    trainer = PolicyTrainer(model_path, cfg)
    inner = TransformersBackend(trainer.model, trainer.tokenizer, batch_size=s.batch_size)
    constraint = None
    if s.constrain:
        if not s.prefill:
            raise ChoiceSettingsError("constrain needs a prefill that ends at the index (or constrain=False)")
        constraint = IndexConstraint(trainer.tokenizer, s.n_workers, trainer.tokenizer.convert_tokens_to_ids("<|im_end|>"))
    n_prefill = len(trainer.tokenizer(s.prefill, add_special_tokens=False)["input_ids"])
    if n_prefill + s.max_tokens > cfg.max_completion_tokens:   # the trainer would cut off the chosen index
        raise ChoiceSettingsError(f"prefill ({n_prefill} tokens) + max_tokens exceeds the trainer's "
                                  f"max_completion_tokens ({cfg.max_completion_tokens})")
    return trainer, PrefilledBackend(inner, s.prefill, constraint)


def worker_shares(trajs: Sequence[Trajectory]) -> dict[str, dict[str, float]]:
    """Per domain: the fraction of workflow steps given to each worker (parsed workflows, root round)."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for t in trajs:
        for c in t.calls:
            if c.depth == 0:
                counts[t.domain][c.worker] += 1
    return {d: {w: n / sum(c.values()) for w, n in sorted(c.items())} for d, c in counts.items()}


def summarize(trajs: Sequence[Trajectory]) -> dict[str, Any]:
    """Mean reward, accuracy, parse rate, per-domain figures and worker shares of the scored rows."""
    scored = [t for t in trajs if not t.infra_failed and t.reward is not None]
    n = max(1, len(scored))
    by_dom = {}
    for d in DOMAINS:
        ds = [t for t in scored if t.domain == d]
        if ds:
            by_dom[d] = {"reward": sum(t.reward or 0.0 for t in ds) / len(ds),
                         "accuracy": sum(bool(t.correct) for t in ds) / len(ds)}
    return {
        "reward": sum(t.reward or 0.0 for t in scored) / n,
        "accuracy": sum(bool(t.correct) for t in scored) / n,
        "parse_rate": sum(t.rounds[0].parse_status == "ok" for t in scored) / n,
        "n": len(scored), "infra_failed": sum(t.infra_failed for t in trajs),
        "by_domain": by_dom, "shares": worker_shares(scored),
    }


def format_shares(shares: dict[str, dict[str, float]], names: Sequence[str]) -> str:
    """One line of worker shares per domain, names shortened.

    >>> format_shares({"math": {"sim-a": 1.0}}, ["sim-a", "sim-b"])
    'math: a=1.00 b=0.00 | mcq: a=0.00 b=0.00'
    """
    short = {w: w.removeprefix("sim-")[:5] for w in names}
    return " | ".join(f"{d}: " + " ".join(f"{short[w]}={shares.get(d, {}).get(w, 0):.2f}" for w in names)
                      for d in DOMAINS)


def iteration_questions(train_math: Sequence[Question], train_mcq: Sequence[Question], it: int,
                        per_iteration: int) -> list[Question]:
    """Iteration ``it``'s (1-based) training questions: half math, half MCQ, walking through each list (all
    from one list when the other is empty: a one-domain replay pool).

    >>> iteration_questions(["m1", "m2", "m3"], [], 2, 2), iteration_questions(["m1"], ["c1", "c2"], 2, 2)
    (['m3', 'm1'], ['m1', 'c2'])
    """
    if not train_math or not train_mcq:
        only = train_math or train_mcq
        return [only[(j + (it - 1) * per_iteration) % len(only)] for j in range(per_iteration)]
    n_math = per_iteration // 2
    n_mcq = per_iteration - n_math
    return ([train_math[(j + (it - 1) * n_math) % len(train_math)] for j in range(n_math)] +
            [train_mcq[(j + (it - 1) * n_mcq) % len(train_mcq)] for j in range(n_mcq)])


Shares = Callable[[Sequence["Trajectory"]], dict[str, dict[str, float]]]


def format_choices(shares: dict[str, dict[str, float]], floor: float = 0.05) -> str:
    """Per domain, the choices taken at least ``floor`` of the time, most taken first (a menu's shapes).

    >>> format_choices({"math": {"sc:0:3": 0.75, "fixed:1": 0.25, "fixed:4": 0.01}, "mcq": {"fixed:2": 1.0}})
    'math: sc:0:3=0.75 fixed:1=0.25 | mcq: fixed:2=1.00'
    """
    return " | ".join(f"{d}: " + " ".join(f"{k}={v:.2f}" for k, v in sorted(m.items(), key=lambda kv: -kv[1])
                                         if v >= floor) for d, m in shares.items())


def train_choice_conductor(trainer: PolicyTrainer, rollout: Rollout, train_math: Sequence[Question],
                           train_mcq: Sequence[Question], s: ChoiceSettings, per_iteration: int,
                           names: Sequence[str], run_prefix: str = "learning",
                           choices: Shares | None = None) -> list[dict[str, Any]]:
    """``s.iterations`` GRPO iterations (rollouts through ``rollout``, one trainer step each); the curve rows,
    printed as they come. ``choices``: what a menu conductor chose per domain (``WorkflowMenu.shares``), printed
    and kept in the rows beside the worker shares."""
    curve = []
    for it in range(1, s.iterations + 1):
        t0 = time.time()
        qs = iteration_questions(train_math, train_mcq, it, per_iteration)
        trajs = rollout(qs, f"{run_prefix}-it{it:03d}", s.group_size, s.seed + it)
        t_gen = sum(t.conductor_s for t in trajs)     # each row holds its share of the generation time
        sm = summarize(trajs)
        m = trainer.step(trajs)
        row = {"iteration": it, **{k: sm[k] for k in ("reward", "accuracy", "parse_rate", "shares", "by_domain")},
               "loss": m["loss"], "grad_norm": m["grad_norm"], "lr": m["lr"],
               "zero_adv_groups": m["n_zero_advantage_groups"], "gen_s": round(t_gen, 1),
               "iter_s": round(time.time() - t0, 1)}
        if choices is not None:
            row["choices"] = choices(trajs)
        curve.append(row)
        print(f"[it {it:3d}] reward={sm['reward']:.3f} acc={sm['accuracy']:.3f} parse={sm['parse_rate']:.2f} "
              f"no-contrast={m['n_zero_advantage_groups']}/{len(qs)} loss={m['loss']:+.4f} |g|={m['grad_norm']:.3f} "
              f"lr={m['lr']:.2e} {row['iter_s']:.0f}s (gen {t_gen:.0f}s) shares {format_shares(sm['shares'], names)}"
              + (f" choices {format_choices(row['choices'])}" if choices is not None else ""), flush=True)
    return curve
