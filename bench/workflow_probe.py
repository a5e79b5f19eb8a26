"""Fixed workflows on the learning bench's training (or validation) questions: which workflow is best in each domain.

Why: GRPO can only find what the vocabulary offers. Before reading a learning run's held-out figure, this says
what the best policy over that vocabulary scores on the same training questions (never the held-out ones),
per domain, through the very same pipeline (prompt, parse, T = 0 workers, grade) as ``bench/learning_local.py``.

``--questions validation`` probes questions drawn like the held-out ones (GSM8K test, MMLU-STEM) but disjoint from
them and from training: the place to choose a prompt or vocabulary, since on GSM8K train questions the Qwen
workers do better step by step than they do on test ones (``learning_local.split_questions``).

A workflow is written the way the learning bench prints shapes (``shape_of``): ``worker/subtask`` per step,
``>`` between steps, ``+`` before a step that sees every earlier one; subtasks by their names in
``conductor.decoding.subtasks.SUBTASK_LABELS`` (``direct``, ``code``, ``adapt``, ...). So a shape read off a run's curve can be pasted here.

    python bench/workflow_probe.py --from-state runs/learning-local-q8          # that run's split and cache
    python bench/workflow_probe.py --train-questions 96 --shapes "qwen2.5-coder-1.5b/check"

Calls go through a response cache of its own (``--cache``), topped up from the run's cache on every start, so
calls the run already paid for are free and a running bench's cache is never written. Resumable: finished shapes
are kept in ``--out`` and skipped. Last line:
``best_math=<shape> best_math_accuracy=<a> best_mcq=<shape> best_mcq_accuracy=<b> per_domain_best=<mean>
best_single_shape=<shape> best_single_shape_accuracy=<c> questions=<n>``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from learning_local import (  # noqa: E402
    DOMAINS,
    FROZEN_DEFAULTS,
    ROOT,
    ReuseExecutor,
    greedy_pool,
    run_batch,
    seed_caches,
    split_questions,
    validation_questions,
)

DEFAULT_SHAPES = (
    "qwen2.5-coder-1.5b/direct",
    "qwen2.5-coder-1.5b/check",
    "qwen2.5-coder-1.5b/code > +python/direct",
    "qwen2.5-coder-0.5b/check > +qwen2.5-coder-1.5b/check",
    "qwen2.5-coder-0.5b/check > +qwen2.5-coder-1.5b/direct",
)


class ShapeError(ValueError):
    pass


def parse_shape(shape: str, workers: list[str]) -> Any:
    """A shape string -> a ``Workflow`` over the pool's ordinals.

    >>> wf = parse_shape("b/check > +a/direct", ["a", "b"])
    >>> [(s.worker, s.access) for s in wf.steps]
    [(1, ()), (0, 'all')]
    >>> parse_shape("c/direct", ["a", "b"])
    Traceback (most recent call last):
    ...
    workflow_probe.ShapeError: shape 'c/direct': step 1: unknown worker 'c' (pool: a, b)
    """
    from conductor.decoding.subtasks import SUBTASK_LABELS as subtasks
    from conductor.workflow import ALL, Step, Workflow

    steps = []
    for i, part in enumerate(p.strip() for p in shape.split(">")):
        sees_all = part.startswith("+")
        name, _, sub = part.lstrip("+").partition("/")
        if name not in workers:
            raise ShapeError(f"shape {shape!r}: step {i + 1}: unknown worker {name!r} (pool: {', '.join(workers)})")
        if sub not in subtasks:
            raise ShapeError(f"shape {shape!r}: step {i + 1}: subtask {sub!r} is not one of {', '.join(subtasks)}")
        if sees_all and i == 0:
            raise ShapeError(f"shape {shape!r}: the first step has no earlier step to see")
        steps.append(Step(workers.index(name), subtasks[sub], ALL if sees_all else ()))
    return Workflow(tuple(steps))


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from-state", default=None, help="a learning_local state dir: its split, pool and cache")
    ap.add_argument("--pool", default=str(ROOT / "data/pools/local.yaml"))
    ap.add_argument("--train-questions", type=int, default=96)
    ap.add_argument("--eval-questions", type=int, default=200, help="only to reproduce the bench's split")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mcq-share", type=float, default=0.5, help="as learning_local.py's (--from-state reads it)")
    ap.add_argument("--math-train", default="train", choices=["train", "test"],
                    help="as learning_local.py's (--from-state reads it)")
    ap.add_argument("--questions", default="training", choices=["training", "validation"],
                    help="the run's training questions, or validation ones: drawn like the held-out set, disjoint "
                         "from it and from training (learning_local.validation_questions)")
    ap.add_argument("--validation-questions", type=int, default=96, help="how many, half per domain")
    ap.add_argument("--domains", nargs="+", choices=DOMAINS, default=list(DOMAINS),
                    help="probe only these domains' questions (e.g. a code workflow on math only)")
    ap.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES))
    ap.add_argument("--cache", default="runs/workflow-probe/cache.sqlite")
    ap.add_argument("--seed-cache", nargs="+", default=[], metavar="CACHE",
                    help="response caches (.sqlite or .sqlite.gz) whose replies are copied into --cache first")
    ap.add_argument("--out", default="runs/workflow-probe/results.json", help="per-question results (resumable)")
    a = ap.parse_args(argv)
    if a.from_state:
        progress = Path(a.from_state) / "progress.json"
        if not progress.is_file():
            ap.error(f"--from-state {a.from_state}: no progress.json (not a learning_local state dir)")
        cfg = json.loads(progress.read_text())["config"]
        a.pool, a.train_questions = cfg["pool"], cfg["train_questions"]
        a.eval_questions, a.seed = cfg["eval_questions"], cfg["seed"]
        a.mcq_share = cfg.get("mcq_share", FROZEN_DEFAULTS["mcq_share"])
        a.math_train = cfg.get("math_train", FROZEN_DEFAULTS["math_train"])
    return a


def _mean_se(xs: list[int]) -> tuple[float, float]:
    """Accuracy and its standard error over questions: ``conductor.stats.paired.question_mean_se`` for one
    sample per question, on the 0/1 lists this bench stores.

    >>> m, se = _mean_se([1, 0, 1, 0]); m, round(se, 4)
    (0.5, 0.2887)
    """
    return sum(xs) / len(xs), (statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else 0.0)


def probe(a: argparse.Namespace) -> dict[str, dict[str, list[int]]]:
    """Every shape over the training questions; {shape: {domain: [0/1 per question]}}, saved after each shape."""
    from conductor.execution.cache import ResponseCache
    from conductor.files import atomic_write_text
    from conductor.local.servers import EmbeddedServers, resolve_embedded
    from conductor.local.watchdog import watch_children
    from conductor.policy.fixed import FixedWorkflowPolicy
    from conductor.run.pipeline import RunSpec

    watch_children()    # a killed probe must not leave its model servers running
    pool = greedy_pool(a.pool)
    workflows = {s: parse_shape(s, [w.name for w in pool.workers]) for s in a.shapes}
    train = probe_questions(a)
    out_path, cache = Path(a.out), Path(a.cache)
    out = json.loads(out_path.read_text()) if out_path.is_file() else {}
    run_cache = Path(a.from_state or "", "cache.sqlite")
    run_paid = [str(run_cache)] if a.from_state and run_cache.is_file() else []
    seed_caches(run_paid + a.seed_cache, cache)   # the run's paid calls (read only) and any carried ones
    with EmbeddedServers() as servers:
        live, _ = resolve_embedded(pool, servers, lazy=True)
        ex = ReuseExecutor(cache=ResponseCache(cache))
        spec = RunSpec(run_id="probe", kind="eval", pool=live, samples=1, seed=7, temperature=0.0,
                       max_steps=max(len(wf.steps) for wf in workflows.values()))
        for shape, wf in workflows.items():
            key = _key(shape, pool.pool_id, a)
            if all(d in out.get(key, {}) for d in a.domains):
                continue
            t0, calls0 = time.time(), ex.stats["calls"]
            rows = run_batch(train, replace(spec, run_id="probe", checkpoint_id=f"fixed:{shape}"),
                             FixedWorkflowPolicy(wf, name=shape), ex)
            out[key] = {**out.get(key, {}),
                        **{d: [int(bool(t.correct)) for t in rows if t.domain == d] for d in a.domains}}
            atomic_write_text(out_path, json.dumps(out))
            print(f"  {shape}: {time.time() - t0:.0f}s, {ex.stats['calls'] - calls0} paid calls", flush=True)
        ex.cache.close()
    return {s: {d: out[_key(s, pool.pool_id, a)][d] for d in a.domains} for s in a.shapes}


def probe_questions(a: argparse.Namespace) -> list[Any]:
    """The questions probed, in the chosen domains: the run's training ones or validation ones."""
    train, held = split_questions(a.train_questions, a.eval_questions, a.seed, a.mcq_share, a.math_train)
    qs = train if a.questions == "training" else validation_questions(a.validation_questions, a.seed, train + held)
    return [q for q in qs if q.domain in a.domains]


