"""The menu conductor (``--conductor menu:fixed:0,chain:0:1``: the embedded 1.5B picks one of the two shapes the
untrained default writes, in its own format, without writing the subtasks) against the untrained default and the
1.5B alone (`fixed:0`), on the recording's held-out test split (docs/default-conductor.md, "The menu conductor").

The menu run is a real `conductor answer` over a copy of the recording: every worker call is a cache hit (the
entries were recorded), only the conductor's choices run live. So each question's outcome is the chosen entry's
recorded outcome, and its seconds are that entry's recorded seconds plus the decision as measured in the run.
The default and `fixed:0` come from the replay state (their recorded outcomes and seconds, the default's own
recorded conductor time included).

    python docs/figures/workflow-replay/menu_vs_default.py RUN_DIR runs/workflow-replay/replay/state.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import polars as pl

from conductor.run.workflow_replay.replay import outcomes_of
from conductor.run.workflow_replay.report import Outcome, paired_difference


def menu_outcomes(run: Path) -> tuple[dict[str, Outcome], dict[str, int], dict[str, float]]:
    """(outcome per question, steps chosen per question, decision seconds per question) from the run's lake."""
    t = pl.read_parquet(run / "lake" / "trajectories" / "**" / "*.parquet")
    c = pl.read_parquet(run / "lake" / "calls" / "**" / "*.parquet")
    secs = c.group_by("trajectory_id").agg(pl.col("latency_s").fill_null(0.0).sum().alias("work"))
    t = t.join(secs, on="trajectory_id", how="left").with_columns(pl.col("work").fill_null(0.0))
    out, steps, decision = {}, {}, {}
    for r in t.iter_rows(named=True):
        q = r["question_id"]
        out[q] = Outcome(bool(r["correct"]), r["work"] + r["conductor_s"], 0.0, bool(r["infra_failed"]))
        steps[q], decision[q] = int(r["n_steps"]), float(r["conductor_s"])
    return out, steps, decision


def line(label: str, a: dict[str, Outcome], b: dict[str, Outcome], qs: list[str], name_b: str) -> str:
    diff, se = paired_difference(a, b, qs)
    acc_a = sum(a[q].correct for q in qs) / len(qs)
    acc_b = sum(b[q].correct for q in qs) / len(qs)
    ratio = sum(a[q].seconds for q in qs) / sum(b[q].seconds for q in qs)
    return (f"{label:6s} n={len(qs):3d}  menu {acc_a:.3f}  {name_b} {acc_b:.3f}  paired {diff:+.3f} +- {se:.3f}  "
            f"seconds {ratio:.2f}x")


def main(run: str, state_path: str) -> None:
    menu, steps, decision = menu_outcomes(Path(run))
    state = json.loads(Path(state_path).read_text())
    fixed, default = outcomes_of(state, "fixed:0"), outcomes_of(state, "default")
    chain = outcomes_of(state, "chain:0:1")
    qs_all = sorted(q for q in menu if not menu[q].infra and q in fixed and q in default
                    and not fixed[q].infra and not default[q].infra)
    # the chosen entry's recorded outcome must be what the menu run graded (its calls were all cache hits)
    agree = sum(menu[q].correct == (chain if steps[q] > 1 else fixed)[q].correct for q in qs_all)
    print(f"menu run {run}: {len(qs_all)} test questions; chosen entry's recorded grade reproduced on {agree}")
    # the chosen entry's recorded seconds: the menu's workflows without its decision
    work = {q: (chain if steps[q] > 1 else fixed)[q] for q in qs_all}
    for prefix in ("", "gsm8k", "mmlu"):
        qs = [q for q in qs_all if q.startswith(prefix)]
        if not qs:
            continue
        share = sum(steps[q] > 1 for q in qs) / len(qs)
        dec = sum(decision[q] for q in qs) / len(qs)
        w = sum(work[q].seconds for q in qs) / sum(fixed[q].seconds for q in qs)
        d = sum(default[q].seconds for q in qs) / sum(fixed[q].seconds for q in qs)
        print(f"{prefix or 'all':6s} chain chosen {share:.0%}  decision {dec:.1f} s/question as measured in the run; "
              f"recorded seconds over the 1.5B alone's: the menu's workflows {w:.2f}x, the default {d:.2f}x "
              f"(its own decision included)")
        print(line(prefix or "all", menu, fixed, qs, "1.5B alone"))
        print(line(prefix or "all", menu, default, qs, "default"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "runs/workflow-replay/replay/state.json")
