"""Learning on real model outputs: GRPO over a REPLAY pool of recorded frontier answers, with a cost objective.

The pool (default ``data/pools/replay-gsm8k.yaml``) answers from RouteLLM's recordings of GPT-4-1106-preview
and Mixtral-8x7B-Instruct on the GSM8K test questions (docs/replay.md): real replies, real correctness, the
real models' prices, no model called. The conductor is SmolLM2-135M, trained on CPU as in ``bench/learning.py``
(its routing prefill and constrained worker index: the workflow is one step, the model chooses the worker,
conductor/policy/prefill.py); every rollout, evaluation and baseline goes through the production shard loop
(conductor/run/shards.py: plan -> generate -> execute -> score, the same ``Trajectory`` rows).

Protocol (nothing on test is looked at before the end):
1. a seeded split **by content hash** of the recorded questions (``normalize_question``): train 60%,
   validation 20%, test 20% (``--split``); RouteLLM's contaminated prompts are left out by the pool;
2. every worker alone on validation and test (the outcome matrices) and the **headroom check** on validation
   (``conductor.stats.headroom``: each worker, the random-mix line, the cross-fit routing oracle, the
   any-correct oracle, the verdict);
3. for each lambda in ``--lambdas``: GRPO from the same base on the same training questions with the
   success-gated cost objective (``conductor.grading.objective``: ``r * (1 - min(lambda * c / c_ref, 0.4))``
   for right answers, ``c_ref`` the group's most expensive right member); evaluated on validation;
4. the lambda **picked on validation**: the most accurate whose dollars stay within ``--max-cost-ratio`` of the
   best single worker's and whose accuracy is within ``--tolerance`` of it; else the one with the best
   validation APGR;
5. test, read once: lambda = 0 and the picked lambda (greedy: the most probable worker), each single worker,
   the random-mix line, the any-correct oracle, and the policy's own probability of calling the strong worker
   swept as a threshold (RouteLLM's protocol, arXiv 2406.18665 Sec. 3.2 and ``evals/benchmarks.py``: APGR,
   CPT(50%), CPT(80%)); a paired test (exact McNemar) of the picked policy against the best single worker.

Resumable: every stage writes its result into ``--state`` (default ``runs/replay-learning``) and a rerun skips
what is there; a trained lambda's checkpoint is kept, so an interrupted run loses at most one training run.

    python bench/replay_learning.py [--lambdas 0,0.25,1] [--iterations 40] [--questions-per-iteration 8]
                                    [--group-size 8] [--state DIR] [--out docs/figures/replay] [--quick]
    python bench/replay_learning.py --headroom-only [--headroom-split test --policy-probs replay_learning.json]

Last line: ``trained_accuracy=<a> trained_cost_per_q=<c> best_single_accuracy=<b> best_single_cost_per_q=<d>
cost_ratio=<c/d> apgr=<x> random_apgr=<r> oracle_accuracy=<o> p_value=<p>`` (test questions, picked lambda).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.argtypes import float_list, fractions, positive_float  # noqa: E402
from conductor.files import atomic_path, atomic_write_text, save_figure  # noqa: E402
from conductor.policy.prefill import ROUTING_PREFILL, PrefilledBackend, RoutingConstraint  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pool", default=str(ROOT / "data" / "pools" / "replay-gsm8k.yaml"))
    ap.add_argument("--dataset", default="gsm8k_test", help="the recorded question set (a dataset spec)")
    ap.add_argument("--lambdas", type=float_list, default="0,0.25,1", help="cost weights to train, comma-separated (0 = accuracy only)")
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--questions-per-iteration", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--lr", type=positive_float, default=3e-5)
    ap.add_argument("--split", type=fractions, default="0.6,0.2", help="train and validation fractions (test is the rest)")
    ap.add_argument("--max-cost-ratio", type=float, default=0.6, help="the lambda pick's dollar limit vs the best worker")
    ap.add_argument("--tolerance", type=float, default=0.01, help="the lambda pick's accuracy tolerance vs the best worker")
    ap.add_argument("--max-per-split", type=int, default=None, help="cap each split (a slice of a large set)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--state", default=str(ROOT / "runs" / "replay-learning"))
    ap.add_argument("--out", default=str(ROOT / "docs" / "figures" / "replay"))
    ap.add_argument("--headroom-only", action="store_true", help="stop after the validation headroom check (no training)")
    ap.add_argument("--headroom-split", choices=("validation", "test"), default="validation",
                    help="with --headroom-only: the split whose single workers and headroom are measured (test: the "
                         "workers' recorded replies re-graded, no policy is trained or evaluated)")
    ap.add_argument("--policy-probs", default=None, help="with --headroom-split test: a replay_learning.json whose "
                    "trained policies' recorded test probabilities are re-scored against the re-graded replies")
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 iterations, 2 lambdas, small splits")
    a = ap.parse_args(argv)
    a.train_frac, a.val_frac = a.split
    if a.quick:
        a.iterations, a.questions_per_iteration, a.group_size, a.lambdas = 2, 2, 4, [0.0, 1.0]
        a.limit = 60
        if a.state == str(ROOT / "runs" / "replay-learning"):
            a.state = str(Path(tempfile.gettempdir()) / "conductor-replay-learning-quick")
        if a.out == str(ROOT / "docs" / "figures" / "replay"):
            a.out = a.state
    else:
        a.limit = a.max_per_split
    if not a.lambdas or any(x < 0 for x in a.lambdas) or 0.0 not in a.lambdas:
        ap.error("--lambdas: non-negative values, 0 included (the accuracy-only run is the reference)")
    if a.group_size < 2 or a.iterations < 1 or a.questions_per_iteration < 1:
        ap.error("--group-size >= 2, --iterations >= 1, --questions-per-iteration >= 1")
    return a


class State:
    """``--state``: one JSON file per finished stage; a rerun reads them instead of redoing the work."""

    def __init__(self, root: str):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def get(self, name: str) -> Any:
        p = self.root / f"{name}.json"
        return json.loads(p.read_text()) if p.exists() else None

    def put(self, name: str, value: Any) -> Any:
        atomic_write_text(self.root / f"{name}.json", json.dumps(value, indent=1))
        return value


def _questions(a: argparse.Namespace, pool: Any) -> dict[str, list[Any]]:
    """The dataset's questions that every replay worker has a recording of, split by content hash."""
    from conductor.learning.routing import recorded_questions, split_of

    qs = recorded_questions(pool, a.dataset)
    out: dict[str, list[Any]] = {"train": [], "validation": [], "test": []}
    for q in qs:
        out[split_of(q.prompt, a.seed, a.train_frac, a.val_frac)].append(q)
    if a.limit:   # --quick: half-size evaluation splits; --max-per-split: the same cap on each, a hash-ordered sample
        def key(q: Any) -> str:
            return hashlib.sha256(f"{a.seed}\x1e{q.prompt}".encode()).hexdigest()
        out = {k: sorted(v, key=key)[: a.limit if (k == "train" or not a.quick) else a.limit // 2]
               for k, v in out.items()}
    return out


# --------------------------------------------------------------------------- the policy

class Router:
    """SmolLM2-135M as the conductor, with the routing prefill and the constrained worker index."""

    def __init__(self, a: argparse.Namespace, n_workers: int, lam: float, iterations: int):
        from conductor.grading.objective import CostObjective
        from conductor.learning.grpo import GRPOConfig, PolicyTrainer
        from conductor.learning.grpo.checkpoint import ensure_hf_checkpoint
        from conductor.local.embedded import ensure_models
        from conductor.policy.transformers_backend import TransformersBackend

        gguf = ensure_models(which=["smollm2-135m-instruct"])["smollm2-135m-instruct"]
        self.cfg = GRPOConfig.cpu(learning_rate=a.lr, lr_schedule="constant", total_iterations=iterations,
                                  temperature=1.0, micro_batch_size=a.group_size, seed=a.seed,
                                  max_completion_tokens=3 + 256, objective=CostObjective(cost_lambda=lam))
        self.trainer = PolicyTrainer(str(ensure_hf_checkpoint(gguf)), self.cfg)
        tok = self.trainer.tokenizer
        inner = TransformersBackend(self.trainer.model, tok, batch_size=a.group_size)
        self.constraint = RoutingConstraint(tok, n_workers, tok.convert_tokens_to_ids("<|im_end|>"))
        self.backend = PrefilledBackend(inner, ROUTING_PREFILL, self.constraint)
        self.index_ids = self.constraint.allowed[0]

    def load(self, path: str) -> None:
        from safetensors.torch import load_model

        load_model(self.trainer.model, str(Path(path) / "model.safetensors"))

    def save(self, path: str) -> None:
        from safetensors.torch import save_model

        with atomic_path(Path(path) / "model.safetensors") as tmp:
            save_model(self.trainer.model, str(tmp))     # tied embeddings and head saved once

    def route_probs(self, prompts: list[str]) -> list[list[float]]:
        """P(worker i | question) at the constrained index position, one forward pass per prompt.

        Every conductor prompt starts with the same instructions, so their keys and values are computed once
        and each prompt runs only its own tail (the question and the prefill): about a quarter of the tokens.
        """
        import copy

        import torch

        tok, model = self.trainer.tokenizer, self.trainer.model
        inner = self.backend.inner
        ids = [tok(inner.render(p) + ROUTING_PREFILL, add_special_tokens=False)["input_ids"] for p in prompts]
        n = min(len(x) for x in ids) - 1
        while n > 0 and any(x[:n] != ids[0][:n] for x in ids):
            n -= 1
        out = []
        with torch.no_grad():
            prefix = model(torch.tensor([ids[0][:n]], device=model.device), use_cache=True).past_key_values if n else None
            for x in ids:
                tail = torch.tensor([x[n:]], device=model.device)
                cache = copy.deepcopy(prefix) if prefix is not None else None
                logits = model(tail, past_key_values=cache, use_cache=True).logits[0, -1].float()
                out.append(torch.softmax(logits[self.index_ids], dim=-1).tolist())
        return out


# --------------------------------------------------------------------------- runs over the pipeline

def _rows(trajs: list[Any]) -> dict[str, dict[str, Any]]:
    """Per question: correct, dollars, the worker of its last step (evaluation rows carry one sample)."""
    out = {}
    for t in trajs:
        if t.infra_failed or t.reward is None:
            continue
        out[t.question_id] = {"correct": bool(t.correct), "cost": t.cost_usd, "reward": t.reward,
                              "worker": t.calls[-1].worker if t.calls else None}
    return out


def single_workers(pool: Any, questions: list[Any], tag: str) -> dict[str, dict[str, dict[str, Any]]]:
    """Every worker alone on ``questions`` through the pipeline (replay: free)."""
    from conductor.execution.executor import Executor
    from conductor.policy.fixed import FixedWorkflowPolicy
    from conductor.run.pipeline import RunSpec
    from conductor.run.shards import run_shard

    out = {}
    for i, w in enumerate(pool.workers):
        spec = RunSpec(run_id=f"replay-{tag}-fixed{i}", kind="eval", pool=pool, checkpoint_id=f"fixed:{i}",
                       fewshot="none", temperature=0.0, max_tokens=3)
        out[w.name] = _rows(run_shard(questions, spec, FixedWorkflowPolicy.single_worker(i), Executor()))
    return out


def policy_eval(router: Router, pool: Any, questions: list[Any],
                single: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The policy's routing probabilities, one forward pass per question, and its greedy decision's outcome.

    Under the routing constraint the greedy completion is the most probable worker index, so its trajectory is
    that worker's own pipeline run on the question (``single``, executed through plan -> generate -> execute ->
    score): the same row, without generating again (a 135M forward per question on two cores, not a decode).
    """
    from conductor.prompts import conductor_prompt

    names = [w.name for w in pool.workers]
    prompts = [conductor_prompt(q.prompt, pool.full(), fewshot="none", domain=q.domain) for q in questions]
    probs = router.route_probs(prompts)
    rows = {}
    for q, p in zip(questions, probs):
        w = names[max(range(len(p)), key=p.__getitem__)]
        if q.id in single[w]:
            rows[q.id] = {**single[w][q.id], "worker": w}
    return {"rows": rows, "probs": {q.id: p for q, p in zip(questions, probs)}}


def train(a: argparse.Namespace, pool: Any, train_qs: list[Any], lam: float, st: State) -> Router:
    """GRPO at cost weight ``lam`` from the base checkpoint; the trained weights are kept in the state."""
    from conductor.execution.executor import Executor
    from conductor.run.pipeline import RunSpec
    from conductor.run.shards import run_shard

    router = Router(a, len(pool.workers), lam, a.iterations)
    name = f"train-lambda{lam:g}"
    ckpt = st.root / f"ckpt-lambda{lam:g}"
    if st.get(name) is not None and (ckpt / "model.safetensors").exists():
        router.load(str(ckpt))
        return router
    executor = Executor()
    curve = []
    q_per = a.questions_per_iteration
    for it in range(1, a.iterations + 1):
        t0 = time.time()
        qs = [train_qs[(j + (it - 1) * q_per) % len(train_qs)] for j in range(q_per)]
        spec = RunSpec(run_id=f"replay-train-l{lam:g}-it{it:03d}", kind="rollout", pool=pool, samples=a.group_size,
                       seed=a.seed + it, fewshot="none", temperature=1.0, max_tokens=3)
        trajs = run_shard(qs, spec, router.backend, executor)
        m = router.trainer.step(trajs)
        ok = [t for t in trajs if not t.infra_failed and t.reward is not None]
        strong = sum(1 for t in ok if t.calls and t.calls[-1].worker == pool.workers[0].name) / max(1, len(ok))
        row = {"iteration": it, "accuracy": sum(bool(t.correct) for t in ok) / max(1, len(ok)),
               "cost": sum(t.cost_usd for t in ok) / max(1, len(ok)), "strong_share": strong,
               "zero_adv_groups": m["n_zero_advantage_groups"], "loss": m["loss"], "s": round(time.time() - t0, 1)}
        curve.append(row)
        print(f"[lambda={lam:g} it {it:3d}/{a.iterations}] acc={row['accuracy']:.3f} $/q={row['cost']:.5f} "
              f"{pool.workers[0].name} share={strong:.2f} no-contrast={row['zero_adv_groups']}/{q_per} "
              f"{row['s']:.0f}s", flush=True)
    router.save(str(ckpt))
    st.put(name, {"lambda": lam, "curve": curve})
    return router


# --------------------------------------------------------------------------- figures

def _point(rows: dict[str, dict[str, Any]], qids: list[str]) -> dict[str, float]:
    xs = [rows[q] for q in qids if q in rows]
    n = max(1, len(xs))
    acc = sum(r["correct"] for r in xs) / n
    return {"accuracy": acc, "se": (acc * (1 - acc) / n) ** 0.5, "cost_per_q": sum(r["cost"] for r in xs) / n,
            "n": len(xs), "strong_share": None}


def _matrix(single: dict[str, dict[str, dict[str, Any]]], questions: list[Any]) -> Any:
    from conductor.stats.headroom import OutcomeMatrix

    names = list(single)
    qs = [q for q in questions if all(q.id in single[w] for w in names)]
    return OutcomeMatrix([q.id for q in qs], names, [[single[w][q.id]["correct"] for w in names] for q in qs],
                         [[single[w][q.id]["cost"] for w in names] for q in qs],
                         texts=[q.prompt for q in qs], domains=[q.domain for q in qs])


def line_slope(matrix: Any) -> float:
    """Accuracy per dollar along the random-mix line (the cross-fit router's cost weight: it then pays for the
    strong worker only where it expects more than the line's average gain)."""
    acc, dollars = matrix.accuracy, matrix.dollars
    b, c = matrix.best_worker, matrix.cheapest_worker
    return float((acc[b] - acc[c]) / (dollars[b] - dollars[c])) if dollars[b] > dollars[c] else 0.0


def policy_figures(ev: dict[str, Any], single: dict[str, dict[str, dict[str, Any]]], strong: str, weak: str,
                   qids: list[str]) -> dict[str, Any]:
    """The policy's pipeline point and its threshold curve on the same questions (RouteLLM's metrics)."""
    from conductor.stats.routing import apgr, cpt, random_apgr, route_curve

    qids = [q for q in qids if q in ev["rows"] and q in ev["probs"]]
    point = _point(ev["rows"], qids)
    point["strong_share"] = sum(ev["rows"][q]["worker"] == strong for q in qids) / max(1, len(qids))
    s_ok = [single[strong][q]["correct"] for q in qids]
    w_ok = [single[weak][q]["correct"] for q in qids]
    curve = route_curve([ev["probs"][q][0] for q in qids], s_ok, w_ok,
                        [single[strong][q]["cost"] for q in qids], [single[weak][q]["cost"] for q in qids])
    return {**point, "apgr": apgr(curve), "cpt50": cpt(curve, 0.5), "cpt80": cpt(curve, 0.8),
            "random_apgr": random_apgr(s_ok, w_ok), "curve": {"fractions": curve.fractions,
                                                              "accuracy": curve.accuracy, "dollars": curve.dollars}}


def escalation_table(rows: dict[str, dict[str, Any]], single: dict[str, dict[str, dict[str, Any]]], strong: str,
                     weak: str) -> dict[str, dict[str, float]]:
    """What the policy learned to send where: its share of calls to the strong worker on the questions where
    only the strong one is right, both are, neither is, and only the weak one is (targeted escalation puts the
    first far above the others; a router without signal sends every kind alike).

    >>> single = {"s": {"a": {"correct": True}, "b": {"correct": True}}, "w": {"a": {"correct": False}, "b": {"correct": True}}}
    >>> escalation_table({"a": {"worker": "s"}, "b": {"worker": "w"}}, single, "s", "w")["only strong right"]
    {'questions': 1, 'strong_share': 1.0}
    """
    kinds = {(True, False): "only strong right", (True, True): "both right", (False, False): "neither right",
             (False, True): "only weak right"}
    out: dict[str, dict[str, float]] = {}
    for label in kinds.values():
        qs = [q for q, r in rows.items() if q in single[strong] and q in single[weak]
              and kinds[(single[strong][q]["correct"], single[weak][q]["correct"])] == label]
        out[label] = {"questions": len(qs),
                      "strong_share": sum(rows[q]["worker"] == strong for q in qs) / len(qs) if qs else 0.0}
    return out


def pick_lambda(val: dict[str, dict[str, Any]], best: dict[str, float], max_ratio: float, tol: float) -> float:
    """The most accurate lambda within the dollar limit and accuracy tolerance; else the best validation APGR.

    >>> v = {"0": {"accuracy": .86, "cost_per_q": 1.0, "apgr": .50}, "1": {"accuracy": .70, "cost_per_q": .1, "apgr": .55}}
    >>> pick_lambda(v, {"accuracy": .86, "cost_per_q": 1.0}, 0.6, 0.01)
    1.0
    """
    ok = {k: v for k, v in val.items() if v["cost_per_q"] <= max_ratio * best["cost_per_q"]
          and v["accuracy"] >= best["accuracy"] - tol}
    if ok:
        return float(max(ok, key=lambda k: (ok[k]["accuracy"], -ok[k]["cost_per_q"])))
    return float(max(val, key=lambda k: (val[k]["apgr"], val[k]["accuracy"])))


def _plot(out: Path, test: dict[str, Any], published: list[tuple[str, float]], table: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.8))
    for name, p in test["single"].items():
        ax.errorbar(p["cost_per_q"], p["accuracy"], yerr=2 * p["se"], fmt="s", ms=8, label=f"{name} alone")
    xs = sorted(test["single"].values(), key=lambda p: p["cost_per_q"])
    ax.plot([xs[0]["cost_per_q"], xs[-1]["cost_per_q"]], [xs[0]["accuracy"], xs[-1]["accuracy"]], "k:",
            label="random mix")
    o = test["oracle"]
    ax.plot(o["cost_per_q"], o["accuracy"], "*", ms=14, color="gold", mec="k", label="any-correct oracle")
    for lam, p in sorted(test["policies"].items(), key=lambda kv: float(kv[0])):
        line = ax.plot(p["curve"]["dollars"], p["curve"]["accuracy"], "-", alpha=0.6,
                       label=f"trained lambda={lam} threshold sweep (APGR {p['apgr']:.3f})")
        ax.plot(p["cost_per_q"], p["accuracy"], "o", ms=9, color=line[0].get_color(), mec="k")
    ax.set_xlabel("dollars per question (test)")
    ax.set_ylabel("accuracy (test)")
    ax.set_title(f"accuracy against dollars, {test['n']} held-out questions")
    ax.legend(fontsize=7)
    labels = [f"lambda={k}" for k in sorted(test["policies"], key=float)] + [n for n, _ in published] + ["random"]
    vals = [test["policies"][k]["apgr"] for k in sorted(test["policies"], key=float)] + [v for _, v in published]
    vals.append(test["random_apgr"])
    bx.barh(range(len(labels)), vals, color=["C0"] * len(test["policies"]) + ["C7"] * len(published) + ["k"])
    bx.set_yticks(range(len(labels)), labels, fontsize=8)
    bx.axvline(0.5, color="k", ls=":")
    bx.set_xlim(0.3, 0.8)
    bx.set_title(f"APGR (ours on test; RouteLLM's published routers, {table})")
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, out / "replay_learning.png")


