"""Nightly retraining: when the worker pool changed since the champion was trained, run K iterations of
rollouts -> GRPO, evaluate the result against the champion (and every single worker), promote only if it is
significantly better, and write a report. A budget (calls, dollars, hours) stops it cleanly between stages;
rerunning the same night resumes (committed shards and saved checkpoints are reused).

The flow only sequences subflows; every decision is a plain function in conductor/learning/nightly.py.

    conductor nightly --help
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from conductor.learning.nightly import (
    Night,
    baseline_rollouts,
    budget_stop,
    checkpoint_lineage,
    decision_record,
    ensure_champion,
    iteration_id,
    iteration_record,
    iteration_rollout,
    night_status,
    objective_of,
    plan_night,
    policy_spec,
    retrain_reason,
    served_mix,
    tracking_settings,
)
from conductor.learning.results import EvalResult, TrainResult
from conductor.run.config import EvaluateConfig, NightlyConfig, TrainConfig
from flows.evaluate import evaluate_flow
from flows.rollout import rollout_flow
from flows.train import train_flow


@flow(name="conductor-nightly", persist_result=False)
def nightly_flow(config: NightlyConfig) -> dict[str, Any]:
    """One night (conductor/run/config.py: ``NightlyConfig``): ``base`` is the checkpoint to start from when
    there is no champion; ``backend`` samples rollouts from a checkpoint (``vllm`` on GPU nodes);
    ``tracking_uri``: MLflow for the per-iteration metrics, one run per night (``"none"``: off);
    ``conductor_format``: a decoding contract written next to the base's HF copy, so every rollout, evaluation
    and answer with it and its descendants decodes under that grammar; ``limits``: the store its rollouts and
    evaluations share provider limits through (flows/rollout.py)."""
    from conductor.data.questionset import check_disjoint, load_questions
    from conductor.learning.registry import Registry
    from conductor.workers.pool import load_pool

    log = get_run_logger()
    night = plan_night(config)
    config, served = served_mix(config, night)   # labelled served traffic first in the mix
    if served:
        log.info("night %s: %s", night.tag, served)
    check_disjoint(load_questions(config.train_questions), load_questions(config.eval_questions))
    reg, manifest = Registry.open(night.registry), load_pool(config.pool)
    champion = ensure_champion(reg, _base(config, night), manifest)
    retrain, why = retrain_reason(champion, manifest, config.force)
    log.info("night %s: %s", night.tag, why)
    if not retrain:
        return _skipped(night, manifest, why)
    headroom = _headroom(config, night, manifest) if config.headroom else None
    iterations, current, stopped = _train(config, night, reg, champion, manifest)
    if stopped:
        log.warning("night %s stopped: %s", night.tag, stopped)
        return _report(config, night, manifest, why, iterations, stopped=stopped, headroom=headroom)
    if not (iterations and iterations[-1].get("checkpoint_id")):
        return _report(config, night, manifest, why, iterations, headroom=headroom)
    evaluation = evaluate_flow(EvaluateConfig(
        candidate=policy_spec(config, current), champion=policy_spec(config, champion.uri),
        questions=config.eval_questions, pool=config.pool, lake=night.lake, out=str(night.reports),
        samples=config.eval_samples, seed=config.seed, max_tokens=config.max_tokens, k=config.k,
        heldout_workers=config.heldout_workers, limit=config.eval_limit, cache=night.cache,
        shard_size=config.shard_size, candidate_id=iterations[-1]["checkpoint_id"],
        champion_id=champion.checkpoint_id, fewshot=config.fewshot, limits=config.limits,
        objective=objective_of(config)))
    decision, points, eval_run = _promote(config, night, reg, champion, manifest, evaluation)
    return _report(config, night, manifest, why, iterations, evaluation=evaluation, decision=decision,
                   points=points, eval_run=eval_run, headroom=headroom)


def _headroom(config: NightlyConfig, night: Night, manifest: Any) -> dict[str, Any]:
    """Before training on a new pool: every worker alone on the evaluation questions (the same runs the report's
    baselines reuse), then the headroom check over them (conductor/stats/headroom.py): pool- or router-bound."""
    from conductor.lake.reader import scan
    from conductor.stats.headroom import OutcomeMatrix, headroom_report

    rows = []
    for name, baseline in baseline_rollouts(config, night, manifest):
        rollout_flow(baseline)
        cols = ["question_id", "question", "domain", "sample_index", "correct", "infra_failed", "cost_usd"]
        rows += [{**r, "worker": name} for r in scan(night.lake, kind="eval", run_id=baseline.run_id)
                 .select(cols).collect().to_dicts()]
    report = headroom_report(OutcomeMatrix.from_rows(rows), seed=config.seed)
    paths = report.write(night.reports / "headroom")
    get_run_logger().info("headroom on %s: %s", manifest.id, report.verdict_line)
    return {"verdict": report.verdict, "verdict_line": report.verdict_line, "evidence": list(report.evidence),
            "markdown": str(paths["markdown"])}


def _base(config: NightlyConfig, night: Night) -> str:
    """The base checkpoint, with the night's decoding contract written next to its HF copy when one is set."""
    if not config.conductor_format:
        return config.base
    from conductor.decoding.contract import ConductorFormat
    from conductor.learning.grpo.checkpoint import formatted_base

    return str(formatted_base(config.base, ConductorFormat.from_json(config.conductor_format), night.work / "base"))