def _key(shape: str, pool_id: str, a: argparse.Namespace) -> str:
    """What a stored result depends on: the workflow, the pool and the training split (the MCQ share shown only
    when not the default half, so results stored before it existed keep their keys)."""
    share = "" if a.mcq_share == 0.5 else f"/mcq{a.mcq_share:g}"
    share += "" if a.math_train == "train" else f"/math-{a.math_train}"
    if a.questions == "validation":
        return f"{shape} @ {pool_id} validation {a.validation_questions}/{a.seed}"
    return f"{shape} @ {pool_id} {a.train_questions}/{a.eval_questions}/{a.seed}{share}"


def main(argv: list[str] | None = None) -> None:
    a = _args(argv)
    try:
        res = probe(a)
    except (ShapeError, ValueError) as e:    # ValueError: validation questions too many or overlapping
        sys.exit(f"workflow_probe: {e}")
    doms = a.domains
    n = {d: len(next(iter(res.values()))[d]) for d in doms}
    print(f"\n{f'workflow ({a.questions} questions only)':58s} " + " ".join(f"{d + f' ({n[d]})':>16s}" for d in doms)
          + f" {'both':>7s}")
    overall = {}
    for shape, per in res.items():
        cells = [_mean_se(per[d]) for d in doms]
        overall[shape] = sum(m for m, _ in cells) / len(cells)
        print(f"{shape:58s} " + " ".join(f"{m:8.3f} ± {se:.3f}" for m, se in cells) + f" {overall[shape]:7.3f}")
    best = {d: max(res, key=lambda s, d=d: sum(res[s][d])) for d in doms}
    acc = {d: _mean_se(res[best[d]][d])[0] for d in doms}
    single = max(overall, key=lambda s: overall[s])
    print(" ".join(f"best_{d}={best[d].replace(' ', '')} best_{d}_accuracy={acc[d]:.4f}" for d in doms)
          + f" per_domain_best={sum(acc.values()) / len(acc):.4f} best_single_shape={single.replace(' ', '')} "
          f"best_single_shape_accuracy={overall[single]:.4f} questions={sum(n.values())}")


if __name__ == "__main__":
    main()
