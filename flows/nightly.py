"""Nightly retraining: when the worker pool changed since the champion was trained, run K iterations of
rollouts -> GRPO, evaluate the result against the champion (and every single worker), promote only if it is
significantly better, and write a report. A budget (calls, dollars, hours) stops it cleanly between stages;
rerunning the same night resumes (committed shards and saved checkpoints are reused).

    python -m flows.nightly --help
"""

from __future__ import annotations

import datetime as _dt
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from flows.evaluate import eval_run_id, evaluate_flow
from flows.rollout import rollout_flow
from flows.train import train_flow




def _save_json(path: Path, data: dict[str, Any]) -> None:
    import json

    from conductor.summary import atomic_write_text

    atomic_write_text(path, json.dumps(data, indent=1))


def _tracking(tracking_uri: str | None, work: Path, night: str, reports: Path, log: Any) -> dict[str, Any] | None:
    """MLflow settings for this night's run (one run per night; a rerun continues it), or None."""
    import importlib.util
    import json

    from conductor.grpo.tracking import default_tracking_uri

    if tracking_uri == "none":
        return None
    if importlib.util.find_spec("mlflow") is None:
        if tracking_uri:
            raise ValueError(f"tracking_uri {tracking_uri!r}: mlflow is not installed (install the 'mlflow' extra)")
        log.warning("mlflow is not installed: per-iteration metrics go to the report only")
        return None
    saved = reports / "mlflow.json"
    uri = tracking_uri or default_tracking_uri(work)
    tracking: dict[str, Any] = {"uri": uri, "experiment": "conductor-nightly", "run_name": f"nightly-{night}"}
    if saved.is_file():
        prev = json.loads(saved.read_text())
        if prev.get("tracking_uri") == uri:
            tracking["run_id"] = prev.get("run_id")
    return tracking


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


