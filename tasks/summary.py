"""Prefect task: summarise a finished run, write answers.jsonl, summary.json and the report, publish an artifact."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NONE

from conductor.run.summary import RunSummary


@task(name="summarize-run", cache_policy=NONE)
def summarize_run(lake: str, run_id: str, out_dir: str, kind: str = "answer",
                  current: list[str] | None = None) -> RunSummary:
    """``current``: the trajectory ids of the input as it is now; answers.jsonl holds exactly those."""
    from prefect.artifacts import create_markdown_artifact

    from conductor.files import atomic_write_text
    from conductor.lake.report import render_report
    from conductor.run.summary import run_summary, write_answers

    out = Path(out_dir)
    figures, df = run_summary(lake, run_id, kind, current)
    answers = write_answers(df, out / "answers.jsonl")
    report = render_report(lake, out / "report", run_id=run_id)
    summary = figures.with_outputs(answers=str(answers), report=str(report.markdown), lake=lake)
    atomic_write_text(out / "summary.json", json.dumps(summary.to_json(), indent=2, default=str))
    text = summary.render()
    get_run_logger().info("\n%s", text)
    create_markdown_artifact(key=f"run-{run_id}"[:60].lower(), markdown=f"```\n{text}\n```\n\nReport: {report.markdown}",
                             description=f"Summary of run {run_id}")
    return summary