def _train(config: NightlyConfig, night: Night, reg: Any, champion: Any,
           manifest: Any) -> tuple[list[dict[str, Any]], str, str | None]:
    """K iterations of rollouts -> GRPO step from the champion; (iterations, last checkpoint, why stopped)."""
    tracking = tracking_settings(config, night, get_run_logger().warning)
    current, current_id = champion.uri, champion.checkpoint_id
    its: list[dict[str, Any]] = []
    history: list[dict[str, Any]] = []
    stopped = None
    for i in range(config.iterations):
        run_id = iteration_id(night, i)
        it = iteration_record(i, run_id, rollout_flow(iteration_rollout(config, night, i, current, current_id)))
        its.append(it)
        if (stopped := budget_stop(config, night)):
            break
        trained = train_flow(TrainConfig(base=current, lake=night.lake, run_id=run_id,
                                         out=str(night.work / "checkpoints" / run_id), checkpoint_id=run_id,
                                         grpo=config.grpo, reference=champion.uri, tracking=tracking, step=i + 1))
        _continue_tracking(tracking, trained, night)
        history.append({**trained.metrics, "iteration": i + 1})
        if run_id not in reg.backend.checkpoints():
            from conductor.learning.registry import read_lineage

            reg.register(trained.uri, lineage=checkpoint_lineage(read_lineage(trained.uri), manifest, night),
                         checkpoint_id=run_id)
        it.update(checkpoint_id=run_id, loss=trained.loss)
        current, current_id = trained.uri, run_id
        if (stopped := budget_stop(config, night)):
            break
    _plot_curves(history, night, tracking)
    return its, current, stopped


def _continue_tracking(tracking: dict[str, Any] | None, trained: TrainResult, night: Night) -> None:
    """The next iteration logs into the same MLflow run; a rerun of the night finds it in mlflow.json."""
    if tracking is None or not trained.mlflow_run_id:
        return
    import json

    from conductor.files import atomic_write_text

    tracking["run_id"] = trained.mlflow_run_id
    atomic_write_text(night.reports / "mlflow.json",
                      json.dumps({"tracking_uri": tracking["uri"], "run_id": tracking["run_id"]}, indent=1))


def _plot_curves(history: list[dict[str, Any]], night: Night, tracking: dict[str, Any] | None) -> None:
    if not history:
        return
    from conductor.learning.grpo.tracking import MetricsTracker, plot_curves

    curves = plot_curves(history, night.reports / "training-curves.png", title=f"nightly {night.tag}: GRPO")
    if tracking is not None and tracking.get("run_id"):
        MetricsTracker(tracking["uri"], run_id=tracking["run_id"]).log_artifact(curves)


def _promote(config: NightlyConfig, night: Night, reg: Any, champion: Any, manifest: Any,
             evaluation: EvalResult) -> tuple[dict[str, Any], list[Any], str]:
    """Promote if significantly better; (decision, accuracy-per-dollar points, the candidate's eval run)."""
    from conductor.learning.nightly_report import Point
    from conductor.learning.registry import PromotionPolicy
    from conductor.run.summary import run_summary

    report = evaluation.main
    decision = decision_record(reg.promote_if_better(report.candidate_id, report,
                                                     PromotionPolicy(**(config.promotion or {}))))
    get_run_logger().info("promotion: %s", decision)
    runs = evaluation.runs["main"]
    points = []
    for label, cid, kind in ((report.candidate_id, report.candidate_id, "candidate"),
                             (champion.checkpoint_id, report.champion_id, "champion")):
        s, _ = run_summary(night.lake, runs[cid], "eval")
        points.append(Point(label, s.accuracy, s.dollars_per_question, kind))
    for name, baseline in (baseline_rollouts(config, night, manifest) if config.baselines else []):
        rollout_flow(baseline)
        s, _ = run_summary(night.lake, baseline.run_id, "eval")
        points.append(Point(name, s.accuracy, s.dollars_per_question, "worker"))
    return decision, points, runs[report.candidate_id]


def _skipped(night: Night, manifest: Any, why: str) -> dict[str, Any]:
    """Nothing to retrain: the report says why, nothing else."""
    from conductor.learning.nightly_report import render_nightly_report

    path = render_nightly_report(night.reports, pool_id=manifest.id, decision=None, why=why, iterations=[],
                                 evaluation=None, points=[])
    return {"night": night.tag, "status": "skipped", "why": why, "report": str(path)}


def _report(config: NightlyConfig, night: Night, manifest: Any, why: str, iterations: list[dict[str, Any]],
            evaluation: EvalResult | None = None, decision: dict[str, Any] | None = None,
            points: list[Any] | None = None, eval_run: str | None = None, stopped: str | None = None,
            headroom: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the morning-after report (and a Prefect artifact of it); the flow's result."""
    from prefect.artifacts import create_markdown_artifact

    from conductor.learning.nightly_report import render_nightly_report

    path = render_nightly_report(night.reports, pool_id=manifest.id, decision=decision, why=why, iterations=iterations,
                                 evaluation=evaluation.to_json()["reports"] if evaluation else None, points=points or [],
                                 lake=night.lake, eval_run=eval_run, stopped=stopped, headroom=headroom)
    text = path.read_text(encoding="utf-8")
    create_markdown_artifact(key=f"nightly-{night.tag}".lower(), markdown=text[:100_000],
                             description=f"Nightly run {night.tag}")
    return {"night": night.tag, "status": night_status(stopped, decision), "why": why, "stopped": stopped,
            "iterations": iterations, "decision": decision, "report": str(path),
            "headroom": headroom["verdict"] if headroom else None}
