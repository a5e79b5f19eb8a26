"""Could a cascade win where routing by the question cannot? The headroom check with the cheap worker's reply as
the router's features.

``bench/replay_learning.py`` finds the replay pool pool-bound for routing: a router that sees only the question
lands on the random-mix line. A conductor can do more than route: with recursion it can call the cheap worker
first, read its reply, and call the strong one only when the reply looks unreliable. This probe asks whether that
reply carries the signal: the same cross-fit router (``conductor.stats.headroom``, kNN over hashed words, cost
weight = the random-mix line's slope), fed the cheap worker's recorded reply instead of the question, on the same
validation split. The cascade always pays the cheap call; the report's dollars add it.

    python bench/replay_cascade_probe.py [--state runs/replay-learning] [--out docs/figures/replay/cascade-probe]

Last line: ``question_router_accuracy=<a> reply_router_accuracy=<b> mix_accuracy_at_cost=<m> verdict=<v>``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--state", default=str(ROOT / "runs" / "replay-learning"), help="bench/replay_learning.py's state")
    ap.add_argument("--pool", default=str(ROOT / "data" / "pools" / "replay-gsm8k.yaml"))
    ap.add_argument("--out", default=str(ROOT / "docs" / "figures" / "replay" / "cascade-probe"))
    a = ap.parse_args(argv)
    import numpy as np

    from bench.replay_learning import line_slope
    from conductor.data.datasets import load_dataset
    from conductor.stats.headroom import OutcomeMatrix, headroom_report
    from conductor.workers.pool import load_pool
    from conductor.workers.recordings import load_recordings

    single = json.loads((Path(a.state) / "single-validation.json").read_text())
    pool = load_pool(a.pool)
    strong, weak = pool.workers[0], pool.workers[1]
    cheap = load_recordings(weak.options["source"], weak.model, worker=weak.name)
    qs = {q.id: q for q in load_dataset("gsm8k_test")}
    ids = [q for q in single[weak.name] if q in single[strong.name]]
    names = [strong.name, weak.name]
    correct = [[single[w][q]["correct"] for w in names] for q in ids]
    cost = np.array([[single[w][q]["cost"] for w in names] for q in ids])
    by_question = OutcomeMatrix(ids, names, correct, cost, texts=[qs[q].prompt for q in ids])
    reply = [cheap.find(qs[q].prompt).reply for q in ids]
    cascade_cost = cost.copy()
    cascade_cost[:, 0] += cost[:, 1]               # escalating means both calls were paid
    by_reply = OutcomeMatrix(ids, names, correct, cascade_cost, texts=reply)
    kappa = line_slope(by_question)
    r_q = headroom_report(by_question, cost_weight=kappa)
    r_r = headroom_report(by_reply, cost_weight=kappa)
    r_r.write(a.out)
    for label, r in (("question", r_q), (f"{weak.name}'s reply", r_r)):
        print(f"[{label}] cross-fit router {100 * r.cross_fit.accuracy:.1f}% at ${r.cross_fit.dollars:.6f}/q; random mix "
              f"at that cost {100 * r.mix_at_cross_fit_cost.accuracy:.1f}%; {r.verdict_line}", flush=True)
    print(f"question_router_accuracy={r_q.cross_fit.accuracy:.4f} reply_router_accuracy={r_r.cross_fit.accuracy:.4f} "
          f"mix_accuracy_at_cost={r_r.mix_at_cross_fit_cost.accuracy:.4f} verdict={r_r.verdict}")


if __name__ == "__main__":
    main()
