"""The untrained default conductor against Qwen2.5-Coder-1.5B alone (`fixed:0`) on every recorded question, per
dataset: paired accuracy difference with its standard error, the paired bootstrap's 95% interval, McNemar's
exact test, and the ratio of recorded seconds (docs/default-conductor.md, "The larger sample"). The default is
untrained and its design was fixed before the recording began, so every recorded question is held out for it.
Then menu entries chosen by dataset (GSM8K -> one entry, MMLU -> another): what a conductor whose decision cost
nothing would score with fixed shapes; these pairs were picked looking at all recorded questions, so they are a
description of the recording, not a held-out result.

Reads the state a `replay` run leaves (no model is loaded; seconds):

    python docs/figures/workflow-replay/default_vs_single.py runs/workflow-replay/replay/state.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conductor.run.workflow_replay.replay import outcomes_of
from conductor.run.workflow_replay.report import Outcome, paired_difference
from conductor.stats.paired import mcnemar_exact, paired_bootstrap

Results = dict[str, dict[str, Outcome]]


def compare(r: Results, prefix: str) -> str:
    a, b = r["default"], r["fixed:0"]
    qs = sorted(q for q in a if q.startswith(prefix) and q in b and not a[q].infra and not b[q].infra)
    x = {q: float(a[q].correct) for q in qs}
    y = {q: float(b[q].correct) for q in qs}
    diff, se = paired_difference(a, b, qs)
    boot = paired_bootstrap(x, y)
    wins, losses = sum(x[q] > y[q] for q in qs), sum(x[q] < y[q] for q in qs)
    seconds = sum(a[q].seconds for q in qs) / sum(b[q].seconds for q in qs)
    return (f"{prefix or 'all':6s} n={len(qs):3d}  default {sum(x.values()) / len(qs):.3f}  1.5B alone "
            f"{sum(y.values()) / len(qs):.3f}  paired {diff:+.3f} +- {se:.3f} (95% CI "
            f"[{boot.ci_low:+.3f}, {boot.ci_high:+.3f}])  McNemar b={wins} c={losses} p2={mcnemar_exact(wins, losses)[1]:.2f}"
            f"  seconds {seconds:.2f}x")


BY_DATASET = (("fixed:0", "fixed:0"), ("chain:0:1", "fixed:0"), ("moa:0:0", "fixed:0"),
              ("vote:0+pot-0+chain-0-1", "fixed:0"), ("moa:0:0", "moa:0:0"), ("vote:0+pot-0+chain-0-1", "moa:0:0"))


def by_dataset(r: Results, gsm8k: str, mmlu: str) -> str:
    """GSM8K questions answered by the entry ``gsm8k``, MMLU ones by ``mmlu``, against the 1.5B alone on every
    question that both entries, ``fixed:0`` and the default have."""
    needed = {gsm8k, mmlu, "fixed:0", "default"}
    qs = sorted(q for q in r["default"] if all(q in r[e] and not r[e][q].infra for e in needed))
    chosen = {q: r[gsm8k if q.startswith("gsm8k") else mmlu][q] for q in qs}
    diff, se = paired_difference(chosen, r["fixed:0"], qs)
    acc = sum(o.correct for o in chosen.values()) / len(qs)
    seconds = sum(o.seconds for o in chosen.values()) / sum(r["fixed:0"][q].seconds for q in qs)
    return (f"GSM8K -> {gsm8k:24s} MMLU -> {mmlu:8s} n={len(qs)}  accuracy {acc:.3f}  minus the 1.5B alone "
            f"{diff:+.3f} +- {se:.3f}  seconds {seconds:.2f}x")


def main(path: str) -> None:
    state = json.loads(Path(path).read_text())
    r = {key: outcomes_of(state, key) for key in state if isinstance(state[key], dict)}
    for prefix in ("", "gsm8k", "mmlu"):
        print(compare(r, prefix))
    for gsm8k, mmlu in BY_DATASET:
        print(by_dataset(r, gsm8k, mmlu))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/workflow-replay/replay/state.json")
