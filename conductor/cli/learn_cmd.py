"""`conductor rollout | evaluate | nightly`: the learning flows from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from conductor.cli import app, fail
from conductor.cli.run_options import CONFIG_HELP, build_config, default
from conductor.run.config import NightlyConfig, RolloutConfig

R, N = RolloutConfig, NightlyConfig


def _check(pool: Path, conductors: dict[str, str] | None = None, run_id: str | None = None,
           k: int | None = None, questions: str | None = None, limit: int | None = None) -> None:
    """The checks `conductor answer` makes, before Prefect starts: one `error:` line, exit 2."""
    from conductor.run.preflight import UsageError, check_conductor, check_k, check_pool, check_questions, check_run_id

    try:
        if run_id is not None:
            check_run_id(run_id)
        if questions is not None:
            check_questions(questions, limit)
        manifest = check_pool(pool)
        for flag, spec in (conductors or {}).items():
            check_k(k, manifest, spec)
            check_conductor(spec, manifest, max_steps=5, flag=flag)
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


def check_dask(address: str) -> None:
    """``local:N`` or ``[tcp://]HOST:PORT`` that resolves and accepts a connection within a few seconds."""
    import socket
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import TimeoutError as FutureTimeout

    if address.startswith("local:"):
        n = address.split(":", 1)[1]
        if not n.isdigit() or int(n) < 1:
            fail(f"--dask {address!r}: local:N needs a number of workers >= 1")
        return
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        fail(f"--dask {address!r}: expected local:N or a scheduler address tcp://HOST:PORT")
    ex = ThreadPoolExecutor(max_workers=1)
    try:
        ex.submit(socket.create_connection, (host.strip("[]"), int(port)), 3).result(timeout=5).close()
    except FutureTimeout:
        fail(f"--dask {address}: no answer from {host}:{port} within 5 s")
    except OSError as e:
        fail(f"--dask {address}: cannot reach the scheduler ({e.strerror or e})")
    finally:
        ex.shutdown(wait=False)


@app.command("rollout")
def rollout_cmd(
    ctx: typer.Context,
    questions: str = typer.Argument(None, show_default=False, help="Training questions: dataset names with limits or "
                                    "a file (or `questions:` in --config)."),
    lake: str = typer.Option(None, "--lake", show_default=False, help="Lake root (local path or s3://)."),
    pool: Path = typer.Option(None, "--pool", show_default=False, help="Worker pool manifest."),
    conductor: str = typer.Option(None, "--conductor", show_default=False, help="Policy spec, e.g. transformers:CKPT_DIR "
                                  "or vllm:CKPT_DIR."),
    run_id: str = typer.Option(None, "--run-id", show_default=False, help="Rollout run id (rerunning it resumes)."),
    group_size: int = typer.Option(default(R, "group_size"), "--group-size", min=1, help="GRPO group size G (samples per question)."),
    k: int = typer.Option(default(R, "k"), "--k", min=1, help="Randomized k-of-n sub-pools per question."),
    seed: int = typer.Option(default(R, "seed"), "--seed"),
    temperature: float = typer.Option(default(R, "temperature"), "--temperature", min=0.0),
    max_tokens: int = typer.Option(default(R, "max_tokens"), "--max-tokens", min=16),
    limit: int = typer.Option(default(R, "limit"), "--limit", min=1),
    shard_size: int = typer.Option(default(R, "shard_size"), "--shard-size", min=1),
    dask: str = typer.Option(None, "--dask", help="Run shards on a Dask cluster: its address, or 'local:N' for N local workers."),
    config: Path = typer.Option(None, "--config", help=CONFIG_HELP),
) -> None:
    """Sample GRPO groups with the conductor, execute, score, and write them to the lake."""
    from conductor.cli.boundary import flow_errors
    from flows.rollout import on_dask, rollout_flow

    cfg = build_config(RolloutConfig, ctx, config, {
        "questions": questions, "lake": lake, "pool": pool, "conductor": conductor, "run_id": run_id,
        "group_size": group_size, "k": k, "seed": seed, "temperature": temperature, "max_tokens": max_tokens,
        "limit": limit, "shard_size": shard_size})
    _check(Path(cfg.pool), {"--conductor": cfg.conductor}, cfg.run_id, cfg.k, cfg.questions, cfg.limit)
    fn = rollout_flow
    if dask:
        check_dask(dask)
    if dask:
        fn = on_dask(rollout_flow, n_workers=int(dask.split(":", 1)[1])) if dask.startswith("local:") else on_dask(rollout_flow, dask)
    with flow_errors():
        out = fn(cfg)
    typer.echo(json.dumps(out, indent=2, default=str))


@app.command("evaluate")
def evaluate_cmd(
    candidate: str = typer.Option(..., "--candidate", help="Candidate policy spec."),
    champion: str = typer.Option("champion", "--champion", help="Champion policy spec (default: the registry's)."),
    questions: str = typer.Argument(..., help="Held-out questions."),
    pool: Path = typer.Option(..., "--pool"),
    lake: str = typer.Option(..., "--lake"),
    out: Path = typer.Option(..., "--out", help="Where evaluation.json goes."),
    samples: int = typer.Option(4, "--samples", min=1, help="Repeated samples per question."),
    seed: int = typer.Option(0, "--seed"),
    limit: int = typer.Option(None, "--limit", min=1),
    heldout: str = typer.Option(None, "--heldout-workers", help="Comma-separated workers forming a held-out sub-pool."),
) -> None:
    """Candidate vs champion on the same questions, pool and seeds; paired statistics per domain."""
    from conductor.cli.boundary import flow_errors
    from conductor.learning.evaluation import EvalReport
    from flows.evaluate import evaluate_flow

    _check(pool, {"--candidate": candidate, "--champion": champion}, questions=questions, limit=limit)
    with flow_errors():
        res = evaluate_flow(candidate=candidate, champion=champion, questions=questions, pool=str(pool), lake=lake,
                            out=str(out), samples=samples, seed=seed, limit=limit,
                            heldout_workers=heldout.split(",") if heldout else None)
    for name, rep in res["reports"].items():
        typer.echo(f"== {name} pool ==\n{EvalReport.from_json(rep).render()}")


@app.command("nightly")
def nightly_cmd(
    ctx: typer.Context,
    pool: Path = typer.Option(None, "--pool", show_default=False, help="Worker pool manifest."),
    train_questions: str = typer.Option(None, "--train", show_default=False, help="Training mix, e.g. gsm8k_train:200,mmlu:200."),
    eval_questions: str = typer.Option(None, "--eval", show_default=False, help="Held-out evaluation questions."),
    work_dir: Path = typer.Option(None, "--work-dir", show_default=False, help="Lake, checkpoints, cache, registry and reports live here."),
    base: str = typer.Option(None, "--base", show_default=False, help="Checkpoint to start from when there is no champion."),
    registry: str = typer.Option(None, "--registry", help="Registry root or mlflow+URI#model (default WORK_DIR/registry)."),
    night: str = typer.Option(None, "--night", help="Night tag (default today, UTC); rerunning a night resumes it."),
    iterations: int = typer.Option(default(N, "iterations"), "--iterations", min=1),
    questions_per_iteration: int = typer.Option(default(N, "questions_per_iteration"), "--questions-per-iteration", min=1),
    group_size: int = typer.Option(default(N, "group_size"), "--group-size", min=2),
    eval_samples: int = typer.Option(default(N, "eval_samples"), "--eval-samples", min=1),
    eval_limit: int = typer.Option(default(N, "eval_limit"), "--eval-limit", min=1),
    max_tokens: int = typer.Option(default(N, "max_tokens"), "--max-tokens", min=16),
    grpo: str = typer.Option(None, "--grpo", help="GRPO config overrides as JSON, e.g. '{\"learning_rate\": 1e-5}'."),
    force: bool = typer.Option(default(N, "force"), "--force", help="Retrain even if the pool is unchanged."),
    max_calls: int = typer.Option(default(N, "max_calls"), "--max-calls", min=1),
    max_dollars: float = typer.Option(default(N, "max_dollars"), "--max-dollars", min=0.0),
    max_hours: float = typer.Option(default(N, "max_hours"), "--max-hours", min=0.0),
    backend: str = typer.Option(default(N, "backend"), "--backend", help="Rollout backend for checkpoints: transformers or vllm."),
    lake: str = typer.Option(None, "--lake", help="Lake root (default WORK_DIR/lake; local path or s3://)."),
    config: Path = typer.Option(None, "--config", help=CONFIG_HELP),
) -> None:
    """Retrain when the pool changed: rollouts -> GRPO x N, evaluate, promote if significantly better, report."""
    from conductor.cli.boundary import flow_errors
    from conductor.data.datasets import DatasetError
    from conductor.data.questionset import check_disjoint, load_questions
    from flows.nightly import nightly_flow

    try:
        overrides = json.loads(grpo) if grpo else None
    except json.JSONDecodeError as e:
        fail(f"--grpo: not JSON: {e.msg} at column {e.colno}")
    cfg = build_config(NightlyConfig, ctx, config, {
        "pool": pool, "train_questions": train_questions, "eval_questions": eval_questions, "work_dir": work_dir,
        "base": base, "registry": registry, "night": night, "iterations": iterations,
        "questions_per_iteration": questions_per_iteration, "group_size": group_size, "eval_samples": eval_samples,
        "eval_limit": eval_limit, "max_tokens": max_tokens, "grpo": overrides, "force": force, "max_calls": max_calls,
        "max_dollars": max_dollars, "max_hours": max_hours, "backend": backend, "lake": lake})
    _check(Path(cfg.pool))
    _check_nightly(cfg)
    try:
        check_disjoint(load_questions(cfg.train_questions), load_questions(cfg.eval_questions))
    except (DatasetError, ValueError, OSError) as e:
        fail(str(e).splitlines()[0])
    with flow_errors():
        res = nightly_flow(cfg)
    typer.echo(json.dumps({k: res.get(k) for k in ("night", "status", "why", "stopped", "decision", "report")}, indent=2, default=str))
