"""`conductor answer`: bulk answering, the main job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from conductor.cli import app, fail
from conductor.cli.dask_option import DASK_HELP, check_dask
from conductor.cli.run_options import CONFIG_HELP, build_config, config_options
from conductor.run.config import AnswerConfig


@app.command("answer")
@config_options(AnswerConfig, argument="questions", exclude=("show_progress",),
                flags={"batch_poll_s": "--batch-poll", "max_dollars": "--max-cost", "constrained": "--constrained/--free",
                       "retry_failed": "--retry-failed/--keep-failed"})
def answer_cmd(
    ctx: typer.Context,
    config: Path = typer.Option(None, "--config", help=CONFIG_HELP),
    replace: bool = typer.Option(False, "--replace", help="Answer into an --out that holds another question "
                                 "set's answers, replacing its answers.jsonl, summary.json and report/."),
    dask: str = typer.Option(None, "--dask", help=DASK_HELP),
    **options: Any,
) -> None:
    """Answer a question set with the conductor over a worker pool; resumable; prints a summary.

    Exit codes: 0 every question answered, 2 bad input (nothing started), 3 every question failed on
    infrastructure, 4 some did (a rerun retries exactly those), 1 anything else."""
    from conductor.run.preflight import UsageError, claim_out, prepare_answer

    cfg = build_config(AnswerConfig, ctx, config, options)   # options: the generated ones (field -> value)
    if dask:
        if cfg.batch:
            fail("--batch sends every shard's calls through shared provider batches from one process; "
                 "drop --dask or --batch")
        check_dask(dask)
    try:  # every check before Prefect starts: bad input is one `error:` line (exit 2), not a traceback
        prepared = prepare_answer(cfg, hand_over=True)   # the flow takes these inputs instead of preparing again
    except UsageError as e:
        fail(str(e))
    if dask and any(getattr(w, "batch", None) for w in prepared.pool.workers):
        fail(f"{cfg.pool}: a worker says batch: true, and provider batches are shared by every shard from one "
             "process; drop --dask")
    try:
        lock = claim_out(prepared.out, cfg.questions, replace)  # noqa: F841 - held until the command ends
    except (UsageError, OSError) as e:
        fail(str(e))
    from conductor.cli.boundary import flow_errors
    from flows.answer import answer_flow

    flow_fn = answer_flow
    if dask:
        from flows.fanout import on_cluster

        flow_fn = on_cluster(answer_flow, dask)
    with flow_errors():
        summary = flow_fn(prepared.config)
    typer.echo(summary.render())
    from conductor.data.datasets import inferred_domain_note

    if note := inferred_domain_note(prepared.questions):
        typer.echo(note)
    typer.echo(f"answers: {summary.answers}\nreport:  {summary.report}\nlake:    {summary.lake}")
    code, why = summary.outcome()
    if code:
        fail(why or "the run did not answer every question", code)
