"""`conductor rollout | evaluate | nightly`: the learning flows from the command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from conductor.cli import app, fail
from conductor.cli.dask_option import DASK_HELP, check_dask
from conductor.cli.run_options import CONFIG_HELP, build_config, config_options
from conductor.policy.spec import ConductorSpec
from conductor.run.config import EvaluateConfig, NightlyConfig, RolloutConfig


def _check(pool: Path, conductors: dict[str, ConductorSpec] | None = None, run_id: str | None = None,
           k: int | None = None, questions: str | None = None, limit: int | None = None) -> None:
    """The checks `conductor answer` makes, before Prefect starts: one `error:` line, exit 2."""
    from conductor.run.preflight import UsageError, check_conductor, check_k, check_pool, check_questions, check_run_id
    from conductor.workflow import DEFAULT_MAX_STEPS

    try:
        if run_id is not None:
            check_run_id(run_id)
        if questions is not None:
            check_questions(questions, limit)
        manifest = check_pool(pool)
        for flag, spec in (conductors or {}).items():
            check_k(k, manifest, spec)
            check_conductor(spec, manifest, max_steps=DEFAULT_MAX_STEPS, flag=flag)
    except UsageError as e:
        fail(str(e))


def _check_nightly(cfg: NightlyConfig) -> None:
    """What a night would otherwise find after Prefect started and the model loaded: one line, exit 2."""
    import re

    from conductor.learning.grpo.config import GRPOConfig, GRPOConfigError

    if cfg.grpo:
        try:
            GRPOConfig.from_dict(cfg.grpo, "--grpo")   # a typo ('learnig_rate') or a wrong type, now
        except GRPOConfigError as e:
            fail(str(e))
    if cfg.backend not in ("transformers", "vllm"):
        fail(f"--backend must be transformers or vllm, not {cfg.backend!r}")
    if cfg.night is not None and not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", cfg.night):
        fail(f"--night {cfg.night!r}: a plain name (letters, digits, '.', '_', '-'), never a path")
    base = cfg.base
    local = base.startswith(("/", ".", "~")) or base.count("/") != 1 or Path(base).exists()
    if local and not Path(base).expanduser().exists():
        fail(f"--base {base}: no such checkpoint directory (give a directory or a Hugging Face id ORG/NAME)")
    labels = cfg.served_labels
    if labels and "://" not in labels and not Path(labels).is_file():
        fail(f"served_labels {labels}: no such file (a labels file: JSONL, CSV or Parquet with question and answer)")


@app.command("rollout")
@config_options(RolloutConfig, argument="questions", exclude=("kind",))
def rollout_cmd(
    ctx: typer.Context,
    dask: str = typer.Option(None, "--dask", help=DASK_HELP),
    config: Path = typer.Option(None, "--config", help=CONFIG_HELP),
    **options: Any,
) -> None:
    """Sample GRPO groups with the conductor, execute, score, and write them to the lake."""
    from conductor.cli.boundary import flow_errors
    from flows.fanout import on_cluster
    from flows.rollout import rollout_flow

    cfg = build_config(RolloutConfig, ctx, config, options)
    _check(Path(cfg.pool), {"--conductor": cfg.conductor}, cfg.run_id, cfg.k, cfg.questions, cfg.limit)
    fn = rollout_flow
    if dask:
        check_dask(dask)
        fn = on_cluster(rollout_flow, dask)
    with flow_errors():
        out = fn(cfg)
    typer.echo(json.dumps(out.to_json(), indent=2, default=str))


@app.command("evaluate")
@config_options(EvaluateConfig, argument="questions")
def evaluate_cmd(
    ctx: typer.Context,
    config: Path = typer.Option(None, "--config", help=CONFIG_HELP),
    **options: Any,
) -> None:
    """Candidate vs champion on the same questions, pool and seeds; paired statistics per domain."""
    from conductor.cli.boundary import flow_errors
    from flows.evaluate import evaluate_flow

    cfg = build_config(EvaluateConfig, ctx, config, options)
    _check(Path(cfg.pool), {"--candidate": cfg.candidate, "--champion": cfg.champion}, questions=cfg.questions,
           limit=cfg.limit)
    with flow_errors():
        res = evaluate_flow(cfg)
    typer.echo(res.render())


@app.command("nightly")
@config_options(NightlyConfig, flags={"train_questions": "--train", "eval_questions": "--eval"})
def nightly_cmd(
    ctx: typer.Context,
    config: Path = typer.Option(None, "--config", help=CONFIG_HELP),
    **options: Any,
) -> None:
    """Retrain when the pool changed: rollouts -> GRPO x N, evaluate, promote if significantly better, report."""
    from conductor.cli.boundary import flow_errors
    from conductor.data.datasets import DatasetError
    from conductor.data.questionset import check_disjoint, load_questions
    from flows.nightly import nightly_flow

    cfg = build_config(NightlyConfig, ctx, config, options)   # --grpo: JSON text, parsed by the model
    _check(Path(cfg.pool))
    _check_nightly(cfg)
    try:
        check_disjoint(load_questions(cfg.train_questions), load_questions(cfg.eval_questions))
    except (DatasetError, ValueError, OSError) as e:
        fail(str(e).splitlines()[0])
    with flow_errors():
        res = nightly_flow(cfg).to_json()
    typer.echo(json.dumps({k: res.get(k) for k in ("night", "status", "why", "stopped", "decision", "report")}, indent=2, default=str))
