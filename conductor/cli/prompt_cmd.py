"""`conductor prompt`: render the conductor prompt for a question and a (sub-)pool."""

from __future__ import annotations

from pathlib import Path

import typer

from conductor.cli import app, fail
from conductor.resources import data_path

DEFAULT_POOL = data_path("pools", "local.yaml")


@app.command("prompt")
def prompt_cmd(
    question: str = typer.Argument(..., help="The user question."),
    pool: Path = typer.Option(DEFAULT_POOL, "--pool", help="Pool manifest."),
    k: int = typer.Option(None, "--k", min=1, help="Show a random k-of-n sub-pool instead of the whole pool."),
    seed: int = typer.Option(0, "--seed", help="Seed for the sub-pool."),
    fewshot: str = typer.Option("ood", "--fewshot", help="Few-shot policy: ood, in_domain, mixed or none, optionally :k (e.g. ood:1)."),
    max_steps: int = typer.Option(5, "--max-steps", min=1),
) -> None:
    """Print the exact prompt the conductor model would receive."""
    from conductor.prompts import conductor_prompt
    from conductor.workers.pool import PoolError, load_pool

    if not question.strip():
        fail("QUESTION: empty; give the question text")

    try:
        p = load_pool(pool)
        sub = p.sample(k, seed) if k else p.full()
        text = conductor_prompt(question, sub, fewshot=fewshot, max_steps=max_steps)
    except (PoolError, ValueError) as e:
        fail(f"--fewshot: {e}" if not isinstance(e, PoolError) else str(e))
    typer.echo(text)
