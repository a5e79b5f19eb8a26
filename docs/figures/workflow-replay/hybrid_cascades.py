"""Replay hybrid GSM8K cascades from the recording and split their dollars: escalation rate, accepted answers, the
local share; with local compute free or at a quarter of its recorded seconds (docs/workflow-replay.md).
Run from the repository root: python docs/figures/workflow-replay/hybrid_cascades.py fixed:5 fixed:0 pot:0 fixed:4 \
    cascade:0+pot-0+4:5 cascade:0+4:5 cascade:0+pot-0:5"""
import sys, time
from pathlib import Path
from conductor.run.workflow_replay.questions import HYBRID_POOL, question_set, default_cache
from conductor.run.workflow_replay.replay import replay_strategy
from conductor.policy.spec import parse_conductor_spec
from conductor.policy.strategies import make_strategy, strategy_pool
from conductor.workers.pool import load_pool
hybrid = load_pool(HYBRID_POOL)
qs = [q for q in question_set(300, 100) if q.domain == "math"]
res = {}
for spec in sys.argv[1:]:
    parsed = parse_conductor_spec(spec); pool = strategy_pool(parsed, hybrid)
    wf = make_strategy(parsed, pool).workflow
    t0 = time.perf_counter()
    res[spec] = replay_strategy(spec, wf, pool, qs, default_cache())
    print(spec, "replayed", sum(not o.infra for o in res[spec].values()), "in", round(time.perf_counter() - t0, 1), "s", flush=True)
common = [q.id for q in qs if all(not res[s][q.id].infra for s in res)]
print("common recorded:", len(common))
g = res.get("fixed:5")
for spec, r in res.items():
    acc = sum(r[q].correct for q in common) / len(common); d = sum(r[q].dollars for q in common) / len(common)
    ratio = d / (sum(g[q].dollars for q in common) / len(common)) if g else float("nan")
    print(f"{spec:28s} acc={acc:.3f} $/q={d:.6f} vs_gpt4={ratio:.3f}")
if "fixed:0" in res and "fixed:4" in res and "pot:0" in res:
    parts = {"cascade:0+pot-0+4:5": ["fixed:0", "pot:0", "fixed:4"], "cascade:0+4:5": ["fixed:0", "fixed:4"], "cascade:0+pot-0:5": ["fixed:0", "pot:0"]}
    for spec, ps in parts.items():
        if spec not in res: continue
        esc = 0; loc = 0.0; locl = 0.0; right_acc = n_acc = 0; tot = 0.0; gg = 0.0
        for q in common:
            cheap = sum(res[p][q].dollars for p in ps)
            local = sum(res[p][q].dollars for p in ps if p != "fixed:4")
            e = res[spec][q].dollars > cheap + 1e-9
            esc += e; loc += local; tot += res[spec][q].dollars; gg += g[q].dollars
            if not e: n_acc += 1; right_acc += res[spec][q].correct
        n = len(common)
        print(f"{spec:28s} escalated {esc}/{n} ({esc/n:.0%}); accepted right {right_acc}/{n_acc}; local share {loc/tot:.0%} of its $; "
              f"vs_gpt4 with local free {(tot-loc)/gg:.3f}, local at 1/4 the recorded seconds {(tot-0.75*loc)/gg:.3f}")