@flow(name="conductor-nightly", persist_result=False)
def nightly_flow(pool: str, train_questions: str, eval_questions: str, work_dir: str, base: str,
                 registry: str | None = None, night: str | None = None, iterations: int = 2,
                 questions_per_iteration: int = 4, group_size: int = 8, k: int | None = None, seed: int = 0,
                 eval_samples: int = 2, eval_limit: int | None = None, max_tokens: int = 1024,
                 grpo: dict[str, Any] | None = None, heldout_workers: list[str] | None = None,
                 baselines: bool = True, force: bool = False, max_calls: int | None = None,
                 max_dollars: float | None = None, max_hours: float | None = None,
                 promotion: dict[str, Any] | None = None, shard_size: int = 4,
                 backend: str = "transformers", lake: str | None = None, fewshot: str = "ood",
                 tracking_uri: str | None = None, conductor_format: dict[str, Any] | None = None,
                 limits: str | None = None) -> dict[str, Any]:
    """``base``: the checkpoint to start from when there is no champion (directory, .gguf or s3:// URL);
    ``backend``: the policy backend that samples rollouts from a checkpoint (``vllm`` on GPU nodes);
    ``lake``: where trajectories go (default WORK_DIR/lake; a local path or s3://).
    ``tracking_uri``: MLflow tracking for the per-iteration metrics, one run per night (default
    ``$MLFLOW_TRACKING_URI`` or a file store at WORK_DIR/mlruns; ``"none"`` turns it off; skipped with a
    warning when mlflow is not installed); the curves are also drawn to the night's report directory.
    ``conductor_format``: a decoding contract for the base (``conductor.grpo.format``: subtask vocabulary,
    steps, plan line) written next to its HF copy, so every rollout, evaluation and answer with it and its
    trained descendants decodes under that grammar (how an untrained small conductor gets a learning signal).
    ``limits``: the store its rollouts and evaluations share provider limits through (flows/rollout.py)."""
    from prefect.artifacts import create_markdown_artifact

    from conductor.evaluation import EvalReport
    from conductor.nightly_report import Point, render_nightly_report
    from conductor.pool import load_pool
    from conductor.questionset import check_disjoint, load_questions
    from conductor.registry import PromotionPolicy, Registry, read_lineage
    from conductor.summary import run_summary

    log = get_run_logger()

    def _spec(uri: str) -> str:
        return f"{backend}:{uri}"

    started = time.time()
    night = night or _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d")
    work = Path(work_dir)
    lake, cache = lake or str(work / "lake"), str(work / "cache.sqlite")
    reports = work / "reports" / night
    check_disjoint(load_questions(train_questions), load_questions(eval_questions))
    reg = Registry.open(registry or str(work / "registry"))
    manifest = load_pool(pool)
    fp = manifest.fingerprint

    if conductor_format:
        from conductor.grpo.format import ConductorFormat
        from conductor.grpo.checkpoint import formatted_base

        base = str(formatted_base(base, ConductorFormat.from_json(conductor_format), work / "base"))
    champion = reg.champion
    if champion is None:  # the untrained base is the first champion: a candidate must beat it to replace it
        entry = reg.register(base, lineage={"pool_id": manifest.id, "pool_fingerprint": None, "role": "base"},
                             checkpoint_id="base")
        reg.promote(entry.checkpoint_id, reason="initial champion: the untrained base model")
        champion = reg.champion
    assert champion is not None
    trained_on = champion.lineage.get("pool_fingerprint")
    if trained_on == fp and not force:
        why = f"pool {manifest.id} (fingerprint {fp}) is unchanged since champion {champion.checkpoint_id} was trained: nothing to retrain"
        log.info(why)
        path = render_nightly_report(reports, pool_id=manifest.id, decision=None, why=why, iterations=[],
                                     evaluation=None, points=[])
        return {"night": night, "status": "skipped", "why": why, "report": str(path)}
    why = (f"no trained champion yet: training from the base model {champion.checkpoint_id}" if trained_on is None and
           champion.lineage.get("role") == "base" else
           f"pool {manifest.id} changed (champion {champion.checkpoint_id} trained on {trained_on}, now {fp})"
           if trained_on != fp else f"forced retraining on unchanged pool {manifest.id}")
    log.info("night %s: %s", night, why)

    current, current_id = champion.uri, champion.checkpoint_id
    its: list[dict[str, Any]] = []
    stopped = None
    tracking = _tracking(tracking_uri, work, night, reports, log)
    metrics_history: list[dict[str, Any]] = []
    for i in range(iterations):
        run_id = f"nightly-{night}-it{i}"
        roll = rollout_flow(questions=train_questions, lake=lake, pool=pool, conductor=_spec(current), run_id=run_id,
                            group_size=group_size, k=k, seed=seed + i, max_tokens=max_tokens,
                            limit=questions_per_iteration, offset=i * questions_per_iteration, shard_size=shard_size,
                            cache=cache, checkpoint_id=current_id, fewshot=fewshot, limits=limits)
        it = {"iteration": i, "run_id": run_id, "trajectories": roll["trajectories"],
              "mean_reward": roll["mean_reward"], "accuracy": roll["accuracy"]}
        if (stopped := over_budget(night_usage(lake, night), started, max_calls, max_dollars, max_hours)):
            its.append(it)
            break
        ckpt_id = f"nightly-{night}-it{i}"
        out = str(work / "checkpoints" / ckpt_id)
        trained = train_flow(base=current, lake=lake, run_id=run_id, out=out, checkpoint_id=ckpt_id, config=grpo,
                             reference=champion.uri, tracking=tracking, step=i + 1)
        if tracking is not None and trained.get("mlflow_run_id"):
            tracking["run_id"] = trained["mlflow_run_id"]
            _save_json(reports / "mlflow.json", {"tracking_uri": tracking["uri"], "run_id": tracking["run_id"]})
        metrics_history.append({**trained["metrics"], "iteration": i + 1})
        lineage = {**read_lineage(trained["uri"]), "pool_id": manifest.id, "pool_fingerprint": fp, "night": night}
        if ckpt_id not in reg.backend.checkpoints():
            reg.register(trained["uri"], lineage=lineage, checkpoint_id=ckpt_id)
        it.update(checkpoint_id=ckpt_id, loss=trained["metrics"].get("loss"))
        its.append(it)
        current, current_id = trained["uri"], ckpt_id
        if (stopped := over_budget(night_usage(lake, night), started, max_calls, max_dollars, max_hours)):
            break

    if metrics_history:
        from conductor.grpo.tracking import plot_curves

        curves = plot_curves(metrics_history, reports / "training-curves.png", title=f"nightly {night}: GRPO")
        if tracking is not None and tracking.get("run_id"):
            from conductor.grpo.tracking import MetricsTracker

            MetricsTracker(tracking["uri"], run_id=tracking["run_id"]).log_artifact(curves)
    decision = evaluation = None
    points: list[Point] = []
    eval_run = None
    candidate_id = its[-1].get("checkpoint_id") if its else None
    if stopped:
        log.warning("night %s stopped: %s", night, stopped)
    elif candidate_id:
        evaluation = evaluate_flow(candidate=_spec(current), champion=_spec(champion.uri), questions=eval_questions,
                                   pool=pool, lake=lake, out=str(reports), samples=eval_samples, seed=seed,
                                   max_tokens=max_tokens, k=k, heldout_workers=heldout_workers, limit=eval_limit,
                                   cache=cache, shard_size=shard_size, candidate_id=candidate_id,
                                   champion_id=champion.checkpoint_id, fewshot=fewshot, limits=limits)
        report = EvalReport.from_json(evaluation["reports"]["main"])
        d = reg.promote_if_better(candidate_id, report, PromotionPolicy(**(promotion or {})))
        decision = {"promote": d.promote, "reason": d.reason, "candidate_id": d.candidate_id,
                    "champion_id": d.champion_id, "p_value": d.p_value, "diff": d.diff, "regressions": d.regressions}
        log.info("promotion: %s", decision)
        runs = evaluation["runs"]["main"]
        eval_run = runs[report.candidate_id]
        for label, cid, kind in ((candidate_id, report.candidate_id, "candidate"),
                                 (champion.checkpoint_id, report.champion_id, "champion")):
            s, _ = run_summary(lake, runs[cid], "eval")
            points.append(Point(label, s["accuracy"], s["dollars_per_question"], kind))
        if baselines:
            for i, w in enumerate(manifest.workers):
                run = eval_run_id(f"fixed:{i}", eval_questions, eval_limit, pool, eval_samples, seed)
                rollout_flow(questions=eval_questions, lake=lake, pool=pool, conductor=f"fixed:{i}", run_id=run,
                             group_size=eval_samples, seed=seed, limit=eval_limit, shard_size=shard_size,
                             cache=cache, kind="eval", checkpoint_id=f"fixed:{i}", limits=limits)
                s, _ = run_summary(lake, run, "eval")
                points.append(Point(w.name, s["accuracy"], s["dollars_per_question"], "worker"))
    path = render_nightly_report(reports, pool_id=manifest.id, decision=decision, why=why, iterations=its,
                                 evaluation=evaluation["reports"] if evaluation else None, points=points, lake=lake, eval_run=eval_run, stopped=stopped)
    text = path.read_text(encoding="utf-8")
    create_markdown_artifact(key=f"nightly-{night}".lower(), markdown=text[:100_000], description=f"Nightly run {night}")
    status = "stopped" if stopped else ("promoted" if decision and decision["promote"] else "challenger")
    return {"night": night, "status": status, "why": why, "stopped": stopped, "iterations": its,
            "decision": decision, "report": str(path)}
