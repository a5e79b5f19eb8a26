"""`conductor compare`: the conductor and the baselines on one question set and pool, as the paper's table."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from conductor.cli import app, fail
from conductor.cli.run_options import CONFIG_HELP, build_config, config_options
from conductor.policy.spec import is_strategy_text
from conductor.run.config import AnswerConfig, AnswerSettings, CompareConfig

if TYPE_CHECKING:
    from conductor.policy.spec import ConductorSpec
    from conductor.workers.pool import Pool


def expand(strategies: list[str], n_workers: int) -> list[str]:
    """``fixed:*`` stands for every single worker of the pool.

    >>> expand(["conductor", "fixed:*", "sc:0:3"], 2)
    ['conductor', 'fixed:0', 'fixed:1', 'sc:0:3']
    """
    out: list[str] = []
    for s in strategies:
        out += [f"fixed:{i}" for i in range(n_workers)] if s == "fixed:*" else [s]
    return out


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label)


def _labelled(runs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Label runs by their strategy; the first run of a model conductor is "conductor"; repeats get #2, #3."""
    from conductor.run.compare import CONDUCTOR

    out: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for checkpoint, run_id in runs:
        label = checkpoint if is_strategy_text(checkpoint) else (CONDUCTOR if CONDUCTOR not in seen else checkpoint)
        seen[label] = seen.get(label, 0) + 1
        out.append((label if seen[label] == 1 else f"{label}#{seen[label]}", run_id))
    return out


def _read_runs(lake: str, runs: str | None) -> list[tuple[str, str]]:
    """(label, run id) from ``--runs`` (LABEL=RUN_ID or RUN_ID, comma-separated), else every answer run."""
    from conductor.run.compare import answer_runs

    known = answer_runs(lake)
    if not runs:
        return _labelled(known)
    checkpoint = {r: c for c, r in known}
    picked: list[tuple[str, str]] = []
    for item in (p.strip() for p in runs.split(",") if p.strip()):
        label, eq, run_id = item.partition("=")
        label, run_id = (label.strip(), run_id.strip()) if eq else ("", item)
        if run_id not in checkpoint:
            raise ValueError(f"lake {lake}: no answer run {run_id!r} (runs: {', '.join(sorted(checkpoint)) or 'none'})")
        picked.append((label, run_id))
    auto = _labelled([(checkpoint[r], r) for _, r in picked])
    return [(label or default, run_id) for (label, run_id), (default, _) in zip(picked, auto)]


@app.command("compare")
@config_options(CompareConfig, argument="questions", flags={"constrained": "--constrained/--free"})
def compare_cmd(ctx: typer.Context, config: Path = typer.Option(None, "--config", help=CONFIG_HELP),
                **options: Any) -> None:
    """Run (or read) every strategy through the same answer pipeline and print accuracy ± s.e. per dataset and on
    average, calls/tokens/dollars/seconds per question, and the conductor vs the best single worker (paired)."""
    from conductor.data.datasets import DatasetError
    from conductor.data.questionset import load_questions
    from conductor.run.compare import CONDUCTOR, CompareError, compare_runs, split_strategies, write_outputs
    from conductor.workers.pool import PoolError, load_pool

    cfg = build_config(CompareConfig, ctx, config, options)
    out = Path(cfg.out)
    lake = cfg.lake or str(out / "lake")
    try:
        if cfg.questions is None:
            if not Path(lake).exists() and "://" not in lake:
                fail(f"{lake}: no lake to read runs from (give QUESTIONS to run the strategies)")
            labelled, elapsed = _read_runs(lake, cfg.runs), dict[str, float]()
        else:
            if cfg.runs:
                fail("--runs selects runs to read: leave out QUESTIONS, or leave out --runs to run the strategies")
            qs = load_questions(cfg.questions, cfg.limit)
            if not qs:
                fail(f"{cfg.questions}: no questions to compare on")
            manifest = load_pool(cfg.pool)
            plan = _plan(expand(split_strategies(cfg.strategies), len(manifest.workers)), cfg.conductor, manifest,
                         cfg.max_steps)
            labelled, elapsed = _run_all(plan, cfg, cfg.questions, out, lake)
        comparison = compare_runs(lake, labelled, conductor=CONDUCTOR, n_boot=cfg.n_boot, seed=cfg.seed,
                                  elapsed=elapsed)
    except (CompareError, DatasetError, PoolError, ValueError, OSError) as e:
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    paths = write_outputs(comparison, out)
    typer.echo(comparison.render())
    typer.echo(f"\ntable: {paths['markdown']}\njson:  {paths['json']}\nplot:  {paths['plot']}\nlake:  {lake}")


def _plan(strategies: list[str], conductor: ConductorSpec, manifest: Pool,
          max_steps: int) -> list[tuple[str, ConductorSpec, int]]:
    """(label, policy spec, max steps) per strategy, every spec checked before anything runs."""
    from conductor.policy.spec import parse_conductor_spec
    from conductor.policy.strategies import check_strategy, is_strategy, steps_needed
    from conductor.run.compare import CONDUCTOR

    if not strategies:
        raise ValueError("--strategies: no strategy given")
    if len(set(strategies)) != len(strategies):
        raise ValueError(f"--strategies: a strategy is listed twice ({', '.join(strategies)})")
    plan = []
    for s in strategies:
        if s == CONDUCTOR:
            spec = conductor
        elif not is_strategy_text(s):
            raise ValueError(f"--strategies: unknown strategy {s!r} (conductor, fixed:I, sc:I:K, moa:P1+P2:AGG, "
                             "vote:P1+P2, random)")
        else:
            spec = parse_conductor_spec(s)   # a malformed one: its StrategyError (a ValueError), one line
        steps = max(max_steps, steps_needed(spec)) if is_strategy(spec) else max_steps
        check_strategy(spec, manifest, steps)
        plan.append((s, spec, steps))
    return plan


def _run_all(plan: list[tuple[str, ConductorSpec, int]], settings: AnswerSettings, questions: str, out: Path,
             lake: str) -> tuple[list[tuple[str, str]], dict[str, float]]:
    """Each strategy as one ordinary answer run (with ``settings``) in the shared lake (reruns resume): (label, run
    id) pairs, and the measured wall seconds of each run that answered every question now (not resumed)."""
    import time

    from flows.answer import answer_flow

    labelled, elapsed = [], {}
    for label, spec, steps in plan:
        typer.echo(f"compare: running {label} ({spec})", err=True)
        start = time.perf_counter()
        summary = answer_flow(AnswerConfig(**{**settings.answer_settings(), "conductor": spec, "lake": lake,
                                              "max_steps": steps}, questions=questions,
                                           out=str(out / "runs" / _slug(label)), show_progress=False))
        labelled.append((label, summary.run_id))
        if summary.answered_now == summary.questions:
            elapsed[summary.run_id] = time.perf_counter() - start
    return labelled, elapsed
