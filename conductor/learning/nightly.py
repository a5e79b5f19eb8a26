"""The decisions of a nightly run, as plain functions the flow (flows/nightly.py) only sequences.

Whether to retrain (the pool changed since the champion was trained), what each iteration rolls out and
where its checkpoint goes, when the budget stops the night, what the promotion decision records, and which
baselines the report plots: each is decided here, from the ``NightlyConfig`` and what the registry and the
lake hold, so it can be tested without Prefect or a model.
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conductor.run.config import NightlyConfig, RolloutConfig, eval_run_id

if TYPE_CHECKING:
    from conductor.learning.registry import CheckpointEntry, Decision, Registry
    from conductor.run.summary import RunSummary
    from conductor.workers.pool import Pool


@dataclass(frozen=True)
class Night:
    """Where one night works and when it started (its time budget counts from here)."""

    tag: str            # e.g. 20261124; rerunning the same tag resumes the night
    work: Path
    lake: str
    cache: str
    reports: Path
    registry: str
    started: float


def plan_night(config: NightlyConfig, now: float | None = None) -> Night:
    """The night's tag and paths: defaults under WORK_DIR (lake, cache, registry, reports/<tag>)."""
    started = time.time() if now is None else now
    tag = config.night or _dt.datetime.fromtimestamp(started, _dt.UTC).strftime("%Y%m%d")
    work = Path(config.work_dir)
    return Night(tag=tag, work=work, lake=config.lake or str(work / "lake"), cache=str(work / "cache.sqlite"),
                 reports=work / "reports" / tag, registry=config.registry or str(work / "registry"), started=started)


def policy_spec(config: NightlyConfig, uri: str) -> str:
    """The conductor spec that samples from a checkpoint with the night's backend."""
    return f"{config.backend}:{uri}"


def ensure_champion(reg: Registry, base: str, manifest: Pool) -> CheckpointEntry:
    """The champion; with none yet, the untrained base becomes it (a candidate must beat it to replace it)."""
    if reg.champion is None:
        entry = reg.register(base, lineage={"pool_id": manifest.id, "pool_fingerprint": None, "role": "base"},
                             checkpoint_id="base")
        reg.promote(entry.checkpoint_id, reason="initial champion: the untrained base model")
    champion = reg.champion
    if champion is None:
        raise RuntimeError("registry: promoting the base left no champion")
    return champion


def retrain_reason(champion: CheckpointEntry, manifest: Pool, force: bool = False) -> tuple[bool, str]:
    """(retrain?, why): retrain when the champion was trained on another pool (or never trained), or forced."""
    fp = manifest.fingerprint
    trained_on = champion.lineage.get("pool_fingerprint")
    if trained_on == fp and not force:
        return False, (f"pool {manifest.id} (fingerprint {fp}) is unchanged since champion {champion.checkpoint_id} "
                       "was trained: nothing to retrain")
    if trained_on is None and champion.lineage.get("role") == "base":
        return True, f"no trained champion yet: training from the base model {champion.checkpoint_id}"
    if trained_on != fp:
        return True, f"pool {manifest.id} changed (champion {champion.checkpoint_id} trained on {trained_on}, now {fp})"
    return True, f"forced retraining on unchanged pool {manifest.id}"


def served_mix(config: NightlyConfig, night: Night) -> tuple[NightlyConfig, str]:
    """The night's config with its labelled served questions first in the training mix, and a line saying what
    was found (conductor/data/served.py). The selection is written once per night under WORK_DIR/served/<tag>/
    and reused when the night resumes, so its iteration windows do not move."""
    if not config.served_labels:
        return config, ""
    from conductor.data.served import ServedSelection, read_served, select_labelled, write_selection

    out = night.work / "served" / night.tag
    done = sorted(out.glob("*.jsonl")) if out.is_dir() else []
    if done:
        path, note = done[0], f"served questions: reusing {done[0]} (this night's selection)"
    else:
        selection: ServedSelection = select_labelled(read_served(config.served_lake or night.lake),
                                                     config.served_labels)
        if not selection.rows:
            return config, f"served questions: none labelled ({selection.describe()})"
        path, note = write_selection(selection, config.served_labels, out), f"served questions: {selection.describe()}"
    return config.model_copy(update={"train_questions": f"{path},{config.train_questions}"}), note


def iteration_id(night: Night, i: int) -> str:
    """Iteration i's rollout run id, which is also its checkpoint id."""
    return f"nightly-{night.tag}-it{i}"


def iteration_rollout(config: NightlyConfig, night: Night, i: int, uri: str, checkpoint_id: str) -> RolloutConfig:
    """Iteration i's rollouts: the next window of the training mix, sampled from the current checkpoint."""
    return RolloutConfig(questions=config.train_questions, lake=night.lake, pool=config.pool,
                         conductor=policy_spec(config, uri), run_id=iteration_id(night, i),
                         group_size=config.group_size, k=config.k, seed=config.seed + i, max_tokens=config.max_tokens,
                         limit=config.questions_per_iteration, offset=i * config.questions_per_iteration,
                         shard_size=config.shard_size, cache=night.cache, checkpoint_id=checkpoint_id,
                         fewshot=config.fewshot, limits=config.limits)


def iteration_record(i: int, run_id: str, rollout: RunSummary) -> dict[str, Any]:
    """What the report shows of an iteration's rollouts (the training step adds checkpoint and loss)."""
    return {"iteration": i, "run_id": run_id, "trajectories": rollout.trajectories,
            "mean_reward": rollout.mean_reward, "accuracy": rollout.accuracy}