# RouteLLM, arXiv 2406.18665 v4, Table 3 (GSM8K, GPT-4-1106-preview vs Mixtral-8x7B, routers trained on Arena
# data augmented with LLM-judge labels): APGR. The random row is 0.497 (+/- 0.01).
ROUTELLM_GSM8K = [("RouteLLM BERT (T3)", 0.531), ("RouteLLM causal LLM (T3)", 0.622),
                  ("RouteLLM matrix fact. (T3)", 0.565), ("RouteLLM SW ranking (T3)", 0.568)]
# Table 2 (MMLU, same pair, Arena data augmented with MMLU gold labels); Arena-only routers: 0.473-0.524.
ROUTELLM_MMLU = [("RouteLLM BERT (T2)", 0.572), ("RouteLLM causal LLM (T2)", 0.600),
                 ("RouteLLM matrix fact. (T2)", 0.597), ("RouteLLM SW ranking (T2)", 0.603)]


def _print_headroom(head: Any, single: dict[str, dict[str, dict[str, Any]]], qids: list[str]) -> None:
    for line in head.evidence:
        print(f"  - {line}", flush=True)
    for w in single:
        p = _point(single[w], qids)
        print(f"  {w}: accuracy {p['accuracy']:.4f} +/- {p['se']:.4f} on {p['n']}, ${p['cost_per_q']:.6f}/question")
    b = head.best
    print(f"best_single_accuracy={b.accuracy:.4f} cross_fit_accuracy={head.cross_fit.accuracy:.4f} "
          f"mix_accuracy_at_cost={head.mix_at_cross_fit_cost.accuracy:.4f} "
          f"oracle_accuracy={head.any_correct.accuracy:.4f} verdict={head.verdict}")


