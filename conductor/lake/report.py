"""A markdown report with PNG plots over the standard questions (reused by the nightly report).

Plots: accuracy vs dollars per question, workflow length by domain, worker usage
by domain and by step position, and the failure taxonomy. Rendered with
matplotlib's Agg backend so it runs headless.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import polars as pl

from conductor.files import atomic_write_text, save_figure
from conductor.lake.queries import standard_report
from conductor.lake.reader import Lake, open_lake

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


@dataclass
class Report:
    markdown: Path
    plots: dict[str, Path] = field(default_factory=dict)
    tables: dict[str, pl.DataFrame] = field(default_factory=dict)
    skipped_files: list[str] = field(default_factory=list)


def _pyplot() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Figure, path: Path, bottom: float = 0.0) -> Path:
    fig.tight_layout(rect=(0, bottom, 1, 1))
    return save_figure(fig, path, close=False)   # the callers close it


def cost_axis_limits(costs: list[float]) -> tuple[float, float]:
    """The cost axis: from 0 to a quarter past the dearest point (room for labels); (0, 1) when all are free.

    >>> cost_axis_limits([0.0, 0.0]), cost_axis_limits([0.002, 0.004])
    ((0.0, 1.0), (0.0, 0.005))
    """
    top = max(costs, default=0.0)
    return 0.0, (top * 1.25 if top > 0 else 1.0)


def point_labels(df: pl.DataFrame) -> list[str]:
    """One label per row of an accuracy-vs-cost table: the columns that tell the points apart.

    >>> point_labels(pl.DataFrame({"run_id": ["r1", "r2"], "checkpoint_id": ["fixed:0", "sc:0:5"], "dataset": ["g", "g"]}))
    ['fixed:0', 'sc:0:5']
    >>> point_labels(pl.DataFrame({"run_id": ["r1", "r1"], "checkpoint_id": ["c", "c"], "dataset": ["gsm8k", "mmlu"]}))
    ['gsm8k', 'mmlu']
    """
    cols: list[str] = [c for c in ("checkpoint_id", "run_id", "dataset") if c in df.columns and df[c].n_unique() > 1]
    if "checkpoint_id" in cols and "run_id" in cols:
        cols.remove("run_id")
    if not cols:
        first = next((c for c in ("checkpoint_id", "dataset") if c in df.columns), None)
        cols = [first] if first else []
    return [" / ".join(str(r[c]) for c in cols) for r in df.iter_rows(named=True)]


def plot_cost_points(points: list[tuple[str, float, float, int]], path: Path, *, xlabel: str,
                     title: str = "Accuracy vs cost") -> Path:
    """One labelled point per (label, cost, accuracy, n questions); the cost axis starts at 0 (costs are never
    negative, and a lone free point must not sit mid-axis between negative and positive dollars)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (label, x, y, n) in enumerate(points):
        ax.scatter([x], [y], s=20 + 4 * max(n, 0) ** 0.5, color=f"C{i % 10}", zorder=3)
        ax.annotate(label, (x, y), fontsize=7, xytext=(4, 4), textcoords="offset points")
    ax.set_xlim(*cost_axis_limits([x for _, x, _, _ in points]))
    ax.set_ylim(-0.02, 1.05)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("accuracy")
    ax.set_title(title + ("" if points else " (no graded runs)"))
    ax.grid(alpha=0.3)
    out = _save(fig, path)
    plt.close(fig)
    return out


def plot_accuracy_vs_cost(df: pl.DataFrame, path: Path) -> Path:
    """Accuracy against dollars per question, or against seconds when every point was free; each point is
    labelled by what differs between the points (checkpoint or run, and dataset)."""
    df = df.filter(pl.col("accuracy").is_not_null())
    free = df.height == 0 or float(df["dollars_per_question"].fill_null(0).max()) <= 0  # type: ignore[arg-type]
    xcol = "seconds_per_question" if free and "seconds_per_question" in df.columns else "dollars_per_question"
    points = [(label, float(r[xcol] or 0.0), float(r["accuracy"]), int(r["n_questions"]))
              for label, r in zip(point_labels(df), df.iter_rows(named=True))]
    xlabel = ("seconds per question (workflow wall clock; every call was free)" if xcol == "seconds_per_question"
              else "dollars per question (mean over samples)")
    return plot_cost_points(points, path, xlabel=xlabel,
                            title="Accuracy vs " + ("seconds" if xcol == "seconds_per_question" else "cost"))


def plot_workflow_length(df: pl.DataFrame, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups = df.get_column(df.columns[0]).unique().sort().to_list() if df.height else []
    lengths = sorted(df.get_column("n_steps").unique().to_list()) if df.height else []
    width = 0.8 / max(len(lengths), 1)
    for j, n in enumerate(lengths):
        sub = {r[df.columns[0]]: r["share"] for r in df.filter(pl.col("n_steps") == n).iter_rows(named=True)}
        ax.bar([i + j * width for i in range(len(groups))], [sub.get(g, 0.0) for g in groups], width,
               label=f"{n} step{'s' if n != 1 else ''}")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))], groups)
    ax.set_ylabel("share of parsed workflows")
    ax.set_title("Workflow length by domain")
    if lengths:
        fig.legend(loc="lower center", ncol=len(lengths), fontsize=8)
    out = _save(fig, path, bottom=0.08 if lengths else 0.0)
    plt.close(fig)
    return out


