"""What a finished run says to the person who started it: answers, accuracy, cost, failures.

Read back from the lake (not from memory), so a resumed run summarises every
shard, including the ones an earlier process committed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import polars as pl

from conductor.files import atomic_write_text

# Exit codes of commands that answer questions (docs/operations.md).
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INFRA, EXIT_PARTIAL = 0, 1, 2, 3, 4

_WHERE = ("answers", "report", "lake", "answered_now", "written_now")   # set after the summary is read


@dataclass(frozen=True)
class RunSummary:
    """Headline figures of one run, read back from the lake; summary.json is ``to_json()``.

    The last five fields say where the run's outputs went and what this process did; each is left out of
    ``to_json()`` while unset, so summary.json keeps the shape it always had."""

    run_id: str
    questions: int = 0
    trajectories: int = 0
    graded: int = 0
    accuracy: float | None = None               # of the graded trajectories (gold answer, no infra failure)
    mean_reward: float | None = None
    parse_failures: int = 0
    infra_failures: int = 0
    calls_per_question: float = 0.0
    cache_hits: int = 0
    tokens_per_question: float = 0.0
    dollars_per_question: float = 0.0
    mean_workflow_length: float | None = None   # steps, over the workflows that parsed
    workflow_length_histogram: dict[int, int] = field(default_factory=dict)
    accuracy_by_dataset: dict[str, float | None] = field(default_factory=dict)
    wall_s_per_trajectory: float | None = None
    missing: int = 0                            # trajectories of the current input with no row yet
    superseded: int = 0                         # older rows of this run kept as history
    infra_failed_questions: int = 0
    infra_causes: dict[str, int] = field(default_factory=dict)   # the most common, first line each
    # worker -> [calls, questions whose workflow called it], most called first: which workers the conductor chose
    workers_used: dict[str, list[int]] = field(default_factory=dict)
    answers: str | None = None                  # answers.jsonl
    report: str | None = None                   # the report's markdown
    lake: str | None = None
    answered_now: int | None = None             # questions this process answered (the rest were resumed)
    written_now: int | None = None              # trajectories this process wrote

    @property
    def complete(self) -> bool:
        """Every question of the input has an answer that did not fail on infrastructure."""
        return not self.infra_failed_questions and not self.missing

    @property
    def dollars(self) -> float:
        """What the run's answers cost in all."""
        return self.dollars_per_question * self.questions

    def with_outputs(self, **where: Any) -> RunSummary:
        """The same figures with where the outputs went (``answers``, ``report``, ``lake``) or what this
        process did (``answered_now``, ``written_now``)."""
        unknown = set(where) - set(_WHERE)
        if unknown:
            raise TypeError(f"not an output of a run: {sorted(unknown)}")
        return replace(self, **where)

    def to_json(self) -> dict[str, Any]:
        """The summary.json mapping: the figures, then the outputs that are set."""
        d = asdict(self)
        return {k: v for k, v in d.items() if k not in _WHERE or v is not None}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RunSummary:
        """A summary.json read back (unknown keys ignored; histogram keys are ints again)."""
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        if "workflow_length_histogram" in kw:
            kw["workflow_length_histogram"] = {int(k): int(v) for k, v in kw["workflow_length_histogram"].items()}
        return cls(**kw)

    def outcome(self) -> tuple[int, str | None]:
        """(exit code, one-line cause or None): 3 when no question got an answer because of infrastructure,
        4 when some did not (a rerun retries exactly those), 0 otherwise.

        >>> RunSummary("r", questions=4).outcome()
        (0, None)
        >>> RunSummary("r", questions=4, infra_failed_questions=4, infra_causes={"missing_key: X": 4}).outcome()
        (3, '4 of 4 questions failed on infrastructure (missing_key: X x4); rerun the same command to retry them')
        """
        failed, missing = self.infra_failed_questions, self.missing
        if not failed and not missing:
            return EXIT_OK, None
        causes = "; ".join(f"{c} x{n}" for c, n in self.infra_causes.items())
        parts = []
        if failed:
            parts.append(f"{failed} of {self.questions} questions failed on infrastructure"
                         + (f" ({causes})" if causes else ""))
        if missing:
            parts.append(f"{missing} trajectories were not attempted")
        code = EXIT_INFRA if failed >= self.questions else EXIT_PARTIAL
        return code, "; ".join(parts) + "; rerun the same command to retry them"

    def render(self) -> str:
        """A short human-readable block for the terminal."""
        acc = "n/a (no gold answers)" if self.accuracy is None else f"{self.accuracy:.1%} of {self.graded} graded"
        mwl = "n/a" if self.mean_workflow_length is None else f"{self.mean_workflow_length:.2f} steps"
        return "\n".join([
            f"run {self.run_id}: {self.questions} questions, {self.trajectories} trajectories",
            f"  accuracy            {acc}",
            f"  mean reward         {self.mean_reward}",
            f"  workflow length     {mwl}  histogram {self.workflow_length_histogram}",
            f"  calls / question    {self.calls_per_question:.2f}  (cache hits {self.cache_hits})",
            f"  dollars / question  ${self.dollars_per_question:.6f}",
            f"  failures            {self.parse_failures} unparseable, {self.infra_failures} infrastructure",
        ] + ([f"  workers used        {self.workers_line()}"] if self.workers_used else [])
          + ([f"  not attempted       {self.missing} trajectories (a rerun does them)"] if self.missing else [])
          + ([f"  history             {self.superseded} older rows of this run kept in the lake (edited questions, "
              "retried failures)"] if self.superseded else []))


    def workers_line(self) -> str:
        """The workers the run's workflows called, with calls and questions.

        >>> RunSummary("r", questions=10, workers_used={"qwen-1.5b": [14, 9], "python": [3, 3]}).workers_line()
        'qwen-1.5b 14 calls in 9 of 10 questions; python 3 calls in 3 of 10 questions'
        """
        return "; ".join(f"{w} {c} call{'s' if c != 1 else ''} in {q} of {self.questions} questions"
                         for w, (c, q) in self.workers_used.items())


