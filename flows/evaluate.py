"""Evaluation: a candidate and the champion on the same held-out questions, pool and seeds, with repeated
samples; optionally again on a held-out sub-pool to test adaptation. Writes eval runs to the lake and the
paired comparison (mean +/- s.e. per domain, paired bootstrap and McNemar, calls and dollars per question)
as JSON next to them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE

from conductor.learning.evaluation import EvalReport
from conductor.learning.results import EvalResult
from conductor.run.config import EvaluateConfig, eval_run_id
from flows.rollout import rollout_flow

if TYPE_CHECKING:
    from conductor.workers.pool import Pool


@task(name="compare-candidate-champion", cache_policy=NONE)
def compare_runs(lake: str, candidate_run: str, champion_run: str, candidate_id: str, champion_id: str,
                 metric: str = "correct", seed: int = 0, objective: Mapping[str, float | None] | None = None) -> EvalReport:
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
    return compare(cand, champ, metric=metric, seed=seed, candidate_id=candidate_id,  # type: ignore[arg-type]
                   champion_id=champion_id)


@flow(name="conductor-evaluate", persist_result=False)
def evaluate_flow(config: EvaluateConfig) -> EvalResult:
    """Compare ``candidate`` with ``champion`` (conductor/run/config.py: ``EvaluateConfig``): one evaluation run
    of each per pool, then the paired comparison; evaluation.json in ``out`` is the result's ``to_json()``."""
    from conductor.files import atomic_write_text
    from conductor.run.runtime import checkpoint_of
    from conductor.workers.pool import load_pool

    c, log = config, get_run_logger()
    cand_id, champ_id = c.candidate_id or checkpoint_of(c.candidate), c.champion_id or checkpoint_of(c.champion)
    if cand_id == champ_id:
        raise ValueError(f"candidate and champion are the same checkpoint ({cand_id}); nothing to compare")
    reports: dict[str, EvalReport] = {}
    all_runs: dict[str, dict[str, str]] = {}
    for name, (pool_path, pool_key, k) in eval_pools(c, load_pool(c.pool)).items():
        key = (c.questions, c.limit, pool_key, k, c.samples, c.seed, c.temperature, c.max_tokens, c.fewshot)
        runs = {cid: eval_run_id(cid, *key) for cid in (cand_id, champ_id)}
        for spec, cid in ((c.candidate, cand_id), (c.champion, champ_id)):
            rollout_flow(c.rollout(spec, cid, runs[cid], pool_path, k))
        reports[name] = compare_runs(c.lake, runs[cand_id], runs[champ_id], cand_id, champ_id, seed=c.seed,
                                     objective=c.objective)
        all_runs[name] = runs
        log.info("evaluation (%s pool):\n%s", name, reports[name].render())
    result = EvalResult(reports, all_runs)
    atomic_write_text(Path(c.out) / "evaluation.json", json.dumps(result.to_json(), indent=2, default=str))
    return result


def eval_pools(c: EvaluateConfig, manifest: Pool) -> dict[str, tuple[str, str, int | None]]:
    """Each pool evaluated: name -> (manifest path, its part of the run id, k). The held-out sub-pool is
    written to OUT/heldout-pool.json and shown whole (no k)."""
    from conductor.files import atomic_write_text

    pools: dict[str, tuple[str, str, int | None]] = {"main": (c.pool, c.pool, c.k)}
    if c.heldout_workers:
        held = manifest.model_copy(update={"pool_id": f"{manifest.pool_id}-heldout",
                                           "workers": tuple(manifest.worker(n) for n in c.heldout_workers)})
        held_path = Path(c.out) / "heldout-pool.json"
        atomic_write_text(held_path, held.model_dump_json())
        pools["heldout"] = (str(held_path), manifest.fingerprint + "-heldout", None)
    return pools
