"""`conductor compare`: the conductor and the baselines on one question set and pool, as the paper's table."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from conductor.cli import app, fail
from conductor.run.config import DEFAULT_POOL

DEFAULT_STRATEGIES = "conductor,fixed:*,random"


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
    from conductor.policy.strategies import is_strategy
    from conductor.run.compare import CONDUCTOR

    out: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for checkpoint, run_id in runs:
        label = checkpoint if is_strategy(checkpoint) else (CONDUCTOR if CONDUCTOR not in seen else checkpoint)
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
def compare_cmd(
    questions: str = typer.Argument(None, help="Question set to run every strategy on (as for `conductor answer`); "
                                    "leave out to read existing runs from --lake."),
    out: Path = typer.Option(..., "--out", help="Output directory: compare.md, compare.json, compare.png, runs/, lake/."),
    pool: Path = typer.Option(DEFAULT_POOL, "--pool", help="Worker pool manifest (default: the embedded local pool)."),
    strategies: str = typer.Option(DEFAULT_STRATEGIES, "--strategies", help="Comma-separated: conductor (the --conductor "
                                   "policy), fixed:I (fixed:* = every worker), sc:I:K, moa:P1+P2+...:AGG, "
                                   "vote:P1+P2+..., random[:SEED[:MAX_STEPS]]."),
    conductor: str = typer.Option("auto", "--conductor", help="The conductor policy behind the 'conductor' strategy "
                                  "(as for `conductor answer`)."),
    lake: str = typer.Option(None, "--lake", help="Lake holding the runs (default OUT/lake); without QUESTIONS, "
                             "the runs are read from it instead of run."),
    runs: str = typer.Option(None, "--runs", help="Read mode: which runs, as LABEL=RUN_ID or RUN_ID, comma-separated "
                             "(default: every answer run in --lake)."),
    limit: int = typer.Option(None, "--limit", min=1, help="Only the first N questions."),
    shard_size: int = typer.Option(5, "--shard-size", min=1),
    seed: int = typer.Option(0, "--seed"),
    temperature: float = typer.Option(None, "--temperature", min=0.0, help="Conductor sampling temperature (default: "
                                      "as for `conductor answer`)."),
    max_tokens: int = typer.Option(768, "--max-tokens", min=16, help="Conductor completion limit."),
    max_steps: int = typer.Option(5, "--max-steps", min=1, help="The conductor's step limit (a baseline that needs "
                                  "more steps, e.g. sc:0:5, gets what it needs)."),
    fewshot: str = typer.Option("auto", "--fewshot", help="The conductor's prompt, as for `conductor answer` (auto: "
                                "informed for the untrained embedded conductor)."),
    constrained: bool = typer.Option(None, "--constrained/--free", help="Decode the conductor under the workflow "
                                     "grammar (default: on for the embedded conductor, off otherwise)."),
    cache: Path = typer.Option(None, "--cache", help="One response cache for every strategy (default: one per "
                               "strategy under OUT/runs/, so seconds per question are not flattered by another "
                               "strategy's cached calls)."),
    replay: bool = typer.Option(False, "--replay", help="Answer only from the cache; never call a provider."),
    n_boot: int = typer.Option(10_000, "--n-boot", min=100, help="Bootstrap resamples for the paired test."),
) -> None:
    """Run (or read) every strategy through the same answer pipeline and print accuracy ± s.e. per dataset and on
    average, calls/tokens/dollars/seconds per question, and the conductor vs the best single worker (paired)."""
    from conductor.data.datasets import DatasetError
    from conductor.data.questionset import load_questions
    from conductor.run.compare import CONDUCTOR, CompareError, compare_runs, split_strategies, write_outputs
    from conductor.workers.pool import PoolError, load_pool

    lake = lake or str(out / "lake")
    try:
        if questions is None:
            if not Path(lake).exists() and "://" not in lake:
                fail(f"{lake}: no lake to read runs from (give QUESTIONS to run the strategies)")
            labelled, elapsed = _read_runs(lake, runs), {}
        else:
            if runs:
                fail("--runs selects runs to read: leave out QUESTIONS, or leave out --runs to run the strategies")
            qs = load_questions(questions, limit)
            if not qs:
                fail(f"{questions}: no questions to compare on")
            manifest = load_pool(pool)
            plan = _plan(expand(split_strategies(strategies), len(manifest.workers)), conductor, manifest, max_steps)
            labelled, elapsed = _run_all(plan, questions, out, lake, pool, limit=limit, shard_size=shard_size,
                                         seed=seed, temperature=temperature, max_tokens=max_tokens, fewshot=fewshot,
                                         constrained=constrained, cache=str(cache) if cache else None, replay=replay)
        comparison = compare_runs(lake, labelled, conductor=CONDUCTOR, n_boot=n_boot, seed=seed, elapsed=elapsed)
    except (CompareError, DatasetError, PoolError, ValueError, OSError) as e:
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    paths = write_outputs(comparison, out)
    typer.echo(comparison.render())
    typer.echo(f"\ntable: {paths['markdown']}\njson:  {paths['json']}\nplot:  {paths['plot']}\nlake:  {lake}")


def _plan(strategies: list[str], conductor: str, manifest: object, max_steps: int) -> list[tuple[str, str, int]]:
    """(label, policy spec, max steps) per strategy, every spec checked before anything runs."""
    from conductor.policy.strategies import check_strategy, is_strategy, steps_needed
    from conductor.run.compare import CONDUCTOR

    if not strategies:
        raise ValueError("--strategies: no strategy given")
    if len(set(strategies)) != len(strategies):
        raise ValueError(f"--strategies: a strategy is listed twice ({', '.join(strategies)})")
    plan = []
    for s in strategies:
        if s != CONDUCTOR and not is_strategy(s):
            raise ValueError(f"--strategies: unknown strategy {s!r} (conductor, fixed:I, sc:I:K, moa:P1+P2:AGG, vote:P1+P2, random)")
        spec = conductor if s == CONDUCTOR else s
        steps = max(max_steps, steps_needed(spec)) if is_strategy(spec) else max_steps
        check_strategy(spec, manifest, steps)  # type: ignore[arg-type]
        plan.append((s, spec, steps))
    return plan


def _run_all(plan: list[tuple[str, str, int]], questions: str, out: Path, lake: str, pool: Path,
             **kw: object) -> tuple[list[tuple[str, str]], dict[str, float]]:
    """Each strategy as one ordinary answer run in the shared lake (reruns resume): (label, run id) pairs, and
    the measured wall seconds of each run that answered every question now (not resumed)."""
    import time

    from conductor.run.config import AnswerConfig
    from flows.answer import answer_flow

    labelled, elapsed = [], {}
    for label, spec, steps in plan:
        typer.echo(f"compare: running {label} ({spec})", err=True)
        start = time.perf_counter()
        summary = answer_flow(AnswerConfig(questions=questions, out=str(out / "runs" / _slug(label)), pool=str(pool),
                                           conductor=spec, lake=lake, max_steps=steps, show_progress=False,
                                           **kw))
        labelled.append((label, summary.run_id))
        if summary.answered_now == summary.questions:
            elapsed[summary.run_id] = time.perf_counter() - start
    return labelled, elapsed
