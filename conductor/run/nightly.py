"""The decisions of a nightly run, as plain functions and one loop the flow (flows/nightly.py) only sequences.

Whether to retrain (the pool changed since the champion was trained), what each iteration rolls out and
where its checkpoint goes, when the budget stops the night, what the promotion decision records, and which
baselines the report plots: each is decided here, from the ``NightlyConfig`` and what the registry and the
lake hold, so it can be tested without Prefect or a model. The stages that run work (rollouts, a GRPO step)
arrive as keyword hooks (``NightLoop``): the flow hands in its subflows.

WHY beside the run configurations (conductor/run/): a night is a sequence of runs configured by
``NightlyConfig``; the learning library below (registry, GRPO, evaluation) knows nothing of run configurations.
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conductor.run.config import (
    EvaluateConfig,
    MLflowTracking,
    NightlyConfig,
    RolloutConfig,
    TrainConfig,
    eval_run_id,
)
from conductor.run.nightly_report import Point

if TYPE_CHECKING:
    from conductor.learning.registry import CheckpointEntry, Decision, Registry
    from conductor.learning.results import EvalResult, TrainResult
    from conductor.policy.spec import ConductorSpec
    from conductor.run.summary import RunSummary
    from conductor.workers.pool import Pool

Rollout = Callable[[RolloutConfig], "RunSummary"]     # a rollout (or eval) run: the flow's rollout subflow
Train = Callable[[TrainConfig], "TrainResult"]        # one GRPO step: the flow's train subflow


@dataclass
class IterationRecord:
    """One iteration of the night: its rollouts, then (when the step ran) its checkpoint and loss.

    >>> IterationRecord(0, "nightly-t-it0", 8, 0.5, 0.25).to_json()
    {'iteration': 0, 'run_id': 'nightly-t-it0', 'trajectories': 8, 'mean_reward': 0.5, 'accuracy': 0.25}
    """

    iteration: int
    run_id: str
    trajectories: int
    mean_reward: float | None
    accuracy: float | None
    checkpoint_id: str | None = None
    loss: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The shape nightly.md and the flow's result have always had (checkpoint and loss once trained)."""
        out: dict[str, Any] = {"iteration": self.iteration, "run_id": self.run_id, "trajectories": self.trajectories,
                               "mean_reward": self.mean_reward, "accuracy": self.accuracy}
        if self.checkpoint_id is not None:
            out.update(checkpoint_id=self.checkpoint_id, loss=self.loss)
        return out


@dataclass(frozen=True)
class HeadroomSummary:
    """The headroom check run before training (conductor/stats/headroom/), as the report shows it."""

    verdict: str
    verdict_line: str
    evidence: tuple[str, ...]
    markdown: str

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "verdict_line": self.verdict_line, "evidence": list(self.evidence),
                "markdown": self.markdown}


@dataclass(frozen=True)
class NightResult:
    """What a night did: the flow's result; ``to_json()`` is the shape ``conductor nightly`` prints.

    >>> NightResult("t", "skipped", "pool unchanged", "r/nightly.md").to_json()
    {'night': 't', 'status': 'skipped', 'why': 'pool unchanged', 'report': 'r/nightly.md'}
    """

    night: str
    status: str            # skipped | stopped | promoted | challenger
    why: str
    report: str
    stopped: str | None = None
    iterations: tuple[IterationRecord, ...] = ()
    decision: dict[str, Any] | None = None     # decision_record
    headroom: HeadroomSummary | None = None

    def to_json(self) -> dict[str, Any]:
        if self.status == "skipped":
            return {"night": self.night, "status": self.status, "why": self.why, "report": self.report}
        return {"night": self.night, "status": self.status, "why": self.why, "stopped": self.stopped,
                "iterations": [it.to_json() for it in self.iterations], "decision": self.decision,
                "report": self.report, "headroom": self.headroom.verdict if self.headroom else None}


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


def policy_spec(config: NightlyConfig, uri: str) -> ConductorSpec:
    """The conductor spec that samples from a checkpoint with the night's backend."""
    from conductor.policy.spec import parse_conductor_spec

    return parse_conductor_spec(f"{config.backend}:{uri}")


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