def checkpoint_lineage(lineage: dict[str, Any], manifest: Pool, night: Night) -> dict[str, Any]:
    """A trained checkpoint's lineage: what it was trained on, so tomorrow's night knows whether to retrain."""
    return {**lineage, "pool_id": manifest.id, "pool_fingerprint": manifest.fingerprint, "night": night.tag}


def night_usage(lake: str, night: str) -> dict[str, float]:
    """Calls and dollars spent by this night's runs so far (read from the lake, so resumes count too)."""
    import polars as pl

    from conductor.lake.reader import scan

    df = scan(lake, "trajectories").filter(pl.col("run_id").str.contains(f"nightly-{night}-", literal=True)).select(
        pl.col("n_calls").sum().alias("calls"), pl.col("cost_usd").sum().alias("dollars")).collect()
    row = df.to_dicts()[0] if df.height else {}
    return {"calls": float(row.get("calls") or 0), "dollars": float(row.get("dollars") or 0.0)}


def over_budget(usage: dict[str, float], started: float, max_calls: int | None, max_dollars: float | None,
                max_hours: float | None) -> str | None:
    """Why the night must stop now, or None.

    >>> over_budget({"calls": 120, "dollars": 0.5}, time.time(), 100, None, None)
    'call budget reached: 120 >= 100'
    """
    if max_calls is not None and usage["calls"] >= max_calls:
        return f"call budget reached: {usage['calls']:.0f} >= {max_calls}"
    if max_dollars is not None and usage["dollars"] >= max_dollars:
        return f"dollar budget reached: ${usage['dollars']:.4f} >= ${max_dollars}"
    if max_hours is not None and (time.time() - started) / 3600 >= max_hours:
        return f"time budget reached: {(time.time() - started) / 3600:.2f} h >= {max_hours} h"
    return None


def budget_stop(config: NightlyConfig, night: Night) -> str | None:
    """Why the night must stop now (its runs so far against the configured budget), or None."""
    return over_budget(night_usage(night.lake, night.tag), night.started, config.max_calls, config.max_dollars,
                       config.max_hours)


def tracking_settings(config: NightlyConfig, night: Night, warn: Callable[[str], None]) -> dict[str, Any] | None:
    """MLflow settings for this night's run (one run per night; a rerun continues it), or None."""
    import importlib.util

    from conductor.learning.grpo.tracking import default_tracking_uri

    if config.tracking_uri == "none":
        return None
    if importlib.util.find_spec("mlflow") is None:
        if config.tracking_uri:
            raise ValueError(f"tracking_uri {config.tracking_uri!r}: mlflow is not installed (install the 'mlflow' extra)")
        warn("mlflow is not installed: per-iteration metrics go to the report only")
        return None
    saved = night.reports / "mlflow.json"
    uri = config.tracking_uri or default_tracking_uri(night.work)
    tracking: dict[str, Any] = {"uri": uri, "experiment": "conductor-nightly", "run_name": f"nightly-{night.tag}"}
    if saved.is_file():
        prev = json.loads(saved.read_text())
        if prev.get("tracking_uri") == uri:
            tracking["run_id"] = prev.get("run_id")
    return tracking


def decision_record(d: Decision) -> dict[str, Any]:
    """The promotion decision as the report and the flow's result show it."""
    return {"promote": d.promote, "reason": d.reason, "candidate_id": d.candidate_id, "champion_id": d.champion_id,
            "p_value": d.p_value, "diff": d.diff, "regressions": d.regressions}


def baseline_rollouts(config: NightlyConfig, night: Night, manifest: Pool) -> list[tuple[str, RolloutConfig]]:
    """(worker name, eval run) for every single worker of the pool: the report's accuracy-per-dollar baselines."""
    out = []
    for i, w in enumerate(manifest.workers):
        run = eval_run_id(f"fixed:{i}", config.eval_questions, config.eval_limit, config.pool, config.eval_samples,
                          config.seed)
        out.append((w.name, RolloutConfig(questions=config.eval_questions, lake=night.lake, pool=config.pool,
                                          conductor=f"fixed:{i}", run_id=run, group_size=config.eval_samples,
                                          seed=config.seed, limit=config.eval_limit, shard_size=config.shard_size,
                                          cache=night.cache, kind="eval", checkpoint_id=f"fixed:{i}",
                                          limits=config.limits)))
    return out


def objective_of(config: NightlyConfig) -> dict[str, Any] | None:
    """The cost objective the night trains for (``grpo: {objective: {...}}``), which its evaluation then compares
    candidate and champion on; None: accuracy, the paper's reward.

    >>> from conductor.run.config import NightlyConfig
    >>> base = dict(pool="p", train_questions="t", eval_questions="e", work_dir="w", base="b")
    >>> objective_of(NightlyConfig(**base)), objective_of(NightlyConfig(**base, grpo={"objective": {"cost_lambda": 0.2}}))
    (None, {'cost_lambda': 0.2})
    """
    obj = (config.grpo or {}).get("objective")
    return dict(obj) if obj else None


def night_status(stopped: str | None, decision: dict[str, Any] | None) -> str:
    """stopped (the budget ran out), promoted, or challenger (trained, not significantly better, or not evaluated).

    >>> night_status(None, {"promote": True}), night_status("call budget reached", None), night_status(None, None)
    ('promoted', 'stopped', 'challenger')
    """
    return "stopped" if stopped else ("promoted" if decision and decision["promote"] else "challenger")
