"""The morning-after report of a nightly run: what it did and why, how learning went, whether it promoted.

Plots (PNG): reward and accuracy over the night's iterations; accuracy against
dollars per question for the candidate, the champion and every single worker.
The lake report of the candidate's evaluation (worker usage by domain and step
position, workflow length by domain, failure taxonomy) is rendered beside it.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from conductor.files import atomic_write_text, save_figure


@dataclass
class Point:
    label: str
    accuracy: float | None
    dollars_per_question: float
    kind: str   # candidate | champion | worker


def plot_iterations(iterations: list[dict[str, Any]], path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = [it["iteration"] for it in iterations]
    for key, label in (("mean_reward", "mean reward"), ("accuracy", "accuracy")):
        ys = [it.get(key) for it in iterations]
        ax.plot(xs, [y if y is not None else float("nan") for y in ys], marker="o", label=label)
    ax.set_xlabel("iteration")
    ax.set_ylim(0, 1.05)
    ax.set_title("Rollouts over the night")
    ax.legend()
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_accuracy_vs_dollars(points: list[Point], path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    style = {"candidate": ("tab:red", "*", 180), "champion": ("tab:blue", "D", 80), "worker": ("tab:gray", "o", 50)}
    for p in points:
        if p.accuracy is None:
            continue
        color, marker, size = style[p.kind]
        ax.scatter([p.dollars_per_question], [p.accuracy], c=color, marker=marker, s=size)
        ax.annotate(p.label, (p.dollars_per_question, p.accuracy), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel("dollars per question")
    ax.set_ylabel("accuracy (held-out)")
    ax.set_ylim(-0.02, 1.05)
    ax.set_title("Accuracy vs cost: conductor vs single workers")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def render_nightly_report(out_dir: str | Path, *, pool_id: str, decision: dict[str, Any] | None,
                          why: str, iterations: list[dict[str, Any]], evaluation: dict[str, Any] | None,
                          points: list[Point], lake: str | None = None, eval_run: str | None = None,
                          stopped: str | None = None, headroom: dict[str, Any] | None = None) -> Path:
    """Write nightly.md (+ PNGs) and return its path. ``headroom``: the check run before training
    (``verdict_line``, ``evidence``; its own page and plot under ``headroom/``)."""
    from conductor.learning.evaluation import EvalReport

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# Nightly run report — pool {pool_id}", "", f"Generated {now}.", "", f"**What it did and why:** {why}", ""]
    if stopped:
        lines += [f"**Stopped early:** {stopped} (rerun the same night to resume).", ""]
    if headroom:
        lines += ["## Headroom check (before training)", "", f"**{headroom['verdict_line']}**", "",
                  *[f"- {e}" for e in headroom.get("evidence", [])], "",
                  "![headroom](headroom/headroom.png)", "", "Details: [headroom/headroom.md](headroom/headroom.md).", ""]
    if iterations:
        plot_iterations(iterations, out / "iterations.png")
        lines += ["## Iterations", "", "![reward and accuracy over iterations](iterations.png)", "",
                  "| iteration | rollout run | trajectories | mean reward | accuracy | loss | checkpoint |",
                  "|---|---|---|---|---|---|---|"]
        for it in iterations:
            lines.append(f"| {it['iteration']} | `{it['run_id']}` | {it.get('trajectories', '')} | {_f(it.get('mean_reward'))} "
                         f"| {_f(it.get('accuracy'))} | {_f(it.get('loss'))} | `{it.get('checkpoint_id', '')}` |")
        lines.append("")
    if points:
        plot_accuracy_vs_dollars(points, out / "accuracy_vs_dollars.png")
        lines += ["## Accuracy vs dollars per question", "", "![accuracy vs dollars](accuracy_vs_dollars.png)", "",
                  "| who | accuracy | $/question |", "|---|---|---|"]
        lines += [f"| {p.label} ({p.kind}) | {_f(p.accuracy)} | {p.dollars_per_question:.6f} |" for p in points]
        lines.append("")
    if evaluation:
        for name, rep in evaluation.items():
            lines += [f"## Evaluation ({name} pool)", "", "```", EvalReport.from_json(rep).render(), "```", ""]
    if decision is not None:
        verdict = "PROMOTED to champion" if decision.get("promote") else "recorded as challenger"
        lines += ["## Promotion decision", "", f"**{verdict}**: {decision.get('reason')}", "",
                  f"- candidate: `{decision.get('candidate_id')}`, champion before: `{decision.get('champion_id')}`",
                  f"- diff: {_f(decision.get('diff'))}, p-value: {_f(decision.get('p_value'))}",
                  f"- domain regressions beyond tolerance: {decision.get('regressions') or 'none'}", ""]
    if lake and eval_run:
        from conductor.lake.report import render_report

        sub = render_report(lake, out / "candidate-eval", run_id=eval_run, title="Candidate evaluation: lake report")
        lines += ["## Worker usage, workflow length, failures (candidate evaluation)", "",
                  f"See [candidate-eval/report.md]({sub.markdown.relative_to(out)}).", "",
                  "![worker usage](candidate-eval/worker_usage.png)", "",
                  "![workflow length](candidate-eval/workflow_length.png)", "",
                  "![failures](candidate-eval/failure_taxonomy.png)", ""]
    return atomic_write_text(out / "nightly.md", "\n".join(lines))


def _f(v: Any) -> str:
    return "" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v))


def _pyplot() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    return save_figure(fig, path)
