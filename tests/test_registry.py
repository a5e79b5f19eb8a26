"""Checkpoint registry: atomic alias swaps, history, promotion policy, rollback; file (local and S3 via a
real moto server on 127.0.0.1) and MLflow (a real local SQLite store) backends."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
from pathlib import Path

import pytest

from conductor.learning.evaluation import compare
from conductor.learning.registry import CHALLENGER, CHAMPION, PromotionPolicy, Registry, RegistryError, decide
from conductor.stats.paired import EvalRow


def rows(acc: dict[str, float], seed: int, n_q: int = 120, repeats: int = 2) -> list[EvalRow]:
    rng = random.Random(seed)
    return [EvalRow(f"{d}/{q}", d, s, ok, 1.0 if ok else 0.5, 2, 0.01)
            for d, p in acc.items() for q in range(n_q) for s in range(repeats) for ok in [rng.random() < p]]


BASE = {"math": 0.5, "mcq": 0.6}


def report(cand_acc, cand_id, champ_id, seed=2):
    return compare(rows(cand_acc, seed), rows(BASE, 1), n_boot=2000, seed=0, candidate_id=cand_id, champion_id=champ_id)


def _ckpt(tmp: Path, name: str, parent: str | None = None) -> str:
    d = tmp / name
    d.mkdir(parents=True)
    (d / "lineage.json").write_text(json.dumps({"checkpoint_id": name, "parent": parent, "rollout_run": f"run-{name}"}))
    return str(d)


def test_first_candidate_becomes_champion_and_lineage_is_read(tmp_path):
    reg = Registry(str(tmp_path / "reg"))
    e = reg.register(_ckpt(tmp_path, "c0"))
    assert e.checkpoint_id == "c0" and e.lineage["rollout_run"] == "run-c0"
    d = reg.promote_if_better("c0", None)
    assert d.promote and reg.champion.checkpoint_id == "c0"
    assert [h["action"] for h in reg.history()] == ["register", "promote"]


def test_worse_candidate_is_not_promoted_but_recorded_as_challenger(tmp_path):
    reg = Registry(str(tmp_path / "reg"))
    for n in ("c0", "c1"):
        reg.register(_ckpt(tmp_path, n))
    reg.promote("c0", "initial")
    d = reg.promote_if_better("c1", report({"math": 0.35, "mcq": 0.5}, "c1", "c0"), PromotionPolicy())
    assert not d.promote and "not better" in d.reason
    assert reg.champion.checkpoint_id == "c0" and reg.alias(CHALLENGER).checkpoint_id == "c1"
    ev = reg.history()[-1]
    assert ev["action"] == "challenger" and ev["reason"] == d.reason and ev["diff"] < 0


def test_better_candidate_is_promoted_and_rollback_walks_back(tmp_path):
    reg = Registry(str(tmp_path / "reg"))
    for n in ("c0", "c1", "c2"):
        reg.register(_ckpt(tmp_path, n))
    reg.promote("c0")
    d1 = reg.promote_if_better("c1", report({"math": 0.8, "mcq": 0.72}, "c1", "c0"))
    assert d1.promote and d1.p_value < 0.05 and reg.champion.checkpoint_id == "c1"
    reg.set_challenger("c2", "waiting")
    reg.promote("c2", "manual")
    assert reg.alias(CHALLENGER) is None                 # promoted challenger leaves the challenger slot
    assert reg.rollback().checkpoint_id == "c1" and reg.champion.checkpoint_id == "c1"
    assert reg.rollback().checkpoint_id == "c0"
    with pytest.raises(RegistryError, match="no earlier champion"):
        reg.rollback()
    actions = [h["action"] for h in reg.history() if h.get("alias") == CHAMPION]
    assert actions == ["promote", "promote", "promote", "rollback", "rollback"]


def test_domain_regression_blocks_promotion_even_when_better_overall(tmp_path):
    rep = report({"math": 0.95, "mcq": 0.45}, "c1", "c0")
    assert rep.diff > 0 and rep.p_value() < 0.05
    d = decide(rep, PromotionPolicy(max_domain_regression=0.05), "c1", "c0")
    assert not d.promote and "mcq" in d.regressions and "domain regression" in d.reason
    assert decide(rep, PromotionPolicy(max_domain_regression=0.5), "c1", "c0").promote


def test_not_significant_is_not_promoted():
    rep = compare(rows({"math": 0.52, "mcq": 0.6}, 5, n_q=15, repeats=1), rows(BASE, 1, n_q=15, repeats=1),
                  n_boot=2000, candidate_id="c1", champion_id="c0")
    d = decide(rep, PromotionPolicy(alpha=0.01, max_domain_regression=1.0), "c1", "c0")
    assert not d.promote and ("not significant" in d.reason or "not better" in d.reason)


def test_report_against_a_stale_champion_is_refused(tmp_path):
    reg = Registry(str(tmp_path / "reg"))
    for n in ("c0", "c1", "c2"):
        reg.register(_ckpt(tmp_path, n))
    reg.promote("c0")
    reg.promote("c1")
    with pytest.raises(RegistryError, match="champion is 'c1'"):
        reg.promote_if_better("c2", report({"math": 0.9, "mcq": 0.7}, "c2", "c0"))
    with pytest.raises(RegistryError, match="unknown checkpoint 'zz'"):
        reg.promote("zz")


def _hammer(root: str, worker: int, n: int) -> None:
    reg = Registry(root)
    for i in range(n):
        cid = f"w{worker}-{i}"
        reg.register(f"/ckpts/{cid}", lineage={}, checkpoint_id=cid)
        reg.promote(cid, f"writer {worker}")


def test_concurrent_writers_never_lose_or_corrupt_updates(tmp_path):
    root = str(tmp_path / "reg")
    ctx = mp.get_context("spawn")  # fresh interpreters: nothing inherited from the test process
    procs = [ctx.Process(target=_hammer, args=(root, w, 15)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    doc = json.loads((tmp_path / "reg" / "registry.json").read_text())
    assert len(doc["checkpoints"]) == 45
    promos = [h for h in doc["history"] if h["action"] == "promote"]
    assert len(promos) == 45 and doc["revision"] == 90
    # the previous pointers form one chain: every swap saw the state the one before it wrote
    assert [p["previous"] for p in promos[1:]] == [p["checkpoint_id"] for p in promos[:-1]]
    assert not [f for f in os.listdir(tmp_path / "reg") if ".tmp" in f]


def test_corrupt_registry_document_is_a_clear_error(tmp_path):
    (tmp_path / "reg").mkdir()
    (tmp_path / "reg" / "registry.json").write_text("{not json")
    with pytest.raises(RegistryError, match=r"registry.json: corrupt registry document"):
        _ = Registry(str(tmp_path / "reg")).champion


# ------------------------------------------------------------------ S3 (moto server on loopback)

@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("s3fs")
    from s3_server import moto_s3

    with moto_s3("reg-bucket", "reg-key", "reg-secret") as (_endpoint, _env, fs):
        yield fs


def test_registry_on_s3(s3):
    s3.pipe("reg-bucket/ckpts/c0/lineage.json", json.dumps({"checkpoint_id": "c0", "rollout_run": "r0"}).encode())
    reg = Registry("s3://reg-bucket/registry")
    reg.register("s3://reg-bucket/ckpts/c0")
    reg.register("s3://reg-bucket/ckpts/c1", lineage={"rollout_run": "r1"})
    reg.promote("c0")
    reg.promote("c1")
    fresh = Registry("s3://reg-bucket/registry")
    assert fresh.champion.checkpoint_id == "c1" and fresh.get("c0").lineage["rollout_run"] == "r0"
    assert fresh.rollback().checkpoint_id == "c0"
    s3.invalidate_cache()
    assert s3.ls("reg-bucket/registry") == ["reg-bucket/registry/registry.json"]   # one object, one PUT per change


def test_checkpoint_saved_to_s3_and_trained_from_it(s3, tmp_path):
    pytest.importorskip("trl")
    from conductor.learning.grpo.config import GRPOConfig
    from conductor.learning.grpo.trainer import grpo_step
    from grpo_fixtures import rollout, tiny_checkpoint

    os.environ["CONDUCTOR_HOME"] = str(tmp_path / "home")
    try:
        base = tiny_checkpoint(tmp_path / "base")
        cfg = GRPOConfig.cpu(learning_rate=1e-3, total_iterations=3)
        out, _ = grpo_step(str(base), rollout("s3-run", "q", [1.0, 0.0]), cfg, out="s3://reg-bucket/ckpts/it1")
        s3.invalidate_cache()
        assert s3.exists("reg-bucket/ckpts/it1/model.safetensors") and s3.exists("reg-bucket/ckpts/it1/lineage.json")
        out2, m2 = grpo_step(out, rollout("s3-run-2", "q", [0.0, 1.0]), cfg, out=str(tmp_path / "it2"))
        lin = json.loads((Path(out2) / "lineage.json").read_text())
        assert lin["parent"] == "s3://reg-bucket/ckpts/it1" and lin["global_step"] == 2
        reg = Registry("s3://reg-bucket/registry2")
        assert reg.register(out).lineage["rollout_run"] == "s3-run"
    finally:
        os.environ.pop("CONDUCTOR_HOME", None)


# ------------------------------------------------------------------ MLflow (real local SQLite store)

def test_mlflow_backend_aliases_history_and_rollback(tmp_path):
    pytest.importorskip("mlflow")
    uri = f"mlflow+sqlite:///{tmp_path}/mlflow.db#conductor-test"
    reg = Registry.open(uri)
    for n in ("c0", "c1", "c2"):
        reg.register(_ckpt(tmp_path, n))
    assert reg.promote_if_better("c0", None).promote
    assert reg.promote_if_better("c1", report({"math": 0.85, "mcq": 0.72}, "c1", "c0")).promote
    d = reg.promote_if_better("c2", report({"math": 0.3, "mcq": 0.6}, "c2", "c1"))
    assert not d.promote
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", registry_uri=f"sqlite:///{tmp_path}/mlflow.db")
    champ = client.get_model_version_by_alias("conductor-test", "champion")
    assert champ.tags["conductor.checkpoint_id"] == "c1" and champ.source.endswith("/c1")
    assert client.get_model_version_by_alias("conductor-test", "challenger").tags["conductor.checkpoint_id"] == "c2"
    assert reg.rollback().checkpoint_id == "c0"
    assert client.get_model_version_by_alias("conductor-test", "champion").tags["conductor.checkpoint_id"] == "c0"
    assert [h["action"] for h in Registry.open(uri).history()][-2:] == ["challenger", "rollback"]