def run_summary(lake: str, run_id: str, kind: str = "answer",
                current: Sequence[str] | None = None) -> tuple[RunSummary, pl.DataFrame]:
    """Headline figures for one run, plus the per-trajectory frame they came from.

    ``current``: the trajectory ids of the input as it is now (``RunSpec.trajectory_ids``). Then only those
    rows count (one per id; a retried row beats its infra-failed predecessor); rows of edited questions or
    other settings stay in the lake as history and are counted as ``superseded``; ids with no row are
    ``missing``.
    """
    from conductor.lake.reader import scan

    df = scan(lake, "trajectories", kind=kind, run_id=run_id).select(
        "trajectory_id", "question_id", "dataset", "domain", "sample_index", "gold", "final_answer",
        "extracted_answer", "correct", "reward", "parse_status", "parse_error", "infra_failed", "infra_cause",
        "n_steps", "n_calls", "n_cache_hits", "tokens", "cost_usd", "wall_s", "recursion_depth",
    ).collect()
    superseded = missing = 0
    if current is not None:
        wanted = pl.DataFrame({"trajectory_id": list(current)}, schema={"trajectory_id": pl.String})
        all_rows = df.height
        df = (df.join(wanted, on="trajectory_id", how="semi").sort("infra_failed")
              .unique("trajectory_id", keep="first", maintain_order=True))
        superseded = all_rows - df.height
        missing = wanted["trajectory_id"].n_unique() - df.height
    df = df.sort(["question_id", "sample_index"])
    n = df.height
    graded = df.filter(pl.col("correct").is_not_null() & ~pl.col("infra_failed"))
    ok = df.filter(pl.col("parse_status") == "ok")
    questions = df["question_id"].n_unique() if n else 0
    summary = RunSummary(
        run_id=run_id,
        questions=questions,
        trajectories=n,
        graded=graded.height,
        accuracy=_mean(graded["correct"].cast(pl.Float64)) if graded.height else None,
        mean_reward=_mean(df["reward"].drop_nulls()) if n else None,
        parse_failures=n - ok.height,
        infra_failures=int(df["infra_failed"].sum()) if n else 0,
        calls_per_question=float(df["n_calls"].sum()) / questions if questions else 0.0,
        cache_hits=int(df["n_cache_hits"].sum()) if n else 0,
        tokens_per_question=float(df["tokens"].sum()) / questions if questions else 0.0,
        dollars_per_question=float(df["cost_usd"].sum()) / questions if questions else 0.0,
        mean_workflow_length=_mean(ok["n_steps"].cast(pl.Float64)) if ok.height else None,
        workflow_length_histogram={int(r["n_steps"]): int(r["len"]) for r in
                                   ok.group_by("n_steps").len().sort("n_steps").to_dicts()} if ok.height else {},
        accuracy_by_dataset={r["dataset"]: r["accuracy"] for r in graded.group_by("dataset").agg(
            pl.col("correct").cast(pl.Float64).mean().alias("accuracy")).sort("dataset").to_dicts()},
        wall_s_per_trajectory=_mean(df["wall_s"]) if n else None,
        missing=missing,
        superseded=superseded,
        infra_failed_questions=df.filter(pl.col("infra_failed"))["question_id"].n_unique() if n else 0,
        infra_causes=_causes(df),
        workers_used=_workers_used(lake, kind, run_id, df),
    )
    return summary, df


def _workers_used(lake: str, kind: str, run_id: str, df: pl.DataFrame) -> dict[str, list[int]]:
    """worker -> [calls, questions] over the calls of the trajectories in ``df``, most called first."""
    from conductor.lake.reader import scan

    if not df.height:
        return {}
    calls = (scan(lake, "calls", kind=kind, run_id=run_id).select("trajectory_id", "worker").collect()
             .join(df.select("trajectory_id", "question_id"), on="trajectory_id"))
    used = (calls.group_by("worker").agg(pl.len().alias("calls"), pl.col("question_id").n_unique().alias("questions"))
            .sort(["calls", "worker"], descending=[True, False]))
    return {r["worker"]: [int(r["calls"]), int(r["questions"])] for r in used.to_dicts()}


def _causes(df: pl.DataFrame, top: int = 3) -> dict[str, int]:
    """The most common infrastructure causes, shortest form first line only."""
    failed = df.filter(pl.col("infra_failed"))
    if not failed.height:
        return {}
    causes = failed.select(pl.col("infra_cause").fill_null("unknown").str.split("\n").list.first().str.slice(0, 200))
    counted = causes.group_by("infra_cause").len().sort(["len", "infra_cause"], descending=[True, False])
    return {r["infra_cause"]: int(r["len"]) for r in counted.head(top).to_dicts()}


def _mean(s: pl.Series) -> float | None:
    v = s.mean()
    return None if v is None else round(float(v), 6)  # type: ignore[arg-type]


def write_answers(df: pl.DataFrame, path: Path) -> Path:
    """One JSON line per trajectory: what was answered and how it graded (atomic write)."""
    cols = ["question_id", "sample_index", "trajectory_id", "dataset", "final_answer", "extracted_answer", "gold", "correct",
            "reward", "parse_status", "parse_error", "infra_failed", "infra_cause", "n_steps", "n_calls", "cost_usd"]
    lines = [json.dumps(r, ensure_ascii=False) for r in df.select(cols).to_dicts()]
    return atomic_write_text(path, "\n".join(lines) + ("\n" if lines else ""))