def headroom_only(a: argparse.Namespace, st: State, pool: Any, questions: list[Any], split: str) -> None:
    """Every worker alone on ``split`` and its headroom check: the recorded replies graded again, nothing
    trained (``--headroom-only --headroom-split test``, how #47 re-measured #34's test figures)."""
    from conductor.stats.headroom import headroom_report

    single = st.get(f"single-{split}-headroom") or st.put(f"single-{split}-headroom",
                                                          single_workers(pool, questions, split))
    matrix = _matrix(single, questions)
    head = headroom_report(matrix, seed=a.seed, cost_weight=line_slope(matrix))
    head.write(Path(a.out) / f"headroom-{split}")
    print(f"[headroom {split}] {head.verdict_line}", flush=True)
    if a.policy_probs:
        rescore_policies(a.policy_probs, single, [w.name for w in pool.workers], [q.id for q in questions])
    _print_headroom(head, single, [q.id for q in questions])


def rescore_policies(path: str, single: dict[str, dict[str, dict[str, Any]]], names: list[str],
                     qids: list[str]) -> None:
    """The trained policies' recorded test decisions (their routing probabilities in ``path``) scored against
    ``single``: a policy's greedy answer is its most probable worker's reply, so re-grading the replies re-scores
    it without training or running the model again."""
    recorded = json.loads(Path(path).read_text())["test"]["probs"]
    for lam, probs in recorded.items():
        rows = {}
        for q, p in probs.items():
            w = names[max(range(len(p)), key=p.__getitem__)]
            if q in single[w]:
                rows[q] = {**single[w][q], "worker": w}
        fig = policy_figures({"rows": rows, "probs": probs}, single, names[0], names[1], qids)
        print(f"  trained lambda={lam}: accuracy {fig['accuracy']:.4f} +/- {fig['se']:.4f}, ${fig['cost_per_q']:.6f}/q, "
              f"strong share {fig['strong_share']:.3f}, apgr {fig['apgr']:.4f} (random {fig['random_apgr']:.4f}), "
              f"cpt50 {fig['cpt50']:.3f}, cpt80 {fig['cpt80']:.3f}", flush=True)
        print("    escalation: " + json.dumps(escalation_table(rows, single, names[0], names[1])), flush=True)


