"""Nightly retraining: when the worker pool changed since the champion was trained, run K iterations of
rollouts -> GRPO, evaluate the result against the champion (and every single worker), promote only if it is
significantly better, and write a report. A budget (calls, dollars, hours) stops it cleanly between stages;
rerunning the same night resumes (committed shards and saved checkpoints are reused).

The flow only sequences subflows and library calls; every decision, and the training loop (handed the rollout
and train subflows), is in conductor/run/nightly.py.

    conductor nightly --help
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from conductor.run.config import NightlyConfig
from conductor.run.nightly import (
    Night,
    NightLoop,
    NightResult,
    ensure_champion,
    night_evaluation,
    night_headroom,
    night_report,
    plan_night,
    promote,
    retrain_reason,
    served_mix,
    skipped_night,
)
from flows.evaluate import evaluate_flow
from flows.rollout import rollout_flow
from flows.train import train_flow


@flow(name="conductor-nightly", persist_result=False)
def nightly_flow(config: NightlyConfig) -> NightResult:
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
        return skipped_night(night, manifest, why)
    headroom = night_headroom(config, night, manifest, rollout_flow) if config.headroom else None
    if headroom:
        log.info("headroom on %s: %s", manifest.id, headroom.verdict_line)
    loop = NightLoop(config, night, reg, champion, manifest, rollout=rollout_flow, train=train_flow, warn=log.warning)
    iterations, current, stopped = loop.run()
    if stopped:
        log.warning("night %s stopped: %s", night.tag, stopped)
    last = iterations[-1].checkpoint_id if iterations else None
    if stopped or last is None:
        return _published(night, night_report(night, manifest, why, iterations, stopped=stopped, headroom=headroom))
    evaluation = evaluate_flow(night_evaluation(config, night, champion, current, last))
    decision, points, eval_run = promote(config, night, reg, champion, manifest, evaluation, rollout_flow)
    log.info("promotion: %s", decision)
    return _published(night, night_report(night, manifest, why, iterations, evaluation=evaluation, decision=decision,
                                          points=points, eval_run=eval_run, headroom=headroom))


def _base(config: NightlyConfig, night: Night) -> str:
    """The base checkpoint, with the night's decoding contract written next to its HF copy when one is set."""
    if not config.conductor_format:
        return config.base
    from conductor.decoding.contract import ConductorFormat
    from conductor.learning.grpo.checkpoint import formatted_base

    return str(formatted_base(config.base, ConductorFormat.from_json(config.conductor_format), night.work / "base"))


def _published(night: Night, result: NightResult) -> NightResult:
    """The night's report as a Prefect artifact too."""
    from pathlib import Path

    from prefect.artifacts import create_markdown_artifact

    text = Path(result.report).read_text(encoding="utf-8")
    create_markdown_artifact(key=f"nightly-{night.tag}".lower(), markdown=text[:100_000],
                             description=f"Nightly run {night.tag}")
    return result
