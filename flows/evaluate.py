"""Evaluation: a candidate and the champion on the same held-out questions, pool and seeds, with repeated
samples; optionally again on a held-out sub-pool to test adaptation. Writes eval runs to the lake and the
paired comparison (mean +/- s.e. per domain, paired bootstrap and McNemar, calls and dollars per question)
as JSON next to them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE

from conductor.run.config import RolloutConfig, eval_run_id
from flows.rollout import rollout_flow


@task(name="compare-candidate-champion", cache_policy=NONE)
def compare_runs(lake: str, candidate_run: str, champion_run: str, candidate_id: str, champion_id: str,
                 metric: str = "correct", seed: int = 0, objective: dict[str, Any] | None = None) -> dict[str, Any]:
    """The paired comparison; with an active cost ``objective`` (``CostObjective`` fields) both runs are compared
    on it (the reward column recomputed from reward, correct and cost_usd), not on accuracy."""
    from conductor.grading.objective import CostObjective, with_objective
    from conductor.lake.reader import scan
    from conductor.learning.evaluation import compare

    cols = ["question_id", "domain", "sample_index", "correct", "reward", "infra_failed", "n_calls", "cost_usd"]
    cand = scan(lake, kind="eval", run_id=candidate_run).select(cols).collect().to_dicts()
    champ = scan(lake, kind="eval", run_id=champion_run).select(cols).collect().to_dicts()
    obj = CostObjective(**(objective or {}))
    if obj.active:
        both = with_objective(cand + champ, obj)
        cand, champ, metric = both[:len(cand)], both[len(cand):], "reward"
    report = compare(cand, champ, metric=metric, seed=seed, candidate_id=candidate_id,  # type: ignore[arg-type]
                     champion_id=champion_id)
    return report.to_json()


@flow(name="conductor-evaluate", persist_result=False)
def evaluate_flow(candidate: str, champion: str, questions: str, pool: str, lake: str, out: str,
                  samples: int = 4, seed: int = 0, temperature: float = 0.7, max_tokens: int = 1024,
                  k: int | None = None, heldout_workers: list[str] | None = None, limit: int | None = None,
                  cache: str | None = None, shard_size: int = 4, candidate_id: str | None = None,
                  champion_id: str | None = None, fewshot: str = "ood", limits: str | None = None,
                  objective: dict[str, Any] | None = None) -> dict[str, Any]:
    """Compare ``candidate`` with ``champion`` (conductor specs).

    Returns {"reports": {"main": report, "heldout": report?}, "runs": {"main": {checkpoint id: eval run id}, ...}}.
    """
    from conductor.learning.evaluation import EvalReport
    from conductor.run.runtime import checkpoint_of
    from conductor.run.summary import atomic_write_text
    from conductor.workers.pool import load_pool

    log = get_run_logger()
    manifest = load_pool(pool)
    cand_id, champ_id = candidate_id or checkpoint_of(candidate), champion_id or checkpoint_of(champion)
    if cand_id == champ_id:
        raise ValueError(f"candidate and champion are the same checkpoint ({cand_id}); nothing to compare")
    setups: dict[str, tuple[str, int | None]] = {"main": (pool, k)}
    if heldout_workers:
        held = manifest.model_copy(update={"pool_id": f"{manifest.pool_id}-heldout",
                                           "workers": tuple(manifest.worker(n) for n in heldout_workers)})
        held_path = Path(out) / "heldout-pool.json"
        atomic_write_text(held_path, held.model_dump_json())
        setups["heldout"] = (str(held_path), None)
    reports: dict[str, Any] = {}
    all_runs: dict[str, dict[str, str]] = {}
    for name, (pool_path, kk) in setups.items():
        config = (questions, limit, pool_path if name == "main" else manifest.fingerprint + "-heldout", kk, samples,
                  seed, temperature, max_tokens, fewshot)
        runs = {}
        for spec, cid in ((candidate, cand_id), (champion, champ_id)):
            run = eval_run_id(cid, *config)
            rollout_flow(RolloutConfig(questions=questions, lake=lake, pool=pool_path, conductor=spec, run_id=run,
                                       group_size=samples, k=kk, seed=seed, temperature=temperature,
                                       max_tokens=max_tokens, limit=limit, shard_size=shard_size, cache=cache,
                                       kind="eval", checkpoint_id=cid, fewshot=fewshot, limits=limits))
            runs[cid] = run
        report = compare_runs(lake, runs[cand_id], runs[champ_id], cand_id, champ_id, seed=seed, objective=objective)
        reports[name] = report
        all_runs[name] = runs
        log.info("evaluation (%s pool):\n%s", name, EvalReport.from_json(report).render())
    result = {"reports": reports, "runs": all_runs}
    atomic_write_text(Path(out) / "evaluation.json", json.dumps(result, indent=2, default=str))
    return result
