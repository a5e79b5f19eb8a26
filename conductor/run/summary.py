"""What a finished run says to the person who started it: answers, accuracy, cost, failures.

Read back from the lake (not from memory), so a resumed run summarises every
shard, including the ones an earlier process committed.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl


def run_summary(lake: str, run_id: str, kind: str = "answer",
                current: Sequence[str] | None = None) -> tuple[dict[str, Any], pl.DataFrame]:
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
    summary: dict[str, Any] = {
        "run_id": run_id,
        "questions": questions,
        "trajectories": n,
        "graded": graded.height,
        "accuracy": _mean(graded["correct"].cast(pl.Float64)) if graded.height else None,
        "mean_reward": _mean(df["reward"].drop_nulls()) if n else None,
        "parse_failures": n - ok.height,
        "infra_failures": int(df["infra_failed"].sum()) if n else 0,
        "calls_per_question": df["n_calls"].sum() / questions if questions else 0.0,
        "cache_hits": int(df["n_cache_hits"].sum()) if n else 0,
        "tokens_per_question": df["tokens"].sum() / questions if questions else 0.0,
        "dollars_per_question": df["cost_usd"].sum() / questions if questions else 0.0,
        "mean_workflow_length": _mean(ok["n_steps"].cast(pl.Float64)) if ok.height else None,
        "workflow_length_histogram": {int(r["n_steps"]): int(r["len"]) for r in
                                      ok.group_by("n_steps").len().sort("n_steps").to_dicts()} if ok.height else {},
        "accuracy_by_dataset": {r["dataset"]: r["accuracy"] for r in graded.group_by("dataset").agg(
            pl.col("correct").cast(pl.Float64).mean().alias("accuracy")).sort("dataset").to_dicts()},
        "wall_s_per_trajectory": _mean(df["wall_s"]) if n else None,
        "missing": missing,
        "superseded": superseded,
        "infra_failed_questions": df.filter(pl.col("infra_failed"))["question_id"].n_unique() if n else 0,
        "infra_causes": _causes(df),
    }
    return summary, df


def _causes(df: pl.DataFrame, top: int = 3) -> dict[str, int]:
    """The most common infrastructure causes, shortest form first line only."""
    failed = df.filter(pl.col("infra_failed"))
    if not failed.height:
        return {}
    causes = failed.select(pl.col("infra_cause").fill_null("unknown").str.split("\n").list.first().str.slice(0, 200))
    counted = causes.group_by("infra_cause").len().sort(["len", "infra_cause"], descending=[True, False])
    return {r["infra_cause"]: int(r["len"]) for r in counted.head(top).to_dicts()}


# Exit codes of commands that answer questions (docs/operations.md).
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INFRA, EXIT_PARTIAL = 0, 1, 2, 3, 4


def run_outcome(s: dict[str, Any]) -> tuple[int, str | None]:
    """(exit code, one-line cause or None): 3 when no question got an answer because of infrastructure,
    4 when some did not (a rerun retries exactly those), 0 otherwise.

    >>> run_outcome({"questions": 4, "infra_failed_questions": 0, "missing": 0, "infra_causes": {}})
    (0, None)
    >>> run_outcome({"questions": 4, "infra_failed_questions": 4, "missing": 0, "infra_causes": {"missing_key: X": 4}})
    (3, '4 of 4 questions failed on infrastructure (missing_key: X x4); rerun the same command to retry them')
    """
    failed, missing = int(s.get("infra_failed_questions") or 0), int(s.get("missing") or 0)
    if not failed and not missing:
        return EXIT_OK, None
    total = int(s.get("questions") or 0)
    causes = "; ".join(f"{c} x{n}" for c, n in (s.get("infra_causes") or {}).items())
    parts = []
    if failed:
        parts.append(f"{failed} of {total} questions failed on infrastructure" + (f" ({causes})" if causes else ""))
    if missing:
        parts.append(f"{missing} trajectories were not attempted")
    code = EXIT_INFRA if failed >= total else EXIT_PARTIAL
    return code, "; ".join(parts) + "; rerun the same command to retry them"


def _mean(s: pl.Series) -> float | None:
    v = s.mean()
    return None if v is None else round(float(v), 6)  # type: ignore[arg-type]


def write_answers(df: pl.DataFrame, path: Path) -> Path:
    """One JSON line per trajectory: what was answered and how it graded (atomic write)."""
    cols = ["question_id", "sample_index", "trajectory_id", "dataset", "final_answer", "extracted_answer", "gold", "correct",
            "reward", "parse_status", "parse_error", "infra_failed", "infra_cause", "n_steps", "n_calls", "cost_usd"]
    lines = [json.dumps(r, ensure_ascii=False) for r in df.select(cols).to_dicts()]
    return atomic_write_text(path, "\n".join(lines) + ("\n" if lines else ""))


def atomic_write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def format_summary(s: dict[str, Any]) -> str:
    """A short human-readable block for the terminal."""
    acc = "n/a (no gold answers)" if s["accuracy"] is None else f"{s['accuracy']:.1%} of {s['graded']} graded"
    mwl = "n/a" if s["mean_workflow_length"] is None else f"{s['mean_workflow_length']:.2f} steps"
    return "\n".join([
        f"run {s['run_id']}: {s['questions']} questions, {s['trajectories']} trajectories",
        f"  accuracy            {acc}",
        f"  mean reward         {s['mean_reward']}",
        f"  workflow length     {mwl}  histogram {s['workflow_length_histogram']}",
        f"  calls / question    {s['calls_per_question']:.2f}  (cache hits {s['cache_hits']})",
        f"  dollars / question  ${s['dollars_per_question']:.6f}",
        f"  failures            {s['parse_failures']} unparseable, {s['infra_failures']} infrastructure",
    ] + ([f"  not attempted       {s['missing']} trajectories (a rerun does them)"] if s.get("missing") else [])
      + ([f"  history             {s['superseded']} older rows of this run kept in the lake (edited questions, "
          "retried failures)"] if s.get("superseded") else []))
