"""`conductor train-step | eval-compare | registry show|register|promote|rollback`: one GRPO update from a
stored rollout run, paired comparison of two evaluation runs, and the champion/challenger registry."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from conductor.cli import app, fail
from conductor.cli.run_options import build_config, config_options
from conductor.run.command_config import (
    EvalCompareConfig,
    PromoteConfig,
    RegisterConfig,
    RegistryShowConfig,
    RollbackConfig,
)
from conductor.run.config import TrainStepConfig

if TYPE_CHECKING:
    from conductor.learning.registry import Registry

registry_app = typer.Typer(help="Checkpoint registry: champion/challenger aliases, history, rollback.",
                           no_args_is_help=True)
app.add_typer(registry_app, name="registry")


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


@app.command("train-step")
@config_options(TrainStepConfig, file=False, exclude=("nproc_per_node", "reference", "tracking", "step"),
                flags={"run_id": "--run", "base": "--from", "grpo": "--set", "registry": "--register",
                       "checkpoint_id": "--id"})
def train_step(
    ctx: typer.Context,
    config: Path = typer.Option(None, "--config", help="GRPO config file (YAML/JSON; may say 'preset: cpu')."),
    **options: Any,
) -> None:
    """One GRPO update on a stored rollout run; prints the metrics as JSON.

    Sharded over GPUs: ``torchrun --standalone --nproc_per_node N -m conductor.cli train-step ...`` with a
    config that says ``distributed: fsdp`` (the paper preset does); only rank 0 writes, registers and prints.
    """
    from conductor.learning.grpo.config import GRPOConfigError

    step = build_config(TrainStepConfig, ctx, None, options, error=_fail)   # --config is a GRPO config file
    try:
        cfg = step.grpo_config(config, source="--set")
    except GRPOConfigError as e:
        _fail(str(e))
    from conductor.lake import load_trajectories
    from conductor.learning.grpo import distributed

    lake, run = step.lake, step.run_id
    try:
        trajectories = load_trajectories(lake, run)
    except (OSError, ValueError) as e:
        _fail(f"lake {lake}: {e}")
    if not trajectories:
        _fail(f"lake {lake}: no rollout trajectories for run {run!r}")
    from conductor.learning.grpo.trainer import TrainError, grpo_step

    try:
        path, metrics = grpo_step(step.base, trajectories, cfg, out=step.out, checkpoint_id=step.checkpoint_id)
    except TrainError as e:
        distributed.shutdown(wait_for_peers=False)
        _fail(str(e))
    except BaseException:
        distributed.shutdown(wait_for_peers=False)
        raise
    distributed.shutdown()
    if not distributed.world().is_main:
        return
    if step.registry:
        _registry(step.registry, create=True).register(path, checkpoint_id=step.checkpoint_id)
    typer.echo(json.dumps({"checkpoint": path, "metrics": metrics}, indent=2, default=str))


@app.command("eval-compare")
@config_options(EvalCompareConfig)
def eval_compare(ctx: typer.Context, **options: Any) -> None:
    """Paired comparison of two evaluation runs: mean ± s.e. per domain, bootstrap and McNemar, calls and $."""
    c = build_config(EvalCompareConfig, ctx, None, options)
    from conductor.lake import load_trajectories
    from conductor.learning.evaluation import compare

    try:
        cand = load_trajectories(c.lake, c.candidate_run, kind="eval")
        champ = load_trajectories(c.lake, c.champion_run, kind="eval")
    except (OSError, ValueError) as e:
        fail(f"lake {c.lake}: {e}")
    for name, rows in (("candidate", cand), ("champion", champ)):
        if not rows:
            fail(f"lake {c.lake}: no evaluation rows for the {name} run")
    try:
        report = compare(cand, champ, metric=c.metric, n_boot=c.n_boot, seed=c.seed, candidate_id=c.candidate_id,
                         champion_id=c.champion_id)
    except ValueError as e:
        fail(str(e))
    if c.out is not None:
        from conductor.files import atomic_write_text

        atomic_write_text(Path(c.out), report.dumps())
    typer.echo(report.render())


@registry_app.command("show")
@config_options(RegistryShowConfig)
def registry_show(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print the whole registry as JSON."),
    **options: Any,
) -> None:
    """Aliases, checkpoints and recent history."""
    from conductor.learning.registry import RegistryError

    c = build_config(RegistryShowConfig, ctx, None, options)
    history = c.history
    reg = _registry(c.registry)
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
@config_options(RegisterConfig, flags={"checkpoint_id": "--id"})
def registry_register(
    ctx: typer.Context,
    uri: str = typer.Argument(..., help="Checkpoint directory or URL (its lineage.json is read)."),
    **options: Any,
) -> None:
    """Add a checkpoint to the registry."""
    from conductor.learning.registry import RegistryError, check_checkpoint_dir

    c = build_config(RegisterConfig, ctx, None, options)
    try:
        check_checkpoint_dir(uri)   # a missing path, an empty directory or /etc is not a checkpoint
        e = _registry(c.registry, create=True).register(uri, checkpoint_id=c.checkpoint_id)
    except RegistryError as err:
        fail(str(err))
    typer.echo(f"registered {e.checkpoint_id} {e.uri}")


@registry_app.command("promote")
@config_options(PromoteConfig)
def registry_promote(
    ctx: typer.Context,
    checkpoint_id: str = typer.Argument(..., help="Registered checkpoint id."),
    **options: Any,
) -> None:
    """Promote if significantly better with no domain regression; else record as challenger. Exit 1 if not promoted."""
    from conductor.learning.evaluation import EvalReport
    from conductor.learning.registry import RegistryError, check_checkpoint_dir

    c = build_config(PromoteConfig, ctx, None, options)
    reg = _registry(c.registry)
    try:
        check_checkpoint_dir(reg.get(checkpoint_id).uri)   # its files are still there
        if c.force:
            reg.promote(checkpoint_id, c.reason)
            typer.echo(f"promoted {checkpoint_id}: {c.reason}")
            return
        rep = None
        if c.report is not None:
            try:
                rep = EvalReport.from_json(json.loads(Path(c.report).read_text()))
            except (OSError, ValueError, KeyError, TypeError) as e:
                fail(f"{c.report}: not an EvalReport JSON ({e})")
        d = reg.promote_if_better(checkpoint_id, rep, c.policy())
    except RegistryError as e:
        fail(str(e))
    typer.echo(f"{'promoted' if d.promote else 'challenger'} {checkpoint_id}: {d.reason}")
    if not d.promote:
        raise typer.Exit(1)


@registry_app.command("rollback")
@config_options(RollbackConfig)
def registry_rollback(ctx: typer.Context, **options: Any) -> None:
    """Point the champion back at the previous champion."""
    from conductor.learning.registry import RegistryError

    c = build_config(RollbackConfig, ctx, None, options)
    try:
        e = _registry(c.registry).rollback(c.reason)
    except RegistryError as err:
        fail(str(err))
    typer.echo(f"champion is now {e.checkpoint_id} ({e.uri})")