def _stacked_shares(ax: Axes, df: pl.DataFrame, key: str, title: str) -> None:
    groups = df.get_column(key).unique().sort().to_list() if df.height else []
    workers = sorted(df.get_column("worker").unique().to_list()) if df.height else []
    bottom = [0.0] * len(groups)
    for w in workers:
        sub = {r[key]: r["share"] for r in df.filter(pl.col("worker") == w).iter_rows(named=True)}
        vals = [sub.get(g, 0.0) for g in groups]
        ax.bar([str(g) for g in groups], vals, bottom=bottom, label=w)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_title(title)
    ax.set_ylabel("share of calls")
    ax.set_ylim(0, 1)


def plot_worker_usage(by_domain: pl.DataFrame, by_step: pl.DataFrame, path: Path) -> Path:
    plt = _pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.5))
    _stacked_shares(a, by_domain, "domain", "Worker usage by domain")
    _stacked_shares(b, by_step, "step", "Worker usage by step position")
    handles, labels = a.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8)
    out = _save(fig, path, bottom=0.1 if handles else 0.0)
    plt.close(fig)
    return out


def plot_failures(df: pl.DataFrame, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, max(2.5, 0.35 * df.height + 1.2)))
    labels = [f"{r['source']}: {r['cls']}" for r in df.iter_rows(named=True)]
    sources = sorted(set(df.get_column("source").to_list())) if df.height else []
    palette = {s: f"C{i}" for i, s in enumerate(sources)}
    ax.barh(labels, df.get_column("n").to_list() if df.height else [],
            color=[palette[s] for s in df.get_column("source").to_list()] if df.height else None)
    ax.invert_yaxis()
    ax.set_xlabel("count")
    ax.set_title("Failure taxonomy" + ("" if df.height else " (no failures)"))
    out = _save(fig, path)
    plt.close(fig)
    return out


def _md_table(df: pl.DataFrame, max_rows: int = 30) -> str:
    if df.height == 0:
        return "_(no rows)_\n"
    with pl.Config(tbl_formatting="MARKDOWN", tbl_hide_column_data_types=True, tbl_hide_dataframe_shape=True,
                   tbl_rows=max_rows, tbl_cols=-1, tbl_width_chars=400, fmt_str_lengths=60, float_precision=4):
        return str(df.head(max_rows)) + ("\n" if df.height <= max_rows else f"\n\n_{df.height - max_rows} more rows_\n")


_TITLES = {
    "accuracy_by_dataset": "Accuracy and reward by dataset",
    "accuracy_by_pool": "Accuracy by pool",
    "accuracy_by_checkpoint": "Accuracy by checkpoint",
    "accuracy_by_worker": "Accuracy of trajectories using each worker",
    "cost_per_question": "Calls, tokens and dollars per question (most expensive first)",
    "worker_usage_by_domain": "Worker usage by domain",
    "worker_usage_by_step": "Worker usage by step position (root workflow)",
    "workflow_length_by_domain": "Workflow length by domain",
    "failure_taxonomy": "Failure taxonomy",
    "accuracy_vs_cost": "Accuracy vs dollars per question",
}


def render_report(lake: str | Lake, out_dir: str | Path, *, run_id: str | None = None,
                  kind: str | None = None, title: str = "Trajectory lake report") -> Report:
    """Write ``report.md`` and the PNGs into ``out_dir``; return their paths and the tables."""
    lk = open_lake(lake)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tables = standard_report(lk, run_id=run_id, kind=kind)
    plots = {
        "accuracy_vs_cost": plot_accuracy_vs_cost(tables["accuracy_vs_cost"], out / "accuracy_vs_cost.png"),
        "workflow_length": plot_workflow_length(tables["workflow_length_by_domain"], out / "workflow_length.png"),
        "worker_usage": plot_worker_usage(tables["worker_usage_by_domain"], tables["worker_usage_by_step"],
                                          out / "worker_usage.png"),
        "failure_taxonomy": plot_failures(tables["failure_taxonomy"], out / "failure_taxonomy.png"),
    }
    scope = ", ".join(f"{k}={v}" for k, v in (("run_id", run_id), ("kind", kind)) if v) or "whole lake"
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# {title}", "", f"Lake `{lk.url}`, scope: {scope}, generated {now}.", ""]
    if lk.skipped:
        lines += ["**Skipped corrupt files:** " + ", ".join(f"`{s}`" for s in lk.skipped), ""]
    lines += ["![accuracy vs cost](accuracy_vs_cost.png)", "", "![workflow length](workflow_length.png)", "",
              "![worker usage](worker_usage.png)", "", "![failures](failure_taxonomy.png)", ""]
    for name, df in tables.items():
        lines += [f"## {_TITLES.get(name, name)}", "", _md_table(df), ""]
    md = atomic_write_text(out / "report.md", "\n".join(lines))
    return Report(md, plots, tables, list(lk.skipped))
