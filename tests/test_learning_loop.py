"""One full learning iteration on CPU through the real flows: rollouts -> GRPO step -> evaluation ->
promotion decision, with the smallest real model (SmolLM2-135M, transformers) as the conductor and the
simulated pool as workers. Prefect runs in ephemeral mode; the lake, registry and checkpoints are real files.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from conductor.local.embedded import installed

    path = installed().get("smollm2-135m-instruct")
    if path is None:
        pytest.skip("SmolLM2-135M not installed: bash infra/install.sh --models smollm2-135m-instruct")
    return path


def _first_tensor(ckpt: Path):
    from safetensors.torch import load_file

    files = sorted(ckpt.glob("*.safetensors"))
    assert files, f"no safetensors in {ckpt}"
    tensors = load_file(str(files[0]))
    name = sorted(k for k in tensors if k.endswith("q_proj.weight"))[0]
    return name, tensors[name]


def test_one_iteration_rollout_train_evaluate_promote(tmp_path, smollm2):
    from conductor.learning.registry import Registry
    from conductor.run.config import NightlyConfig
    from flows.nightly import nightly_flow

    work = tmp_path / "night"
    kw = dict(pool=str(ROOT / "data/pools/simulated.yaml"), train_questions="gsm8k_train:1,mmlu_stem[100:101]",
              eval_questions="gsm8k_test:1,mmlu_stem[0:1]", work_dir=str(work), base=str(smollm2), night="t1",
              iterations=1, questions_per_iteration=2, group_size=4, eval_samples=1, max_tokens=64, fewshot="ood:1",
              shard_size=2)
    res = nightly_flow(NightlyConfig(**kw, baselines=True, grpo={"learning_rate": 1e-4, "total_iterations": 1,
                                                                 "warmup_ratio": 0.0, "micro_batch_size": 2})).to_json()
    # the rollout ran and was stored; the step produced a finite loss
    (it,) = res["iterations"]
    assert it["trajectories"] == 8 and it["checkpoint_id"] == "nightly-t1-it0"
    assert it["loss"] is not None and math.isfinite(it["loss"])
    # the checkpoint exists with its lineage, and its weights differ from the base model's
    ckpt = work / "checkpoints" / "nightly-t1-it0"
    lineage = json.loads((ckpt / "lineage.json").read_text())
    assert lineage["rollout_run"] == "nightly-t1-it0" and lineage["pool_id"] == "simulated-4@v1"
    assert lineage["parent"] == str(smollm2) and lineage["hyperparameters"]["learning_rate"] == 1e-4
    from conductor.learning.grpo.checkpoint import resolve_model

    base_dir, gguf = resolve_model(str(smollm2))
    from conductor.lake.reader import scan

    rows = scan(str(work / "lake"), kind="rollout", run_id="nightly-t1-it0").collect()
    signal = any(len(set(g)) > 1 for g in rows.group_by("question_id").agg("reward")["reward"].to_list())
    assert gguf is None  # the trainer converted the GGUF once; compare the weights with that copy
    name, before = _first_tensor(base_dir)
    _, after = _first_tensor(ckpt)
    assert before.shape == after.shape
    # GRPO moves the weights exactly when some group's rewards differ (else every advantage is 0)
    assert (not (before == after).all()) == signal, f"{name}: changed={not (before == after).all()} signal={signal}"
    # evaluation ran candidate vs champion on the same questions, and the decision was recorded with its reason:
    # two held-out questions cannot make a candidate significantly better, so it must not be promoted
    decision = res["decision"]
    assert decision is not None and decision["promote"] is False and decision["reason"]
    reg = Registry.open(str(work / "registry"))
    assert reg.champion.checkpoint_id == "base"
    assert reg.backend.aliases().get("challenger") == "nightly-t1-it0"
    report = Path(res["report"]).read_text()
    assert "Promotion decision" in report and "recorded as challenger" in report
    assert (Path(res["report"]).parent / "iterations.png").stat().st_size > 5_000
    assert (Path(res["report"]).parent / "accuracy_vs_dollars.png").stat().st_size > 5_000
    # rerunning the same night resumes: nothing is trained twice, no rollout rows are duplicated
    again = nightly_flow(NightlyConfig(**kw, baselines=False, force=True)).to_json()
    rows = scan(str(work / "lake"), kind="rollout", run_id="nightly-t1-it0").collect()
    assert rows.height == 8 and again["iterations"][0]["checkpoint_id"] == "nightly-t1-it0"


def test_nightly_refuses_overlapping_train_and_eval(tmp_path):
    from conductor.run.config import NightlyConfig
    from flows.nightly import nightly_flow

    with pytest.raises(ValueError, match="overlap the training mix"):
        nightly_flow(NightlyConfig(pool=str(ROOT / "data/pools/simulated.yaml"), train_questions="mmlu_stem:3",
                                   eval_questions="mmlu_stem[2:4]", work_dir=str(tmp_path), base="unused"))
