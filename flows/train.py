"""One GRPO step on one stored rollout run: read the run from the lake, update the policy, save a
checkpoint with its lineage, register it (as a candidate: promotion is the evaluation's decision).
A rerun finds the checkpoint already saved and returns it (idempotent).

Sharded full fine-tuning (the paper's 7B on 2 x H100): a config with ``distributed: fsdp`` and
``nproc_per_node`` > 1 (or left unset on a machine with several GPUs) runs the step as ``torchrun``
processes, one per GPU, over the ``train-step`` CLI (``conductor.learning.grpo.launch``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE

from conductor.learning.results import TrainResult
from conductor.run.config import MLflowTracking, TrainConfig


@task(name="grpo-step", cache_policy=NONE, timeout_seconds=None)
def grpo_step_task(c: TrainConfig, nproc_per_node: int = 1) -> TrainResult:
    """The step itself: in this process, or as ``nproc_per_node`` torchrun processes."""
    from conductor.learning.grpo.usage import record_update

    base, lake, run_id, out, checkpoint_id = c.base, c.lake, c.run_id, c.out, c.checkpoint_id
    cfg = c.grpo_config()   # the preset's (default: GRPOConfig's) settings with c.grpo over them
    if nproc_per_node > 1:
        from conductor.learning.grpo.launch import torchrun_train_step

        get_run_logger().info("GRPO step on %s as torchrun with %d processes (%s)", run_id, nproc_per_node,
                              cfg.distributed)
        path, metrics = torchrun_train_step(nproc_per_node, run_id=run_id, lake=lake, base=base, out=out,
                                            checkpoint_id=checkpoint_id, config=cfg.to_json())
        record_update(lake, run_id, None, cfg, metrics, checkpoint_id)   # the lake's training columns (v3)
        return TrainResult(str(path), checkpoint_id, metrics)
    from conductor.lake.reader import load_trajectories
    from conductor.learning.grpo.trainer import grpo_step

    trajectories = load_trajectories(lake, run_id, kind="rollout")
    if not trajectories:
        raise ValueError(f"lake {lake}: rollout run {run_id!r} has no trajectories")
    path, metrics = grpo_step(base, trajectories, cfg, out=out, checkpoint_id=checkpoint_id, reference=c.reference)
    record_update(lake, run_id, trajectories, cfg, metrics, checkpoint_id)
    return TrainResult(str(path), checkpoint_id, metrics)


def log_metrics(tracking: MLflowTracking, metrics: Mapping[str, float | str], step: int,
                params: Mapping[str, object] | None = None) -> str:
    """Log one iteration's metrics to MLflow (``tracking``: ``uri``, ``experiment``, and ``run_id`` or
    ``run_name``); returns the run id so the next iteration continues the same run."""
    from conductor.learning.grpo.tracking import DEFAULT_EXPERIMENT, MetricsTracker

    tracker = MetricsTracker(tracking["uri"], tracking.get("experiment") or DEFAULT_EXPERIMENT,
                             run_id=tracking.get("run_id"), run_name=tracking.get("run_name"))
    if params:
        tracker.log_params(params)
    tracker.log(metrics, step=step)
    return tracker.run_id


@flow(name="conductor-train", persist_result=False)
def train_flow(config: TrainConfig) -> TrainResult:
    """One GRPO step (conductor/run/config.py: ``TrainConfig``); ``out`` is the new checkpoint.

    ``nproc_per_node``: training processes (GPUs) for ``distributed: fsdp``; None = one per visible GPU when
    the config says fsdp, else 1. With more than one the step runs under ``torchrun``.
    ``reference``: the starting policy KL is measured against (``track_kl``) or penalised to (``kl_beta``);
    default ``base``. ``tracking``: MLflow settings (``uri``, ``experiment``, ``run_id``/``run_name``); the
    step's metrics are logged there at ``step`` (default: the checkpoint's iteration) and the result carries
    ``mlflow_run_id``. A resumed step (checkpoint already saved) logs nothing twice.
    """
    from conductor.learning.registry import Registry, read_lineage

    c, log = config, get_run_logger()
    if "://" not in c.out and (Path(c.out) / "lineage.json").is_file():
        result = TrainResult(c.out, c.checkpoint_id, read_lineage(c.out).get("metrics", {}), resumed=True)
        log.info("checkpoint %s already saved at %s: reusing it", c.checkpoint_id, c.out)
    else:
        from conductor.learning.grpo.launch import processes_for

        result = grpo_step_task(c, processes_for(c.grpo_config().to_json(), c.nproc_per_node))
        log.info("GRPO step on %s -> %s: %s", c.run_id, result.uri, result.metrics)
    if c.tracking:
        metrics = {**result.metrics, "rollout_run": c.run_id}
        step = c.step if c.step is not None else int(metrics.get("iteration") or 0)
        result = replace(result, mlflow_run_id=log_metrics(c.tracking, metrics, step, {"grpo": c.grpo or {},
                                                                                        "base": c.base}))
    if c.registry:
        reg = Registry.open(c.registry)
        if c.checkpoint_id not in reg.backend.checkpoints():
            reg.register(result.uri, checkpoint_id=c.checkpoint_id)
    return result
