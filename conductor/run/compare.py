"""Strategies side by side, the paper's table shape, read from the lake.

Every strategy (the conductor, single workers, self-consistency, Mixture-of-Agents, random workflows) is an
ordinary run in one lake, so one function reads them all the same way: per dataset accuracy +/- s.e. (over
questions), the average over datasets, calls, tokens, dollars and seconds per question, and a paired test of
the conductor against the best single worker on the questions both answered (question-level paired bootstrap
and exact McNemar, ``conductor.stats.paired``). Seconds are the executed workflow's wall clock from the lake (the
conductor's own generation time is not recorded there). The plot puts every strategy at (cost, accuracy),
cost in dollars, or in seconds when every strategy was free.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import polars as pl

if TYPE_CHECKING:
    from conductor.stats.paired import EvalRow

CONDUCTOR = "conductor"
_COLUMNS = ("question_id", "dataset", "domain", "sample_index", "correct", "reward", "infra_failed", "parse_status",
            "n_calls", "tokens", "cost_usd", "wall_s", "conductor_s", "shard", "checkpoint_id", "run_id")


class CompareError(ValueError):
    """Runs that cannot be compared; the message is one line."""


def split_strategies(text: str) -> list[str]:
    """A comma-separated strategy list; a piece that starts with a digit continues the previous one, so the
    comma form of a Mixture-of-Agents spec survives, written in its canonical ``+`` form (labels stay comma-free).

    >>> split_strategies("conductor,fixed:0,moa:0,1,2:0,sc:1:5, random")
    ['conductor', 'fixed:0', 'moa:0+1+2:0', 'sc:1:5', 'random']
    """
    out: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        if piece[0].isdigit() and out:
            out[-1] += "+" + piece
        else:
            out.append(piece)
    return out


@dataclass(frozen=True)
class DatasetScore:
    accuracy: float
    se: float
    n_questions: int


@dataclass(frozen=True)
class StrategyRow:
    label: str
    run_id: str
    checkpoint_id: str
    n_questions: int
    datasets: dict[str, DatasetScore]
    average: float                # mean over datasets of each dataset's accuracy
    average_se: float             # sqrt(sum se_d^2) / D
    calls: float                  # per question (all samples of a question count)
    tokens: float
    dollars: float
    seconds: float
    parse_failures: int
    infra_failures: int


@dataclass(frozen=True)
class PairedTest:
    conductor: str
    baseline: str
    n_questions: int
    diff: float                   # conductor - baseline, mean over shared questions
    ci_low: float
    ci_high: float
    p_bootstrap: float            # one-sided: the conductor is better
    mcnemar_b: int                # questions the conductor gets right and the baseline wrong
    mcnemar_c: int
    p_mcnemar: float              # exact, one-sided
    p_mcnemar_two_sided: float

    def in_words(self) -> str:
        """What the paired test says, in words, with the number of questions a difference of this size needs.

        >>> PairedTest("conductor", "fixed:1", 10, -0.1, -0.4, 0.2, 0.8, 1, 2, 0.9, 1.0).in_words()
        'In words: conductor and fixed:1 are not distinguishable at 10 questions (-10.0 points, 95% CI [-40.0, +20.0]); telling a 10-point difference from none would take about 90 questions at this spread.'
        >>> PairedTest("conductor", "fixed:1", 60, 0.12, 0.02, 0.22, 0.01, 9, 2, 0.03, 0.06).in_words()
        'In words: conductor is better than fixed:1 on these 60 questions (+12.0 points, 95% CI [+2.0, +22.0] excludes 0).'
        """
        span = f"{100 * self.diff:+.1f} points, 95% CI [{100 * self.ci_low:+.1f}, {100 * self.ci_high:+.1f}]"
        n = self.n_questions
        if self.ci_low > 0 or self.ci_high < 0:
            better = "better" if self.ci_low > 0 else "worse"
            return f"In words: {self.conductor} is {better} than {self.baseline} on these {n} questions ({span} excludes 0)."
        gap = max(abs(self.diff), 0.05)          # the difference seen, or 5 points when there is none
        half = (self.ci_high - self.ci_low) / 2
        needed = math.ceil(round(n * (half / gap) ** 2, 6)) if half > 0 else n
        return (f"In words: {self.conductor} and {self.baseline} are not distinguishable at {n} questions ({span}); "
                f"telling a {100 * gap:.0f}-point difference from none would take about {needed} questions at "
                "this spread.")


@dataclass
class Comparison:
    rows: list[StrategyRow]
    datasets: list[str]
    best_single: str | None = None
    paired: PairedTest | None = None
    cost_axis: Literal["dollars", "seconds"] = "dollars"
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (NaN, an accuracy with nothing graded, becomes null)."""
        return _no_nan(asdict(self))

    def render(self, markdown: bool = False) -> str:
        """The table (plain text for the terminal, or markdown), then the paired test."""
        head = ["strategy", *self.datasets, "average", "calls/q", "tokens/q", "$/q", "s/q", "failures"]
        body = []
        for r in self.rows:
            cells = [_label(r, self.best_single)]
            cells += [_pm(r.datasets[d]) if d in r.datasets else "-" for d in self.datasets]
            cells += [f"{100 * r.average:.1f} ± {100 * r.average_se:.1f}", f"{r.calls:.2f}", f"{r.tokens:.0f}",
                      f"{r.dollars:.5f}", f"{r.seconds:.2f}", f"{r.parse_failures}p/{r.infra_failures}i"]
            body.append(cells)
        lines = _markdown_table(head, body) if markdown else _text_table(head, body)
        lines.append("")
        lines.append(self.paired_line())
        if self.paired is not None:
            lines.append(self.paired.in_words())
        lines += self.notes
        return "\n".join(lines)

    def paired_line(self) -> str:
        p = self.paired
        if p is None:
            return "paired test: needs a conductor run and at least one single-worker (fixed:i) run"
        return (f"paired test, {p.conductor} vs best single worker {p.baseline} on {p.n_questions} shared questions: "
                f"diff {100 * p.diff:+.1f} points, 95% CI [{100 * p.ci_low:+.1f}, {100 * p.ci_high:+.1f}], "
                f"bootstrap p={p.p_bootstrap:.4g}; McNemar exact b={p.mcnemar_b} c={p.mcnemar_c} "
                f"p={p.p_mcnemar:.4g} (two-sided {p.p_mcnemar_two_sided:.4g})")


