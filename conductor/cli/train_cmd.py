"""`conductor train-step | eval-compare | registry show|register|promote|rollback`: one GRPO update from a
stored rollout run, paired comparison of two evaluation runs, and the champion/challenger registry."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer

from conductor.cli import app, fail

if TYPE_CHECKING:
    from conductor.learning.grpo.config import GRPOConfig
    from conductor.learning.registry import Registry

registry_app = typer.Typer(help="Checkpoint registry: champion/challenger aliases, history, rollback.",
                           no_args_is_help=True)
app.add_typer(registry_app, name="registry")

REGISTRY_HELP = "Registry root (local dir or s3://...) or mlflow+<tracking-uri>#<model>; default $CONDUCTOR_REGISTRY."


def _registry(root: str | None, create: bool = False) -> Registry:
    """The registry at ``root``; only ``register`` may create one (a typo must not become an empty registry)."""
    from conductor.learning.registry import Registry, RegistryError

    root = root or os.environ.get("CONDUCTOR_REGISTRY")
    if not root:
        fail("--registry not given and $CONDUCTOR_REGISTRY not set")
    if not root.startswith("mlflow+"):
        import fsspec

        try:
            fs, path = fsspec.core.url_to_fs(root)
            exists, is_file = fs.exists(path), fs.isfile(path)
        except (OSError, ValueError, ImportError) as e:
            fail(f"registry {root}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
        if is_file:
            fail(f"registry {root}: is a file; a registry is a directory (holding registry.json)")
        if not exists and not create:
            fail(f"registry {root}: no such registry (`conductor registry register` creates one)")
    try:
        return Registry.open(root)
    except (RegistryError, ImportError) as e:
        fail(f"registry {root}: {e}")


def _fail(message: str) -> NoReturn:
    """``fail`` on rank 0 only: under ``torchrun`` every rank meets the same error, one line is enough."""
    from conductor.learning.grpo.distributed import world

    if world().is_main:
        fail(message)
    raise typer.Exit(2)


def _grpo_config(config: Path | None, preset: str | None, overrides: str | None) -> GRPOConfig:
    from conductor.learning.grpo.config import GRPOConfig, GRPOConfigError

    try:
        if config is not None:
            base = GRPOConfig.load(config).to_json()
        elif preset == "cpu":
            base = GRPOConfig.cpu().to_json()
        elif preset == "paper":
            base = GRPOConfig.paper().to_json()
        elif preset is None:
            base = GRPOConfig().to_json()
        else:
            _fail(f"--preset: must be cpu or paper, not {preset!r}")
        extra = json.loads(overrides) if overrides else {}
        if not isinstance(extra, dict):
            _fail("--set: must be a JSON object of GRPOConfig fields")
        return GRPOConfig.from_dict({**base, **extra}, "--set" if extra else str(config or "config"))
    except GRPOConfigError as e:
        _fail(str(e))
    except json.JSONDecodeError as e:
        _fail(f"--set: not JSON: {e.msg} at column {e.colno}")


@app.command("train-step")
def train_step(
    run: str = typer.Option(..., "--run", help="Rollout run id to train on (read from the lake)."),
    lake: str = typer.Option(..., "--lake", help="Lake root (local path or s3://)."),
    from_: str = typer.Option(..., "--from", help="Parent checkpoint: HF dir, .gguf file, or s3:// checkpoint."),
    out: str = typer.Option(..., "--out", help="Where the new checkpoint goes (local dir or s3://); must not exist."),
    config: Path = typer.Option(None, "--config", help="GRPO config file (YAML/JSON; may say 'preset: cpu')."),
    preset: str = typer.Option(None, "--preset", help="cpu or paper (when no --config)."),
    set_: str = typer.Option(None, "--set", help="JSON overrides, e.g. '{\"learning_rate\": 1e-5}'."),
    register: str = typer.Option(None, "--register", help="Also register the checkpoint in this registry."),
    checkpoint_id: str = typer.Option(None, "--id", help="Checkpoint id (default: the --out directory name)."),
) -> None:
    """One GRPO update on a stored rollout run; prints the metrics as JSON.

    Sharded over GPUs: ``torchrun --standalone --nproc_per_node N -m conductor.cli train-step ...`` with a
    config that says ``distributed: fsdp`` (the paper preset does); only rank 0 writes, registers and prints.
    """
    cfg = _grpo_config(config, preset, set_)
    from conductor.lake import load_trajectories
    from conductor.learning.grpo import distributed

    try:
        trajectories = load_trajectories(lake, run)
    except (OSError, ValueError) as e:
        _fail(f"lake {lake}: {e}")
    if not trajectories:
        _fail(f"lake {lake}: no rollout trajectories for run {run!r}")
    from conductor.learning.grpo.trainer import TrainError, grpo_step

    try:
        path, metrics = grpo_step(from_, trajectories, cfg, out=out, checkpoint_id=checkpoint_id)
    except TrainError as e:
        distributed.shutdown(wait_for_peers=False)
        _fail(str(e))
    except BaseException:
        distributed.shutdown(wait_for_peers=False)
        raise
    distributed.shutdown()
    if not distributed.world().is_main:
        return
    if register:
        _registry(register, create=True).register(path, checkpoint_id=checkpoint_id)
    typer.echo(json.dumps({"checkpoint": path, "metrics": metrics}, indent=2, default=str))


@app.command("eval-compare")
def eval_compare(
    lake: str = typer.Option(..., "--lake", help="Lake root holding both evaluation runs."),
    candidate_run: str = typer.Option(..., "--candidate-run", help="Evaluation run of the candidate."),
    champion_run: str = typer.Option(..., "--champion-run", help="Evaluation run of the champion (same questions)."),
    metric: str = typer.Option("correct", "--metric", help="correct (accuracy) or reward."),
    n_boot: int = typer.Option(10_000, "--n-boot", min=100),
    seed: int = typer.Option(0, "--seed"),
    out: Path = typer.Option(None, "--out", help="Write the EvalReport JSON here."),
    candidate_id: str = typer.Option("", "--candidate-id"),
    champion_id: str = typer.Option("", "--champion-id"),
) -> None:
    """Paired comparison of two evaluation runs: mean ± s.e. per domain, bootstrap and McNemar, calls and $."""
    if metric not in ("correct", "reward"):
        fail(f"--metric: must be correct or reward, not {metric!r}")
    from conductor.lake import load_trajectories
    from conductor.learning.evaluation import compare

    try:
        cand = load_trajectories(lake, candidate_run, kind="eval")
        champ = load_trajectories(lake, champion_run, kind="eval")
    except (OSError, ValueError) as e:
        fail(f"lake {lake}: {e}")
    for name, rows in (("candidate", cand), ("champion", champ)):
        if not rows:
            fail(f"lake {lake}: no evaluation rows for the {name} run")
    try:
        report = compare(cand, champ, metric=metric, n_boot=n_boot, seed=seed,  # type: ignore[arg-type]
                         candidate_id=candidate_id, champion_id=champion_id)
    except ValueError as e:
        fail(str(e))
    if out is not None:
        from conductor.files import atomic_write_text

        atomic_write_text(out, report.dumps())
    typer.echo(report.render())


@registry_app.command("show")
def registry_show(
    registry: str = typer.Option(None, "--registry", help=REGISTRY_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the whole registry as JSON."),
    history: int = typer.Option(10, "--history", min=0, help="How many recent history events to print."),
) -> None:
    """Aliases, checkpoints and recent history."""
    from conductor.learning.registry import RegistryError

    reg = _registry(registry)
    try:
        state = reg.show()
    except RegistryError as e:   # a corrupt registry.json: one line
        fail(str(e))
    if as_json:
        typer.echo(json.dumps(state, indent=2, default=str))
        return
    for alias, cid in sorted(state["aliases"].items()):
        typer.echo(f"{alias}: {cid} ({state['checkpoints'][cid]['uri']})" if cid in state["checkpoints"] else f"{alias}: {cid}")
    typer.echo(f"{len(state['checkpoints'])} checkpoints")
    for ev in state["history"][-history:] if history else []:
        prev = f" (previous {ev.get('previous')})" if "alias" in ev else ""
        typer.echo(f"{ev.get('time', '')} {ev.get('action')} {ev.get('alias', '')} {ev.get('checkpoint_id')}{prev} "
                   f"{ev.get('reason', '')}".replace("  ", " ").rstrip())


@registry_app.command("register")
def registry_register(
    uri: str = typer.Argument(..., help="Checkpoint directory or URL (its lineage.json is read)."),
    checkpoint_id: str = typer.Option(None, "--id", help="Checkpoint id (default: lineage id or directory name)."),
    registry: str = typer.Option(None, "--registry", help=REGISTRY_HELP),
) -> None:
    """Add a checkpoint to the registry."""
    from conductor.learning.registry import RegistryError, check_checkpoint_dir

    try:
        check_checkpoint_dir(uri)   # a missing path, an empty directory or /etc is not a checkpoint
        e = _registry(registry, create=True).register(uri, checkpoint_id=checkpoint_id)
    except RegistryError as err:
        fail(str(err))
    typer.echo(f"registered {e.checkpoint_id} {e.uri}")


@registry_app.command("promote")
def registry_promote(
    checkpoint_id: str = typer.Argument(..., help="Registered checkpoint id."),
    report: Path = typer.Option(None, "--report", help="EvalReport JSON of this candidate vs the champion."),
    force: bool = typer.Option(False, "--force", help="Promote without a report (recorded as manual)."),
    alpha: float = typer.Option(0.05, "--alpha", min=0.0, max=1.0),
    test: str = typer.Option("bootstrap", "--test", help="bootstrap, mcnemar or both."),
    tolerance: float = typer.Option(0.02, "--tolerance", min=0.0, help="Largest allowed per-domain drop."),
    reason: str = typer.Option("manual promotion", "--reason"),
    registry: str = typer.Option(None, "--registry", help=REGISTRY_HELP),
) -> None:
    """Promote if significantly better with no domain regression; else record as challenger. Exit 1 if not promoted."""
    from conductor.learning.evaluation import EvalReport
    from conductor.learning.registry import PromotionPolicy, RegistryError

    if test not in ("bootstrap", "mcnemar", "both"):
        fail(f"--test: must be bootstrap, mcnemar or both, not {test!r}")
    from conductor.learning.registry import check_checkpoint_dir

    reg = _registry(registry)
    try:
        check_checkpoint_dir(reg.get(checkpoint_id).uri)   # its files are still there
        if force:
            reg.promote(checkpoint_id, reason)
            typer.echo(f"promoted {checkpoint_id}: {reason}")
            return
        rep = None
        if report is not None:
            try:
                rep = EvalReport.from_json(json.loads(report.read_text()))
            except (OSError, ValueError, KeyError, TypeError) as e:
                fail(f"{report}: not an EvalReport JSON ({e})")
        d = reg.promote_if_better(checkpoint_id, rep, PromotionPolicy(alpha=alpha, test=test,  # type: ignore[arg-type]
                                                                      max_domain_regression=tolerance))
    except RegistryError as e:
        fail(str(e))
    typer.echo(f"{'promoted' if d.promote else 'challenger'} {checkpoint_id}: {d.reason}")
    if not d.promote:
        raise typer.Exit(1)


@registry_app.command("rollback")
def registry_rollback(
    reason: str = typer.Option("manual rollback", "--reason"),
    registry: str = typer.Option(None, "--registry", help=REGISTRY_HELP),
) -> None:
    """Point the champion back at the previous champion."""
    from conductor.learning.registry import RegistryError

    try:
        e = _registry(registry).rollback(reason)
    except RegistryError as err:
        fail(str(err))
    typer.echo(f"champion is now {e.checkpoint_id} ({e.uri})")
