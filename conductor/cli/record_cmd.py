"""`conductor record`: run a menu of workflows once over a live pool into a response cache, for replay.

Every entry's workflow runs on every question, question by question (``conductor.run.record``); the cache then
answers ``conductor answer --conductor ENTRY --cache CACHE --replay`` (and ``conductor headroom --options``, and
GRPO over the menu) without calling a model. Rerun the same command to resume: recorded calls cost nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from conductor.cli import app, fail, interrupted
from conductor.cli.run_options import build_config, config_options
from conductor.run.command_config import RecordConfig


@app.command("record")
@config_options(RecordConfig, argument="questions")
def record_cmd(ctx: typer.Context, **options: Any) -> None:
    """Record every menu entry's workflow on every question into CACHE (resumable; progress with ETA)."""
    from conductor.data.datasets import DatasetError
    from conductor.execution.cache import ResponseCache
    from conductor.local.servers import EmbeddedServers, resolve_embedded
    from conductor.policy.menu import WorkflowMenu
    from conductor.policy.spec import ConductorSpecError
    from conductor.run.preflight import UsageError, check_cache_file, check_pool, check_questions
    from conductor.run.record import record_menu

    c = build_config(RecordConfig, ctx, None, options)
    questions, menu, limit = c.questions, c.menu, c.limit
    cache, pool = Path(c.cache), Path(c.pool)   # as typed, like the Path options they were
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