def iteration_record(i: int, run_id: str, rollout: RunSummary) -> IterationRecord:
    """What the report shows of an iteration's rollouts (the training step adds checkpoint and loss)."""
    return IterationRecord(i, run_id, rollout.trajectories, rollout.mean_reward, rollout.accuracy)


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


def tracking_settings(config: NightlyConfig, night: Night, warn: Callable[[str], None]) -> MLflowTracking | None:
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
    tracking: MLflowTracking = {"uri": uri, "experiment": "conductor-nightly", "run_name": f"nightly-{night.tag}"}
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
    from conductor.policy.spec import FixedSpec

    out = []
    for i, w in enumerate(manifest.workers):
        run = eval_run_id(f"fixed:{i}", config.eval_questions, config.eval_limit, config.pool, config.eval_samples,
                          config.seed)
        out.append((w.name, RolloutConfig(questions=config.eval_questions, lake=night.lake, pool=config.pool,
                                          conductor=FixedSpec(worker=i), run_id=run, group_size=config.eval_samples,
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


@dataclass
class NightLoop:
    """K iterations of rollouts -> GRPO step from the champion, each checkpoint registered as it is made; the
    budget is checked after every stage. ``rollout`` and ``train`` run the work (the flow's subflows)."""

    config: NightlyConfig
    night: Night
    registry: Registry
    champion: CheckpointEntry
    manifest: Pool
    rollout: Rollout
    train: Train
    warn: Callable[[str], None]

    def run(self) -> tuple[list[IterationRecord], str, str | None]:
        """(iterations, last checkpoint's URI, why the budget stopped the night or None)."""
        config, night = self.config, self.night
        tracking = tracking_settings(config, night, self.warn)
        current, current_id = self.champion.uri, self.champion.checkpoint_id
        its: list[IterationRecord] = []
        history: list[dict[str, Any]] = []
        stopped = None
        for i in range(config.iterations):
            run_id = iteration_id(night, i)
            it = iteration_record(i, run_id, self.rollout(iteration_rollout(config, night, i, current, current_id)))
            its.append(it)
            if (stopped := budget_stop(config, night)):
                break
            trained = self.train(TrainConfig(base=current, lake=night.lake, run_id=run_id,
                                             out=str(night.work / "checkpoints" / run_id), checkpoint_id=run_id,
                                             grpo=config.grpo, reference=self.champion.uri, tracking=tracking,
                                             step=i + 1))
            continue_tracking(tracking, trained, night)
            history.append({**trained.metrics, "iteration": i + 1})
            self._register(trained, run_id)
            it.checkpoint_id, it.loss = run_id, trained.loss
            current, current_id = trained.uri, run_id
            if (stopped := budget_stop(config, night)):
                break
        plot_training_curves(history, night, tracking)
        return its, current, stopped

    def _register(self, trained: TrainResult, run_id: str) -> None:
        """Register the iteration's checkpoint (once: a resumed night finds it registered)."""
        if run_id not in self.registry.backend.checkpoints():
            from conductor.learning.registry import read_lineage

            self.registry.register(trained.uri, checkpoint_id=run_id,
                                   lineage=checkpoint_lineage(read_lineage(trained.uri), self.manifest, self.night))


def continue_tracking(tracking: MLflowTracking | None, trained: TrainResult, night: Night) -> None:
    """The next iteration logs into the same MLflow run; a rerun of the night finds it in mlflow.json."""
    if tracking is None or not trained.mlflow_run_id:
        return
    from conductor.files import atomic_write_text

    tracking["run_id"] = trained.mlflow_run_id
    atomic_write_text(night.reports / "mlflow.json",
                      json.dumps({"tracking_uri": tracking["uri"], "run_id": tracking["run_id"]}, indent=1))


def plot_training_curves(history: list[dict[str, Any]], night: Night, tracking: MLflowTracking | None) -> None:
    if not history:
        return
    from conductor.learning.grpo.tracking import MetricsTracker, plot_curves

    curves = plot_curves(history, night.reports / "training-curves.png", title=f"nightly {night.tag}: GRPO")
    if tracking is not None and tracking.get("run_id"):
        MetricsTracker(tracking["uri"], run_id=tracking["run_id"]).log_artifact(curves)


def night_headroom(config: NightlyConfig, night: Night, manifest: Pool, rollout: Rollout) -> HeadroomSummary:
    """Before training on a new pool: every worker alone on the evaluation questions (the same runs the report's
    baselines reuse), then the headroom check over them (conductor/stats/headroom/): pool- or router-bound."""
    from conductor.lake.reader import scan
    from conductor.stats.headroom import OutcomeMatrix, headroom_report

    rows = []
    for name, baseline in baseline_rollouts(config, night, manifest):
        rollout(baseline)
        cols = ["question_id", "question", "domain", "sample_index", "correct", "infra_failed", "cost_usd"]
        rows += [{**r, "worker": name} for r in scan(night.lake, kind="eval", run_id=baseline.run_id)
                 .select(cols).collect().to_dicts()]
    report = headroom_report(OutcomeMatrix.from_rows(rows), seed=config.seed)
    paths = report.write(night.reports / "headroom")
    return HeadroomSummary(report.verdict, report.verdict_line, tuple(report.evidence), str(paths["markdown"]))


def night_evaluation(config: NightlyConfig, night: Night, champion: CheckpointEntry, candidate_uri: str,
                     candidate_id: str) -> EvaluateConfig:
    """The night's last checkpoint against the champion on the held-out questions."""
    return EvaluateConfig(
        candidate=policy_spec(config, candidate_uri), champion=policy_spec(config, champion.uri),
        questions=config.eval_questions, pool=config.pool, lake=night.lake, out=str(night.reports),
        samples=config.eval_samples, seed=config.seed, max_tokens=config.max_tokens, k=config.k,
        heldout_workers=config.heldout_workers, limit=config.eval_limit, cache=night.cache,
        shard_size=config.shard_size, candidate_id=candidate_id, champion_id=champion.checkpoint_id,
        fewshot=config.fewshot, limits=config.limits, objective=objective_of(config))


def promote(config: NightlyConfig, night: Night, reg: Registry, champion: CheckpointEntry, manifest: Pool,
            evaluation: EvalResult, rollout: Rollout) -> tuple[dict[str, Any], list[Point], str]:
    """Promote if significantly better; (decision, accuracy-per-dollar points, the candidate's eval run)."""
    from conductor.learning.registry import PromotionPolicy
    from conductor.run.summary import run_summary

    report = evaluation.main
    decision = decision_record(reg.promote_if_better(report.candidate_id, report,
                                                     PromotionPolicy(**(config.promotion or {}))))
    runs = evaluation.runs["main"]
    points = []
    for label, cid, kind in ((report.candidate_id, report.candidate_id, "candidate"),
                             (champion.checkpoint_id, report.champion_id, "champion")):
        s, _ = run_summary(night.lake, runs[cid], "eval")
        points.append(Point(label, s.accuracy, s.dollars_per_question, kind))
    for name, baseline in (baseline_rollouts(config, night, manifest) if config.baselines else []):
        rollout(baseline)
        s, _ = run_summary(night.lake, baseline.run_id, "eval")
        points.append(Point(name, s.accuracy, s.dollars_per_question, "worker"))
    return decision, points, runs[report.candidate_id]


def skipped_night(night: Night, manifest: Pool, why: str) -> NightResult:
    """Nothing to retrain: the report says why, nothing else."""
    from conductor.run.nightly_report import render_nightly_report

    path = render_nightly_report(night.reports, pool_id=manifest.id, decision=None, why=why, iterations=[],
                                 evaluation=None, points=[])
    return NightResult(night.tag, "skipped", why, str(path))


def night_report(night: Night, manifest: Pool, why: str, iterations: list[IterationRecord], *,
                 evaluation: EvalResult | None = None, decision: dict[str, Any] | None = None,
                 points: list[Point] | None = None, eval_run: str | None = None, stopped: str | None = None,
                 headroom: HeadroomSummary | None = None) -> NightResult:
    """Write the morning-after report (nightly.md); the night's result."""
    from conductor.run.nightly_report import render_nightly_report

    path = render_nightly_report(night.reports, pool_id=manifest.id, decision=decision, why=why,
                                 iterations=[it.to_json() for it in iterations],
                                 evaluation=evaluation.to_json()["reports"] if evaluation else None,
                                 points=points or [], lake=night.lake, eval_run=eval_run, stopped=stopped,
                                 headroom=headroom.to_json() if headroom else None)
    return NightResult(night.tag, night_status(stopped, decision), why, str(path), stopped, tuple(iterations),
                       decision, headroom)