def _inputs(a: argparse.Namespace) -> tuple[Any, dict[str, list[Any]]]:
    """The pool and the split questions, or one ``error:`` line (exit 2) for a missing pool, an unknown
    dataset, a pool without two workers, or a split left with fewer than 2 questions."""
    from conductor.data.datasets import DatasetError
    from conductor.workers.pool import PoolError, load_pool
    from conductor.workers.recordings import RecordingError

    try:
        pool = load_pool(a.pool)
        if len(pool.workers) < 2:
            raise PoolError(f"{a.pool}: the bench routes between two workers; the pool has {len(pool.workers)}")
        splits = _questions(a, pool)
    except (PoolError, DatasetError, RecordingError, OSError) as e:
        print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        raise SystemExit(2) from None
    small = [f"{k} {len(v)}" for k, v in splits.items() if len(v) < 2]   # headroom and GRPO need two at least
    if small:
        print(f"error: --dataset {a.dataset} --split {a.train_frac:g},{a.val_frac:g}: a split left (nearly) empty "
              f"({', '.join(small)} of {sum(map(len, splits.values()))} recorded questions); every split needs 2 "
              "or more: give more questions or other fractions", file=sys.stderr)
        raise SystemExit(2)
    return pool, splits


def main(argv: list[str] | None = None) -> None:
    a = _args(argv)
    pool, splits = _inputs(a)        # mistakes are one line before torch loads
    import torch

    torch.set_num_threads(a.threads)
    from conductor.stats.headroom import PolicyOutcome, headroom_report

    t_start = time.time()
    st = State(a.state)
    strong, weak = pool.workers[0].name, pool.workers[1].name
    print(f"replay learning: pool={pool.id} questions train={len(splits['train'])} validation="
          f"{len(splits['validation'])} test={len(splits['test'])} lambdas={a.lambdas} iterations={a.iterations} "
          f"questions/iter={a.questions_per_iteration} G={a.group_size} state={a.state}", flush=True)
    if a.headroom_only and a.headroom_split == "test":
        headroom_only(a, st, pool, splits["test"], "test")
        return
    val_ids = [q.id for q in splits["validation"]]
    single_val = st.get("single-validation") or st.put("single-validation", single_workers(pool, splits["validation"], "val"))
    best_val = max((_point(single_val[w], val_ids) for w in single_val), key=lambda p: p["accuracy"])
    m_val = _matrix(single_val, splits["validation"])
    head = headroom_report(m_val, seed=a.seed, cost_weight=line_slope(m_val))
    head.write(Path(a.out) / "headroom-validation")
    print(f"[headroom validation] {head.verdict_line}", flush=True)
    if a.headroom_only:
        _print_headroom(head, single_val, val_ids)
        return

    val: dict[str, Any] = st.get("validation") or {}
    for lam in a.lambdas:
        if f"{lam:g}" in val:
            continue
        router = train(a, pool, splits["train"], lam, st)
        ev = policy_eval(router, pool, splits["validation"], single_val)
        val[f"{lam:g}"] = {k: v for k, v in policy_figures(ev, single_val, strong, weak, val_ids).items() if k != "curve"}
        st.put("validation", val)
        print(f"[validation lambda={lam:g}] " + " ".join(f"{k}={v}" for k, v in val[f'{lam:g}'].items()), flush=True)
    picked = pick_lambda(val, best_val, a.max_cost_ratio, a.tolerance)
    print(f"[pick] lambda={picked:g} (validation: {val[f'{picked:g}']})", flush=True)

    test = st.get("test")
    if test is None:    # read once
        test_ids = [q.id for q in splits["test"]]
        single = single_workers(pool, splits["test"], "test")
        test = {"n": len(test_ids), "single": {w: _point(single[w], test_ids) for w in single}, "policies": {}}
        matrix = _matrix(single, splits["test"])
        for lam in sorted({0.0, picked}):
            router = train(a, pool, splits["train"], lam, st)
            ev = policy_eval(router, pool, splits["test"], single)
            test["policies"][f"{lam:g}"] = policy_figures(ev, single, strong, weak, test_ids)
            test["policies"][f"{lam:g}"]["escalation"] = escalation_table(ev["rows"], single, strong, weak)
            test.setdefault("rows", {})[f"{lam:g}"] = ev["rows"]
            test.setdefault("probs", {})[f"{lam:g}"] = ev["probs"]
        pol = test["rows"][f"{picked:g}"]
        report = headroom_report(matrix, seed=a.seed, cost_weight=line_slope(matrix), policy=PolicyOutcome(
            f"trained lambda={picked:g}", {q: r["correct"] for q, r in pol.items()},
            {q: r["cost"] for q, r in pol.items()}))
        report.write(Path(a.out) / "headroom-test")
        test.update(picked=picked, verdict=report.verdict_line, evidence=list(report.evidence),
                    oracle={"accuracy": report.any_correct.accuracy, "cost_per_q": report.any_correct.dollars},
                    cross_fit={"accuracy": report.cross_fit.accuracy, "cost_per_q": report.cross_fit.dollars},
                    random_apgr=test["policies"][f"{picked:g}"]["random_apgr"],
                    p_value=report.policy_vs_best.p_value if report.policy_vs_best else None)
        st.put("test", test)
    out = Path(a.out)
    png = _plot(out, test, ROUTELLM_MMLU if a.dataset.startswith("mmlu") else ROUTELLM_GSM8K,
                "MMLU, Table 2" if a.dataset.startswith("mmlu") else "GSM8K, Table 3")
    result = {"args": {k: v for k, v in vars(a).items()}, "validation": val, "test": {k: v for k, v in test.items()
              if k != "rows"}, "runtime_s": round(time.time() - t_start, 1),
              "training": {f"{lam:g}": st.get(f"train-lambda{lam:g}") for lam in a.lambdas}}
    (out / "replay_learning.json").write_text(json.dumps(result, indent=1))
    print(f"[test] {test['verdict']}", flush=True)
    for line in test["evidence"]:
        print(f"  - {line}", flush=True)
    print(f"figure: {png}  data: {out / 'replay_learning.json'}  runtime_s={result['runtime_s']}", flush=True)
    p = test["policies"][f"{picked:g}"]
    best = max(test["single"].values(), key=lambda x: x["accuracy"])
    ratio = p["cost_per_q"] / best["cost_per_q"] if best["cost_per_q"] else float("nan")
    pv = test["p_value"]
    print(f"trained_accuracy={p['accuracy']:.4f} trained_cost_per_q={p['cost_per_q']:.6f} "
          f"best_single_accuracy={best['accuracy']:.4f} best_single_cost_per_q={best['cost_per_q']:.6f} "
          f"cost_ratio={ratio:.4f} apgr={p['apgr']:.4f} random_apgr={test['random_apgr']:.4f} "
          f"oracle_accuracy={test['oracle']['accuracy']:.4f} p_value={pv if pv is None else round(pv, 4)}")


if __name__ == "__main__":
    main()