def _no_nan(x: Any) -> Any:
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _no_nan(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_no_nan(v) for v in x]
    return x


def _pm(s: DatasetScore) -> str:
    return "n/a" if math.isnan(s.accuracy) else f"{100 * s.accuracy:.1f} ± {100 * s.se:.1f}"


def _label(r: StrategyRow, best: str | None) -> str:
    return r.label + (" (best single)" if r.label == best else "")


def _text_table(head: list[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    fmt = lambda row: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))  # noqa: E731
    return [fmt(head), "-" * (sum(widths) + 2 * (len(widths) - 1)), *(fmt(r) for r in body)]


def _markdown_table(head: list[str], body: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|",
            *("| " + " | ".join(r) + " |" for r in body)]


# ------------------------------------------------------------------ reading runs

def run_frame(lake: str, run_id: str, kind: str = "answer") -> pl.DataFrame:
    """One run's trajectories (the columns the comparison needs), one row per trajectory: a question a resumed run
    retried after an infrastructure failure counts once, by its successful attempt (``current_rows``)."""
    from conductor.lake.reader import scan
    from conductor.lake.resume import current_rows

    rows = current_rows(scan(lake, "trajectories", kind=kind, run_id=run_id).select("trajectory_id", *_COLUMNS))
    return rows.drop("trajectory_id").collect()


def answer_runs(lake: str, kind: str = "answer") -> list[tuple[str, str]]:
    """(checkpoint id, run id) of every run of ``kind`` in the lake, oldest partition first."""
    from conductor.lake.reader import scan

    df = (scan(lake, "trajectories", kind=kind).select("run_id", "checkpoint_id", "date")
          .unique().sort(["date", "run_id"]).collect())
    return [(r["checkpoint_id"] or r["run_id"], r["run_id"]) for r in df.iter_rows(named=True)]


def _eval_rows(df: pl.DataFrame) -> list[EvalRow]:
    """EvalRows paired on (dataset, question): two datasets may reuse a question id."""
    from conductor.stats.paired import to_rows

    rows = df.with_columns((pl.col("dataset") + "\x1f" + pl.col("question_id")).alias("question_id")).to_dicts()
    return to_rows(rows)


def elapsed_seconds(df: pl.DataFrame) -> float:
    """Seconds a run took, estimated from the lake when it was not measured: per shard, its conductor
    generation plus its slowest workflow (a shard's workflows run concurrently, so their wall clocks overlap
    and must not be added), summed over shards. An upper bound when the conductor worked ahead of the workers
    on whole shards; with one question per piece (the embedded conductor) it undercounts, since the pieces of
    a shard execute one after another.

    >>> elapsed_seconds(pl.DataFrame({"shard": ["a", "a", "b"], "wall_s": [3.0, 5.0, 2.0],
    ...                               "conductor_s": [1.0, 1.0, None]}))
    9.0
    """
    per = df.group_by("shard").agg((pl.col("conductor_s").fill_null(0).sum() + pl.col("wall_s").max()).alias("s"))
    return float(per["s"].sum())


