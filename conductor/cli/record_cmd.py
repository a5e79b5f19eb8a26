"""`conductor record`: run a menu of workflows once over a live pool into a response cache, for replay.

Every entry's workflow runs on every question, question by question (``conductor.run.record``); the cache then
answers ``conductor answer --conductor ENTRY --cache CACHE --replay`` (and ``conductor headroom --options``, and
GRPO over the menu) without calling a model. Rerun the same command to resume: recorded calls cost nothing.
"""

from __future__ import annotations

from pathlib import Path

import typer

from conductor.cli import app, fail, interrupted
from conductor.run.config import DEFAULT_POOL


@app.command("record")
def record_cmd(
    questions: str = typer.Argument(..., help="Question set, as for `conductor answer` (e.g. gsm8k_test:50)."),
    menu: str = typer.Option(..., "--menu", help="Strategy specs, comma-separated: the workflows to record "
                             "(e.g. fixed:0,pot:0,chain:0:1,moa:0:0,cascade:0+pot-0:0)."),
    cache: Path = typer.Option(..., "--cache", help="The response cache to record into (SQLite; created)."),
    pool: Path = typer.Option(DEFAULT_POOL, "--pool", help="Worker pool manifest."),
    limit: int = typer.Option(None, "--limit", min=1, help="Only the first N questions."),
) -> None:
    """Record every menu entry's workflow on every question into CACHE (resumable; progress with ETA)."""
    from conductor.data.datasets import DatasetError
    from conductor.execution.cache import ResponseCache
    from conductor.local.servers import EmbeddedServers, resolve_embedded
    from conductor.policy.menu import WorkflowMenu
    from conductor.policy.spec import ConductorSpecError
    from conductor.run.preflight import UsageError, check_cache_file, check_pool, check_questions
    from conductor.run.record import record_menu

    try:
        manifest = check_pool(pool)
        qs = check_questions(questions, limit)
        entries = WorkflowMenu.parse(menu, manifest)
        check_cache_file(cache)
    except (UsageError, ConductorSpecError, DatasetError, ValueError, OSError) as e:
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    try:
        rc = ResponseCache(cache)
    except ValueError as e:
        fail(str(e))
    try:
        with EmbeddedServers() as servers:
            live, _ = resolve_embedded(entries.pool, servers, lazy=True)
            summary = record_menu(qs, entries, live, rc, on_question=lambda p: typer.echo(p.line()))
    except KeyboardInterrupt as e:
        interrupted(e)
    finally:
        rc.close()
    for qid, spec, cause in summary.failed:
        typer.echo(f"failed: {qid} {spec}: {cause} (a rerun retries it)", err=True)
    typer.echo(f"recorded {summary.questions} questions x {len(entries)} entries into {cache}: "
               f"{summary.new_calls} new calls, {summary.cached_calls} already recorded, {summary.wall_s:.1f} s")
    if summary.failures:
        fail(f"{summary.failures} entry runs failed on infrastructure; rerun the same command to retry them", 4)
