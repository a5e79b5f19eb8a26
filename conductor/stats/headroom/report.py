"""The headroom check's outputs: JSON (and back), Markdown, the accuracy-dollars plot, and the three files."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from conductor.files import atomic_write_text, save_figure
from conductor.stats.headroom.model import (
    CrossFitRouter,
    PairedComparison,
    Point,
    RandomMixLine,
    _mix_accuracy,
    best_mix_at_cost,
)
from conductor.stats.headroom.verdict import HeadroomVerdict


@dataclass(frozen=True)
class HeadroomReport(HeadroomVerdict):
    """The headroom check's result (``HeadroomVerdict``) with its outputs: ``to_json``/``from_json``/``dumps``,
    ``render_markdown``, ``plot`` and ``write`` (headroom.json, headroom.md, headroom.png)."""

    def to_json(self) -> dict[str, Any]:
        """Plain JSON: the measured fields, then the derived verdict, reason, evidence and headrooms (NaN -> null)."""
        d = asdict(self)
        d.update(verdict=self.verdict, reason=self.reason, evidence=self.evidence,
                 any_correct_headroom=self.any_correct_headroom, cross_fit_headroom=self.cross_fit_headroom,
                 unpredictable_headroom=self.unpredictable_headroom, policy_captured=self.policy_captured)
        return _no_nan(d)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> HeadroomReport:
        def pc(v: Mapping[str, Any] | None) -> PairedComparison | None:
            return None if v is None else PairedComparison(**v)

        def pt(v: Mapping[str, Any] | None) -> Point | None:
            if v is None:
                return None
            fields: dict[str, Any] = {k: (math.nan if x is None else x) for k, x in v.items()}
            return Point(**fields)

        return cls(
            n_questions=d["n_questions"], workers=tuple(pt(p) for p in d["workers"]),  # type: ignore[misc]
            best_single=d["best_single"], cheapest=d["cheapest"], random_mix=RandomMixLine(**d["random_mix"]),
            mix_at_cross_fit_cost=pt(d["mix_at_cross_fit_cost"]), cross_fit=pt(d["cross_fit"]),  # type: ignore[arg-type]
            any_correct=pt(d["any_correct"]), cross_fit_vs_best=pc(d["cross_fit_vs_best"]),  # type: ignore[arg-type]
            cross_fit_vs_mix=pc(d["cross_fit_vs_mix"]), any_correct_vs_best=pc(d["any_correct_vs_best"]),  # type: ignore[arg-type]
            router=CrossFitRouter(**d["router"]), margin=d["margin"], alpha=d["alpha"], n_boot=d["n_boot"],
            seed=d["seed"], policy=pt(d.get("policy")), policy_vs_best=pc(d.get("policy_vs_best")),
            notes=tuple(d.get("notes") or ()))

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2) + "\n"

    def render_markdown(self, plot: str | None = "headroom.png") -> str:
        """The report as markdown: verdict, the points, the paired tests, the evidence, the settings."""
        lines = ["# Headroom check", "", f"**{self.verdict}** -- {self.reason}.", "",
                 "| point | accuracy | 95% CI | $/question |", "|---|---:|---:|---:|"]
        pts = [(p.label + (" (best single)" if p.label == self.best_single else "")
                + (" (cheapest)" if p.label == self.cheapest else ""), p) for p in self.workers]
        pts += [(f"best random mix at cross-fit cost: {self.mix_at_cross_fit_cost.label}", self.mix_at_cross_fit_cost),
                ("cross-fit routing oracle", self.cross_fit), ("any-correct oracle", self.any_correct)]
        if self.policy is not None:
            pts.append((f"policy: {self.policy.label}", self.policy))
        for name, p in pts:
            lines.append(f"| {name} | {100 * p.accuracy:.1f}% | [{100 * p.ci_low:.1f}, {100 * p.ci_high:.1f}] "
                         f"| {p.dollars:.6f} |")
        lines += ["", "| paired test | diff (points) | 95% CI | bootstrap p | McNemar b/c | McNemar p |",
                  "|---|---:|---:|---:|---:|---:|"]
        tests = [self.cross_fit_vs_best, self.cross_fit_vs_mix, self.any_correct_vs_best]
        tests += [self.policy_vs_best] if self.policy_vs_best is not None else []
        for t in tests:
            mc = ("-", "-") if t.p_mcnemar is None else (f"{t.mcnemar_b}/{t.mcnemar_c}", f"{t.p_mcnemar:.3g}")
            lines.append(f"| {t.candidate} vs {t.baseline} | {100 * t.diff:+.1f} | [{100 * t.ci_low:+.1f}, "
                         f"{100 * t.ci_high:+.1f}] | {t.p_bootstrap:.3g} | {mc[0]} | {mc[1]} |")
        lines += ["", "## Evidence", "", *(f"- {e}" for e in self.evidence), ""]
        r = self.router
        lines.append(f"Settings: {self.n_boot} bootstrap resamples over questions, seed {self.seed}, margin "
                     f"{100 * self.margin:.1f} points, alpha {self.alpha}; cross-fit router: {r.learner}, {r.folds} "
                     f"folds, features {r.features}, cost weight {r.cost_weight}.")
        lines += [f"Note: {n}" for n in self.notes]
        if plot:
            lines += ["", f"![accuracy vs dollars]({plot})"]
        return "\n".join(lines) + "\n"

    def plot(self, path: str | Path) -> Path:
        """Accuracy against dollars per question: the workers, the random-mix line, both oracles, the policy."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig, ax = plt.subplots(figsize=(7.5, 4.8))

        def mark(p: Point, color: str, marker: str, label: str, size: float = 40) -> None:
            err = [[max(p.accuracy - p.ci_low, 0.0)], [max(p.ci_high - p.accuracy, 0.0)]]
            ax.errorbar([p.dollars], [p.accuracy], yerr=err, fmt="none", ecolor=color, alpha=0.6, capsize=3)
            ax.scatter([p.dollars], [p.accuracy], s=size, color=color, marker=marker, zorder=3, label=label)

        for i, p in enumerate(self.workers):
            mark(p, f"C{i % 10}", "o", p.label + (" (best single)" if p.label == self.best_single else ""))
        (x0, y0), (x1, y1) = self.random_mix.endpoints
        ax.plot([x0, x1], [y0, y1], ls="--", color="grey", lw=1, label="random mix (cheapest / best)")
        acc = [p.accuracy for p in self.workers]
        dol = [p.dollars for p in self.workers]
        if max(dol) > min(dol):
            grid = np.linspace(min(dol), max(dol), 200)
            env = [_mix_accuracy(acc, best_mix_at_cost(acc, dol, float(g))) for g in grid]
            ax.plot(grid, env, ls=":", color="grey", lw=1, label="best random mix of two workers")
        mark(self.cross_fit, "black", "*", "cross-fit routing oracle", 140)
        mark(self.any_correct, "black", "^", "any-correct oracle (not reachable)", 70)
        if self.policy is not None:
            mark(self.policy, "crimson", "D", f"policy: {self.policy.label}", 60)
        xs = [p.dollars for p in (*self.workers, self.cross_fit, self.any_correct, *([self.policy] if self.policy else []))]
        top = max(xs, default=0.0)
        ax.set_xlim(0.0, top * 1.25 if top > 0 else 1.0)
        ax.set_ylim(-0.02, 1.05)
        ax.set_xlabel("dollars per question")
        ax.set_ylabel("accuracy (95% bootstrap interval)")
        ax.set_title(f"Headroom: {self.verdict} ({self.n_questions} questions)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        return save_figure(fig, path)

    def write(self, out_dir: str | Path) -> dict[str, Path]:
        """headroom.json, headroom.md and headroom.png in ``out_dir``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        png = self.plot(out / "headroom.png")
        md = atomic_write_text(out / "headroom.md", self.render_markdown("headroom.png"))
        js = atomic_write_text(out / "headroom.json", self.dumps())
        return {"json": js, "markdown": md, "plot": png}


def _no_nan(x: Any) -> Any:
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _no_nan(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_no_nan(v) for v in x]
    return x