def strategy_row(label: str, df: pl.DataFrame, elapsed_s: float | None = None) -> StrategyRow:
    """One strategy's line of the table from its (non-empty) run frame; ``elapsed_s``: the run's measured wall
    seconds, else estimated from the lake (``elapsed_seconds``)."""
    from conductor.stats.paired import question_mean_se

    datasets: dict[str, DatasetScore] = {}
    for (name,), part in sorted(df.group_by(["dataset"]), key=lambda kv: str(kv[0][0])):
        acc, se = question_mean_se(_eval_rows(part), "correct")
        datasets[str(name)] = DatasetScore(acc, se, part["question_id"].n_unique())
    scored = [d for d in datasets.values() if not math.isnan(d.accuracy)]
    avg = sum(d.accuracy for d in scored) / len(scored) if scored else float("nan")
    avg_se = math.sqrt(sum(d.se ** 2 for d in scored)) / len(scored) if scored else float("nan")
    nq = sum(d.n_questions for d in datasets.values())
    first = df.row(0, named=True)
    return StrategyRow(
        label=label, run_id=str(first["run_id"]), checkpoint_id=str(first["checkpoint_id"] or ""),
        n_questions=nq, datasets=datasets, average=avg, average_se=avg_se,
        calls=float(df["n_calls"].sum()) / nq, tokens=float(df["tokens"].sum()) / nq,
        dollars=float(df["cost_usd"].sum()) / nq,
        seconds=(elapsed_s if elapsed_s is not None else elapsed_seconds(df)) / nq,
        parse_failures=int((df["parse_status"] != "ok").sum()), infra_failures=int(df["infra_failed"].sum()))


def paired_test(conductor: tuple[str, pl.DataFrame], baseline: tuple[str, pl.DataFrame], n_boot: int = 10_000,
                seed: int = 0) -> PairedTest:
    """Question-level paired bootstrap and exact McNemar (one pair per question) on the shared questions."""
    from conductor.stats.paired import mcnemar, paired_bootstrap, question_scores

    a, b = _eval_rows(conductor[1]), _eval_rows(baseline[1])
    bs = paired_bootstrap(question_scores(a, "correct"), question_scores(b, "correct"), n_boot=n_boot, seed=seed)
    mc = mcnemar(a, b)
    return PairedTest(conductor[0], baseline[0], bs.n_questions, bs.diff, bs.ci_low, bs.ci_high, bs.p_value,
                      mc.b, mc.c, mc.p_value, mc.p_two_sided)


def compare_runs(lake: str, runs: list[tuple[str, str]], *, kind: str = "answer", conductor: str = CONDUCTOR,
                 n_boot: int = 10_000, seed: int = 0, elapsed: dict[str, float] | None = None) -> Comparison:
    """The comparison of ``runs`` ((label, run id) pairs) in ``lake``; the run labelled ``conductor`` is tested
    against the best ``fixed:i`` run. ``elapsed``: measured wall seconds of runs (by run id), used for their
    seconds per question instead of the lake's estimate."""
    if not runs:
        raise CompareError(f"lake {lake}: no runs to compare")
    frames: dict[str, pl.DataFrame] = {}
    for label, run_id in runs:
        df = run_frame(lake, run_id, kind)
        if df.height == 0:
            raise CompareError(f"lake {lake}: run {run_id} ({label}) has no {kind} trajectories")
        frames[label] = df
    elapsed = elapsed or {}
    rows = [strategy_row(label, df, elapsed.get(run_id)) for (label, df), (_, run_id) in zip(frames.items(), runs)]
    datasets = sorted({d for r in rows for d in r.datasets})
    from conductor.policy.spec import is_single_worker
    singles = [r for r in rows if is_single_worker(r.label) and not math.isnan(r.average)]
    best = max(singles, key=lambda r: r.average).label if singles else None   # max keeps the first of ties
    paired = None
    if best is not None and conductor in frames:
        paired = paired_test((conductor, frames[conductor]), (best, frames[best]), n_boot, seed)
    axis: Literal["dollars", "seconds"] = "dollars" if any(r.dollars > 0 for r in rows) else "seconds"
    measured = "measured run wall clock, start-up included" if all(r.run_id in elapsed for r in rows) else (
        "measured run wall clock where compare ran the strategy now, else the lake's estimate: per shard, the "
        "conductor's generation plus its slowest concurrent workflow")
    notes = [f"accuracy ± s.e. over questions, in percent; s/q is elapsed seconds per question ({measured}); "
             "failures: unparseable p / infrastructure i."]
    return Comparison(rows, datasets, best, paired, axis, notes)


# ------------------------------------------------------------------ outputs

def write_outputs(comparison: Comparison, out_dir: str | Path, title: str = "Strategy comparison") -> dict[str, Path]:
    """compare.md (table, paired test, plot), compare.json and compare.png in ``out_dir`` (atomic writes)."""
    from conductor.files import atomic_write_text
    from conductor.lake.report import plot_cost_points

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    axis = comparison.cost_axis
    points = [(r.label, r.dollars if axis == "dollars" else r.seconds, r.average, r.n_questions)
              for r in comparison.rows if not math.isnan(r.average)]
    xlabel = "dollars per question" if axis == "dollars" else "seconds per question (conductor + workflow; all free)"
    png = plot_cost_points(points, out / "compare.png", xlabel=xlabel, title=f"{title}: accuracy vs {axis}")
    md = atomic_write_text(out / "compare.md", f"# {title}\n\n{comparison.render(markdown=True)}\n\n"
                                               f"![accuracy vs {axis}](compare.png)\n")
    js = atomic_write_text(out / "compare.json", json.dumps(comparison.to_json(), indent=2, default=str) + "\n")
    return {"markdown": md, "json": js, "plot": png}
