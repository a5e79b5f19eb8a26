"""The workflow replay's figures: a strategy's point (accuracy, s.e., seconds and dollars per question), the
Markdown table beside the plot, and the plot (accuracy against recorded seconds and against dollars)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conductor.data.questions import Question


@dataclasses.dataclass
class Outcome:
    """One strategy on one question, replayed: right or not, and what it cost."""

    correct: bool
    seconds: float       # the recorded wall time of its calls (and of the conductor's generation)
    dollars: float       # local seconds at the manifest's per_second, recorded replies at their token prices
    infra: bool = False


@dataclasses.dataclass(frozen=True)
class Point:
    label: str
    accuracy: float
    se: float
    seconds: float
    dollars: float
    n: int


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def se(xs: Sequence[float]) -> float:
    """The standard error of the mean (nan under two values).

    >>> round(se([1.0, 0.0, 1.0, 0.0]), 4), se([1.0])
    (0.2887, nan)
    """
    n = len(xs)
    if n < 2:
        return float("nan")
    m = mean(xs)
    return (sum((x - m) ** 2 for x in xs) / (n - 1) / n) ** 0.5


def point(label: str, rows: dict[str, Outcome], qids: Sequence[str]) -> Point:
    """``rows`` over ``qids``, the questions it has no infrastructure failure on.

    >>> point("x", {"a": Outcome(True, 2.0, 0.1), "b": Outcome(False, 4.0, 0.3), "c": Outcome(True, 9, 9, True)},
    ...       ["a", "b", "c", "d"])
    Point(label='x', accuracy=0.5, se=0.5, seconds=3.0, dollars=0.2, n=2)
    """
    got = [rows[q] for q in qids if q in rows and not rows[q].infra]
    acc = [float(o.correct) for o in got]
    return Point(label, mean(acc), se(acc), mean([o.seconds for o in got]), mean([o.dollars for o in got]), len(got))


def paired_difference(a: dict[str, Outcome], b: dict[str, Outcome], qids: Sequence[str]) -> tuple[float, float]:
    """Mean and standard error of (a right) - (b right) over the questions both replayed (paired, per question).

    >>> ok, no = Outcome(True, 1.0, 0.0), Outcome(False, 1.0, 0.0)
    >>> paired_difference({"x": ok, "y": ok}, {"x": no, "y": ok}, ["x", "y"])
    (0.5, 0.5)
    """
    diffs = [float(a[q].correct) - float(b[q].correct) for q in qids
             if q in a and q in b and not a[q].infra and not b[q].infra]
    return mean(diffs), se(diffs)


def progress_table(results: dict[str, dict[str, Outcome]], questions: Sequence[Question], entries: Sequence[str],
                   baseline: str = "fixed:0") -> str:
    """The recording so far, as Markdown: each entry and the default per dataset on every question all of them
    replay (every split: a description of the recording, not a held-out result), the paired difference to
    ``baseline``, and the any-correct oracle over the entries (the headroom a per-question choice could reach)."""
    lines = []
    for name, qs in (("GSM8K", [q for q in questions if q.domain == "math"]),
                     ("MMLU-STEM", [q for q in questions if q.domain != "math"]), ("all", list(questions))):
        ids = [q.id for q in qs]
        if not ids:
            continue
        lines += [f"{name}: {len(ids)} questions", "",
                  f"| strategy | accuracy ± s.e. | seconds/q | minus {baseline} (paired) |", "|---|---:|---:|---:|"]
        for key in [*entries, "default"]:
            p = point(key, results[key], ids)
            d, d_se = paired_difference(results[key], results[baseline], ids)
            lines.append(f"| {key} | {p.accuracy:.3f} ± {p.se:.3f} | {p.seconds:.1f} | {d:+.3f} ± {d_se:.3f} |")
        oracle = mean([float(any(results[k][q].correct for k in entries)) for q in ids])
        lines += [f"| any-correct oracle over the entries | {oracle:.3f} | | |", ""]
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Figures:
    """Every point of one replay, for the table and the plot."""

    entries: dict[str, Point]
    default: Point
    oracle: Point
    trained: dict[str, Point]
    chosen_by: dict[str, dict[str, str]]
    by_split: dict[str, list[Question]]
    cascade: Point
    gpt4: Point
    mixtral: Point
    val_best: str
    paired: tuple[int, int, float]
    pair: Point                       # the two-answer hybrid cascade (1.5B CoT + Mixtral)
    escalated: dict[str, Escalation]  # each hybrid cascade's decisions, by its label


@dataclasses.dataclass(frozen=True)
class Escalation:
    """A cascade's decisions on the test questions: how many went up to GPT-4, how many of the accepted cheap
    answers were right, and the share of its dollars spent on local compute."""

    questions: int
    escalated: int
    accepted_right: int
    local_share: float

    def line(self, label: str) -> str:
        accepted = self.questions - self.escalated
        return (f"{label}: escalated {self.escalated} of {self.questions} to GPT-4; accepted answers right "
                f"{self.accepted_right} of {accepted}; local compute {self.local_share:.0%} of its dollars")


def report(out: Path, f: Figures) -> None:
    """The table (printed and as Markdown beside the plot) and the plot: accuracy against seconds and dollars."""
    out.mkdir(parents=True, exist_ok=True)
    by_split = f.by_split
    lines = [f"test: {len(by_split['test'])} questions ({sum(q.domain == 'math' for q in by_split['test'])} GSM8K); "
             f"train {len(by_split['train'])}, validation {len(by_split['validation'])}",
             "| strategy | accuracy | s.e. | seconds/q | $/q | n |", "|---|---:|---:|---:|---:|---:|"]
    for p in [*f.entries.values(), f.default, *f.trained.values(), f.oracle]:
        lines.append(f"| {p.label} | {p.accuracy:.3f} | {p.se:.3f} | {p.seconds:.1f} | {p.dollars:.6f} | {p.n} |")
    lines += ["", "GSM8K test only (the hybrid pool):", "| strategy | accuracy | s.e. | $/q | n |", "|---|---:|---:|---:|---:|"]
    for p in (f.cascade, f.pair, f.gpt4, f.mixtral):
        lines.append(f"| {p.label} | {p.accuracy:.3f} | {p.se:.3f} | {p.dollars:.6f} | {p.n} |")
    lines += [e.line(label) for label, e in f.escalated.items()]
    lines.append(f"\nbest single entry on validation: {f.val_best}; trained vs it on test: trained-only right "
                 f"{f.paired[0]}, entry-only right {f.paired[1]}, exact McNemar p (two-sided) = {f.paired[2]:.4f}")
    domain = {q.id: q.domain for q in by_split["test"]}
    for lam, chosen in f.chosen_by.items():
        per = {d: Counter(c for q, c in chosen.items() if domain[q] == d) for d in sorted(set(domain.values()))}
        lines.append(f"trained lambda={lam}: chose " + "; ".join(
            f"{d}: " + ", ".join(f"{c} {n}" for c, n in cnt.most_common()) for d, cnt in per.items()))
    text = "\n".join(lines)
    print(text, flush=True)
    (out / "workflow_replay.md").write_text(text + "\n")
    plot(out / "workflow_replay.png", f)


def plot(path: Path, f: Figures) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    for p in f.entries.values():
        ax1.errorbar(p.seconds, p.accuracy, yerr=p.se, fmt="o", color="#6baed6", capsize=3)
        ax1.annotate(p.label, (p.seconds, p.accuracy), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax1.errorbar(f.default.seconds, f.default.accuracy, yerr=f.default.se, fmt="s", color="#fd8d3c", capsize=3,
                 label="untrained default (conductor)")
    greens = iter(("#31a354", "#74c476", "#006d2c", "#a1d99b"))
    for key, p in f.trained.items():   # the hybrid menu is GSM8K-only, priced in dollars: the right panel
        (ax2 if key == "hybrid" else ax1).errorbar(p.dollars if key == "hybrid" else p.seconds, p.accuracy,
                                                   yerr=p.se, fmt="*", ms=12, color=next(greens), capsize=3,
                                                   label=p.label)
    ax1.axhline(f.oracle.accuracy, ls="--", color="grey", label=f"any-correct oracle {f.oracle.accuracy:.3f}")
    ax1.set_xlabel("recorded seconds per question (2-core CPU)")
    ax1.set_ylabel("accuracy (test)")
    ax1.set_title("menu entries, default and trained conductor (all test questions)")
    ax1.legend(fontsize=8, loc="lower right")
    for p, color in ((f.cascade, "#e6550d"), (f.pair, "#fdae6b"), (f.gpt4, "#756bb1"), (f.mixtral, "#9e9ac8")):
        ax2.errorbar(p.dollars, p.accuracy, yerr=p.se, fmt="o", color=color, capsize=3, label=p.label)
    for k, p in enumerate(f.entries.values()):
        ax2.scatter(p.dollars, p.accuracy, color="#6baed6", s=12,
                    label="local menu entries (all test questions)" if k == 0 else None)
    ax2.set_xscale("log")
    ax2.set_xlabel("dollars per question (log; local seconds at the manifest's per_second)")
    ax2.set_title("GSM8K test: the hybrid cascades against GPT-4 alone")
    ax2.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
