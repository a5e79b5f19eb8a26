"""The nightly run's decisions as plain functions (conductor/run/nightly.py), on a real file registry, the real
simulated pool manifest and a real lake; no Prefect, no model."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import pytest

from conductor.learning.registry import Registry
from conductor.run.config import NightlyConfig
from conductor.run.nightly import (
    baseline_rollouts,
    budget_stop,
    ensure_champion,
    iteration_rollout,
    night_status,
    night_usage,
    over_budget,
    plan_night,
    retrain_reason,
    tracking_settings,
)
from conductor.workers.pool import load_pool

ROOT = Path(__file__).resolve().parent.parent
SIM_POOL = str(ROOT / "data/pools/simulated.yaml")


def config(tmp_path: Path, **kw) -> NightlyConfig:
    return NightlyConfig(**{"pool": SIM_POOL, "train_questions": "gsm8k_train:8", "eval_questions": "gsm8k_test:4",
                            "work_dir": str(tmp_path / "work"), "base": str(tmp_path / "base"), **kw})


def test_plan_night_puts_everything_under_the_work_dir_and_tags_today(tmp_path):
    noon = dt.datetime(2026, 11, 24, 12, tzinfo=dt.UTC).timestamp()
    night = plan_night(config(tmp_path), now=noon)
    work = tmp_path / "work"
    assert (night.tag, night.work, night.lake, night.cache) == ("20261124", work, str(work / "lake"),
                                                                str(work / "cache.sqlite"))
    assert night.reports == work / "reports" / "20261124" and night.registry == str(work / "registry")
    other = plan_night(config(tmp_path, night="t1", lake="s3://b/lake", registry="r"), now=noon)
    assert (other.tag, other.lake, other.registry, other.reports.name) == ("t1", "s3://b/lake", "r", "t1")


def test_the_base_becomes_the_first_champion_and_is_retrained_until_a_night_trains_on_this_pool(tmp_path):
    pool = load_pool(SIM_POOL)
    reg = Registry.open(str(tmp_path / "registry"))
    champ = ensure_champion(reg, str(tmp_path / "base"), pool)
    assert champ.checkpoint_id == "base" and reg.champion.checkpoint_id == "base"
    assert ensure_champion(reg, str(tmp_path / "other-base"), pool).uri == champ.uri   # an existing champion stays
    retrain, why = retrain_reason(champ, pool)
    assert retrain and why.startswith("no trained champion yet")

    trained = reg.register(str(tmp_path / "ck"), lineage={"pool_fingerprint": pool.fingerprint}, checkpoint_id="ck")
    assert retrain_reason(trained, pool) == (False, f"pool {pool.id} (fingerprint {pool.fingerprint}) is unchanged "
                                                    "since champion ck was trained: nothing to retrain")
    assert retrain_reason(trained, pool, force=True) == (True, f"forced retraining on unchanged pool {pool.id}")
    stale = reg.register(str(tmp_path / "old"), lineage={"pool_fingerprint": "abc"}, checkpoint_id="old")
    retrain, why = retrain_reason(stale, pool)
    assert retrain and why == f"pool {pool.id} changed (champion old trained on abc, now {pool.fingerprint})"


def test_iterations_walk_the_training_mix_from_the_current_checkpoint(tmp_path):
    cfg = config(tmp_path, night="t1", questions_per_iteration=3, seed=5, backend="vllm", k=2, limits="sqlite:x")
    night = plan_night(cfg)
    r0, r1 = (iteration_rollout(cfg, night, i, f"/ck/{i}", f"c{i}") for i in (0, 1))
    assert (r0.run_id, r0.offset, r0.limit, r0.seed, str(r0.conductor)) == ("nightly-t1-it0", 0, 3, 5, "vllm:/ck/0")
    assert (r1.run_id, r1.offset, r1.seed, r1.checkpoint_id) == ("nightly-t1-it1", 3, 6, "c1")
    assert (r1.kind, r1.lake, r1.cache, r1.group_size, r1.k, str(r1.limits)) == (
        "rollout", night.lake, night.cache, cfg.group_size, 2, "sqlite:x")


def test_baselines_are_one_eval_run_per_worker_with_stable_ids(tmp_path):
    cfg = config(tmp_path, eval_samples=3, eval_limit=2)
    pool = load_pool(SIM_POOL)
    runs = baseline_rollouts(cfg, plan_night(cfg), pool)
    assert [name for name, _ in runs] == [w.name for w in pool.workers]
    assert all(r.kind == "eval" and str(r.conductor) == f"fixed:{i}" and r.group_size == 3 and r.limit == 2
               for i, (_, r) in enumerate(runs))
    assert len({r.run_id for _, r in runs}) == len(runs)
    assert [r.run_id for _, r in baseline_rollouts(cfg, plan_night(cfg), pool)] == [r.run_id for _, r in runs]


def test_the_budget_stops_the_night_on_what_the_lake_says_it_spent(tmp_path):
    from conductor.lake.writer import write_shard
    from lake_records import traj

    cfg = config(tmp_path, night="t1", max_calls=4)
    night = plan_night(cfg)
    write_shard(night.lake, [traj("nightly-t1-it0", "q0", 0, workers=["a", "b"], cost=0.25)], "s0")
    write_shard(night.lake, [traj("nightly-t0-it0", "q0", 0, workers=["a", "b"], cost=0.25)], "s0")
    assert night_usage(night.lake, "t1") == {"calls": 2.0, "dollars": 0.5}   # another night's run does not count
    assert budget_stop(cfg, night) is None
    write_shard(night.lake, [traj("nightly-t1-it1", "q1", 0, workers=["a", "b"], cost=0.25)], "s1")
    assert budget_stop(cfg, night) == "call budget reached: 4 >= 4"
    assert over_budget({"calls": 0, "dollars": 2.0}, time.time(), None, 1.5, None).startswith("dollar budget reached")
    assert over_budget({"calls": 0, "dollars": 0}, time.time() - 7200, None, None, 1.0).startswith("time budget")
    assert over_budget({"calls": 0, "dollars": 0}, time.time(), 10, 1.0, 1.0) is None


def test_tracking_continues_the_nights_mlflow_run(tmp_path):
    pytest.importorskip("mlflow")
    warnings: list[str] = []
    assert tracking_settings(config(tmp_path, tracking_uri="none"), plan_night(config(tmp_path)), warnings.append) is None
    cfg = config(tmp_path, night="t1", tracking_uri=f"file://{tmp_path}/mlruns")
    night = plan_night(cfg)
    fresh = tracking_settings(cfg, night, warnings.append)
    assert fresh == {"uri": cfg.tracking_uri, "experiment": "conductor-nightly", "run_name": "nightly-t1"}
    night.reports.mkdir(parents=True)
    (night.reports / "mlflow.json").write_text(json.dumps({"tracking_uri": cfg.tracking_uri, "run_id": "abc"}))
    assert tracking_settings(cfg, night, warnings.append)["run_id"] == "abc"
    assert warnings == []


def test_night_status():
    assert night_status("dollar budget reached", {"promote": True}) == "stopped"
    assert night_status(None, {"promote": True}) == "promoted"
    assert night_status(None, {"promote": False}) == "challenger"


def test_night_result_json_keeps_the_flow_result_shape():
    """Issue #50 (3): the night's result is a dataclass; its JSON is the dict the flow always returned."""
    from conductor.run.nightly import HeadroomSummary, IterationRecord, NightResult

    it = IterationRecord(0, "nightly-t-it0", 8, 0.5, 0.25, checkpoint_id="nightly-t-it0", loss=0.1)
    res = NightResult("t", "challenger", "pool changed", "r/nightly.md", None, (it,), {"promote": False},
                      HeadroomSummary("router-bound", "line", ("e",), "h.md"))
    assert res.to_json() == {"night": "t", "status": "challenger", "why": "pool changed", "stopped": None,
                             "iterations": [{"iteration": 0, "run_id": "nightly-t-it0", "trajectories": 8,
                                             "mean_reward": 0.5, "accuracy": 0.25, "checkpoint_id": "nightly-t-it0",
                                             "loss": 0.1}],
                             "decision": {"promote": False}, "report": "r/nightly.md", "headroom": "router-bound"}
