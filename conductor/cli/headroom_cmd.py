"""`conductor headroom`: can this pool be won at all (pool-bound), or did the router fail (router-bound)?

Reads every worker's single-worker run (``fixed:i``, as ``conductor compare --strategies fixed:*`` writes them)
from a lake, or runs them first through compare's machinery, and writes the headroom check
(``conductor.stats.headroom``): headroom.json, headroom.md and headroom.png.

``--options`` makes other strategies the options instead of the workers alone: a menu of workflows
(``fixed:0,pot:0,chain:0:1,cascade:0+pot-0:0``) gets the same check, each entry's accuracy and dollars, the
any-correct oracle over the entries and the cross-fit router that picks an entry per question (issue #47).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from conductor.cli import app, fail
from conductor.cli.run_options import CONFIG_HELP, build_config, config_options
from conductor.run.config import HeadroomConfig

if TYPE_CHECKING:
    from conductor.stats.headroom import OutcomeMatrix, PolicyOutcome

# Each worker (or option) runs with the answer defaults; the command line sets none of these.
HEADROOM_RUN_DEFAULTS = ("conductor", "temperature", "max_tokens", "fewshot", "constrained", "max_steps")
_LAKE_COLUMNS = ("question_id", "dataset", "domain", "question", "sample_index", "correct", "infra_failed",
                 "cost_usd", "subpool")


def _frame(lake: str, run_id: str) -> list[dict[str, Any]]:
    from conductor.lake.reader import scan

    return scan(lake, "trajectories", kind="answer", run_id=run_id).select(list(_LAKE_COLUMNS)).collect().to_dicts()


def _key(row: dict[str, Any]) -> str:
    """Questions are (dataset, question id): two datasets may reuse an id."""
    return f"{row['dataset']}:{row['question_id']}"


def _fixed_worker(label: str) -> int | None:
    """The worker of a ``fixed:I`` run label (``#2`` marks a repeated label); None for any other label."""
    from conductor.policy.spec import ConductorSpecError, FixedSpec, parse_conductor_spec

    try:
        spec = parse_conductor_spec(label.partition("#")[0])
    except ConductorSpecError:
        return None
    return spec.worker if isinstance(spec, FixedSpec) else None


def single_worker_runs(labelled: list[tuple[str, str]]) -> tuple[list[tuple[int, str, str]], list[str]]:
    """(worker ordinal, label, run id) of each ``fixed:i`` run, the first run of each ordinal; notes on the rest.

    >>> single_worker_runs([("conductor", "r0"), ("fixed:1", "r1"), ("fixed:0", "r2"), ("fixed:0#2", "r3")])
    ([(0, 'fixed:0', 'r2'), (1, 'fixed:1', 'r1')], ['ignored run r3 (fixed:0#2): fixed:0 already read from run r2'])
    """
    picked: dict[int, tuple[int, str, str]] = {}
    notes = []
    for label, run_id in labelled:
        i = _fixed_worker(label)
        if i is None:
            continue
        if i in picked:
            notes.append(f"ignored run {run_id} ({label}): fixed:{i} already read from run {picked[i][2]}")
            continue
        picked[i] = (i, label, run_id)
    return [picked[i] for i in sorted(picked)], notes


def option_runs(labelled: list[tuple[str, str]], options: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """(label, run id) of the first run of each option (a strategy label), in the options' order; notes on the rest.

    >>> option_runs([("pot:0", "r1"), ("fixed:0", "r2"), ("pot:0#2", "r3"), ("conductor", "r4")], ["fixed:0", "pot:0"])
    ([('fixed:0', 'r2'), ('pot:0', 'r1')], ['ignored run r3 (pot:0#2): pot:0 already read from run r1'])
    """
    first: dict[str, str] = {}
    notes = []
    for label, run_id in labelled:
        base = label.partition("#")[0]
        if base not in options:
            continue
        if base in first:
            notes.append(f"ignored run {run_id} ({label}): {base} already read from run {first[base]}")
            continue
        first[base] = run_id
    return [(o, first[o]) for o in options if o in first], notes


def options_matrix(lake: str, labelled: list[tuple[str, str]], options: list[str]) -> OutcomeMatrix:
    """The outcome matrix of the lake's runs of ``options`` (strategies as the options, named by their spec)."""
    from conductor.stats.headroom import OutcomeMatrix

    runs, notes = option_runs(labelled, options)
    if len(runs) < 2:
        found = ", ".join(label for label, _ in labelled) or "none"
        raise ValueError(f"lake {lake}: needs runs of at least two of the options {', '.join(options)} (runs: {found})")
    rows: list[dict[str, Any]] = []
    for label, run_id in runs:
        frame = _frame(lake, run_id)
        if not frame:
            raise ValueError(f"lake {lake}: run {run_id} ({label}) has no answer trajectories")
        rows += [{**r, "question_id": _key(r), "worker": label, "domain": r.get("domain") or r.get("dataset")}
                 for r in frame]
    matrix = OutcomeMatrix.from_rows(rows)
    return OutcomeMatrix(matrix.question_ids, matrix.workers, matrix.correct, matrix.cost_usd, matrix.texts,
                         matrix.domains, (*notes, *matrix.notes))


def matrix_from_lake(lake: str, labelled: list[tuple[str, str]]) -> OutcomeMatrix:
    """The outcome matrix of the lake's single-worker runs; workers are named from the runs' pool order."""
    from conductor.stats.headroom import OutcomeMatrix

    runs, notes = single_worker_runs(labelled)
    if len(runs) < 2:
        found = ", ".join(label for label, _ in labelled) or "none"
        raise ValueError(f"lake {lake}: needs single-worker runs (fixed:i) of at least two workers (runs: {found}); "
                         "run `conductor compare QUESTIONS --strategies fixed:*` or give QUESTIONS here")
    rows: list[dict[str, Any]] = []
    names: set[str] = set()
    for i, label, run_id in runs:
        frame = _frame(lake, run_id)
        if not frame:
            raise ValueError(f"lake {lake}: run {run_id} ({label}) has no answer trajectories")
        pool = frame[0].get("subpool") or []
        name = str(pool[i]) if i < len(pool) else label
        name = name if name not in names else f"{name} ({label})"
        names.add(name)
        rows += [{**r, "question_id": _key(r), "worker": name, "domain": r.get("domain") or r.get("dataset")}
                 for r in frame]
    matrix = OutcomeMatrix.from_rows(rows)
    return OutcomeMatrix(matrix.question_ids, matrix.workers, matrix.correct, matrix.cost_usd, matrix.texts,
                         matrix.domains, (*notes, *matrix.notes))


def policy_from_lake(lake: str, labelled: list[tuple[str, str]], policy: str) -> PolicyOutcome:
    """The run named by ``policy`` (a label such as ``conductor``, or a run id) as a policy point."""
    from conductor.stats.headroom import PolicyOutcome

    run_id = next((r for label, r in labelled if policy in (label, r)), None)
    if run_id is None:
        raise ValueError(f"--policy {policy}: no such run in {lake} (runs: "
                         f"{', '.join(f'{label}={r}' for label, r in labelled) or 'none'})")
    first: dict[str, dict[str, Any]] = {}
    for r in _frame(lake, run_id):
        k = _key(r)
        if k not in first or int(r.get("sample_index") or 0) < int(first[k].get("sample_index") or 0):
            first[k] = r
    scored = {k: r for k, r in first.items() if not r.get("infra_failed") and r.get("correct") is not None}
    return PolicyOutcome(policy, {k: bool(r["correct"]) for k, r in scored.items()},
                         {k: float(r.get("cost_usd") or 0.0) for k, r in scored.items()})


@app.command("headroom")
@config_options(HeadroomConfig, argument="questions", exclude=HEADROOM_RUN_DEFAULTS)
def headroom_cmd(ctx: typer.Context, config: Path = typer.Option(None, "--config", help=CONFIG_HELP),
                 **options: Any) -> None:
    """Run (or read) each worker alone and check the pool's headroom: per-worker accuracy and dollars, the
    random-mix line, the cross-fit routing oracle and the any-correct oracle with 95% intervals and paired tests,
    and a verdict: pool-bound (no router can win here) or router-bound (a router could)."""
    import math

    from conductor.cli.compare_cmd import _plan, _read_runs, _run_all, expand
    from conductor.data.datasets import DatasetError
    from conductor.data.questionset import load_questions
    from conductor.run.compare import CompareError, split_strategies
    from conductor.stats.headroom import headroom_report
    from conductor.workers.pool import PoolError, load_pool

    cfg = build_config(HeadroomConfig, ctx, config, options)
    if not math.isfinite(cfg.cost_weight):    # inf would be written to headroom.json as a bare Infinity
        fail(f"--cost-weight {cfg.cost_weight}: must be a finite number >= 0")
    out, lake, options_text = Path(cfg.out), cfg.lake, cfg.options.strip()
    try:
        if cfg.questions is None:
            if not lake:
                fail("give QUESTIONS to run each worker alone, or --lake with their runs (fixed:i)")
            if not Path(lake).exists() and "://" not in lake:
                fail(f"{lake}: no lake to read runs from (give QUESTIONS to run the workers)")
            labelled = _read_runs(lake, cfg.runs)
        else:
            if cfg.runs:
                fail("--runs selects runs to read: leave out QUESTIONS, or leave out --runs to run the workers")
            lake = lake or str(out / "lake")
            n_questions = len(load_questions(cfg.questions, cfg.limit))
            if n_questions < 2:   # found now, not after running every worker
                fail(f"{cfg.questions}: headroom needs at least 2 questions (got {n_questions})")
            manifest = load_pool(cfg.pool)
            if len(manifest.workers) < 2 and options_text == "fixed:*":
                fail(f"{cfg.pool}: headroom compares workers; the pool has {len(manifest.workers)}")
            plan = _plan(expand(split_strategies(cfg.options), len(manifest.workers)), cfg.conductor, manifest, 1)
            ran, _ = _run_all(plan, cfg, cfg.questions, out, lake)
            ours = {run_id for _, run_id in ran}     # the lake's other runs stay reachable by --policy
            labelled = ran + [(label, r) for label, r in _read_runs(lake, None) if r not in ours]
        matrix = (matrix_from_lake(lake, labelled) if options_text == "fixed:*"
                  else options_matrix(lake, labelled, split_strategies(cfg.options)))
        pol = policy_from_lake(lake, labelled, cfg.policy) if cfg.policy else None
        report = headroom_report(matrix, policy=pol, folds=cfg.folds, n_boot=cfg.n_boot, seed=cfg.seed,
                                 margin=cfg.margin, alpha=cfg.alpha, cost_weight=cfg.cost_weight)
    except (CompareError, DatasetError, PoolError, ValueError, OSError) as e:
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    paths = report.write(out)
    for line in report.evidence[:-1]:
        typer.echo(line)
    typer.echo(f"\nreport: {paths['markdown']}\njson:   {paths['json']}\nplot:   {paths['plot']}\nlake:   {lake}")
    typer.echo(report.verdict_line)
