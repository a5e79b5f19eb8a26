"""Replay hybrid GSM8K cascades from the recording and split their dollars: how often each escalates to GPT-4,
how often the answers it accepts are right, the share of its dollars spent on local compute, and what it would
cost with local compute free or at a quarter of its recorded seconds (docs/workflow-replay.md, "Why the cascade
does not pay"). All recorded GSM8K questions, every split: descriptive, not a held-out result.

Run from the repository root (seconds; no model is loaded):

    python docs/figures/workflow-replay/hybrid_cascades.py fixed:5 fixed:0 pot:0 fixed:4 \\
        cascade:0+pot-0+4:5 cascade:0+4:5 cascade:0+pot-0:5
"""

from __future__ import annotations

import sys
import time

from conductor.policy.spec import parse_conductor_spec
from conductor.policy.strategies import make_strategy, strategy_pool
from conductor.run.workflow_replay.questions import HYBRID_POOL, default_cache, question_set
from conductor.run.workflow_replay.replay import CASCADE_PARTS, escalation, replay_strategy
from conductor.workers.pool import load_pool

PARTS = {**CASCADE_PARTS, "cascade:0+pot-0:5": ("fixed:0", "pot:0")}   # and the cascade without Mixtral


def main(specs: list[str]) -> None:
    hybrid = load_pool(HYBRID_POOL)
    questions = [q for q in question_set(300, 100) if q.domain == "math"]
    res = {}
    for spec in specs:
        parsed = parse_conductor_spec(spec)
        pool = strategy_pool(parsed, hybrid)
        t0 = time.perf_counter()
        res[spec] = replay_strategy(spec, make_strategy(parsed, pool).workflow, pool, questions, default_cache())
        print(f"{spec} replayed {sum(not o.infra for o in res[spec].values())} in {time.perf_counter() - t0:.1f} s")
    common = [q.id for q in questions if all(not res[s][q.id].infra for s in res)]
    print("common recorded:", len(common))
    gpt4 = sum(res["fixed:5"][q].dollars for q in common)
    for spec, rows in res.items():
        acc = sum(rows[q].correct for q in common) / len(common)
        dollars = sum(rows[q].dollars for q in common)
        print(f"{spec:28s} acc={acc:.3f} $/q={dollars / len(common):.6f} vs_gpt4={dollars / gpt4:.3f}")
    for spec, parts in PARTS.items():
        if spec in res and all(p in res for p in parts):
            e = escalation(res, spec, common, parts)
            total = sum(res[spec][q].dollars for q in common)
            local = e.local_share * total
            print(f"{spec:28s} escalated {e.escalated}/{e.questions} ({e.escalated / e.questions:.0%}); accepted right "
                  f"{e.accepted_right}/{e.questions - e.escalated}; local share {e.local_share:.0%} of its $; "
                  f"vs_gpt4 with local free {(total - local) / gpt4:.3f}, "
                  f"local at 1/4 the recorded seconds {(total - 0.75 * local) / gpt4:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
