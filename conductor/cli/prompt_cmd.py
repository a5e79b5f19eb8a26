"""`conductor prompt`: render the conductor prompt for a question and a (sub-)pool."""

from __future__ import annotations

from typing import Any

import typer

from conductor.cli import app, fail
from conductor.cli.language_config import PromptConfig
from conductor.cli.run_options import build_config, config_options


@app.command("prompt")
@config_options(PromptConfig)
def prompt_cmd(
    ctx: typer.Context,
    question: str = typer.Argument(..., help="The user question."),
    **options: Any,
) -> None:
    """Print the exact prompt the conductor model would receive."""
    from conductor.prompts import conductor_prompt
    from conductor.workers.pool import PoolError, load_pool

    cfg = build_config(PromptConfig, ctx, None, options)
    if not question.strip():
        fail("QUESTION: empty; give the question text")

    try:
        p = load_pool(cfg.pool)
        sub = p.sample(cfg.k, cfg.seed) if cfg.k else p.full()
        text = conductor_prompt(question, sub, fewshot=cfg.fewshot, max_steps=cfg.max_steps)
    except (PoolError, ValueError) as e:
        fail(f"--fewshot: {e}" if not isinstance(e, PoolError) else str(e))
    typer.echo(text)
