"""Sharded GRPO (FSDP2): a step on 2 `torchrun` processes (gloo, CPU) equals the single-process step on the same
batch — weights, AdamW state and metrics — and its checkpoint chains into the next sharded step; the Prefect
train flow launching torchrun itself (slow: Prefect's ephemeral server adds ~25 s here); the config errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conductor.learning.grpo.config import GRPOConfig, GRPOConfigError
from grpo_fixtures import rollout, tiny_checkpoint

ROOT = Path(__file__).resolve().parent.parent
LR = 1e-3
# Gradients are sums of the same micro-batch gradients in another order (per rank, then over ranks), so they
# agree to float32 rounding (~1e-9 here). AdamW's first steps move a weight by ~lr * g / (|g| + eps): for the
# rare element whose gradient is ~eps (1e-8) that rounding is amplified up to ~lr * 1e-3. So: AdamW moments
# tight; weights within RTOL/ATOL except at most a 1e-3 fraction of elements, and never beyond 1% of lr.
RTOL, ATOL, MAX_OUTLIERS, MAX_DIFF = 1e-4, 1e-6, 1e-3, 0.01 * LR


def test_fsdp_config_choices_and_one_line_errors(tmp_path, monkeypatch):
    from conductor.learning.grpo.launch import processes_for, torchrun_command

    assert GRPOConfig.paper().distributed == "fsdp" and GRPOConfig().distributed == "none"
    assert GRPOConfig.cpu().distributed == "none"
    f = tmp_path / "grpo.yaml"
    f.write_text("preset: paper\nlora_r: 64\n")
    with pytest.raises(GRPOConfigError) as e:
        GRPOConfig.load(f)
    assert str(e.value) == (f"{f}: distributed: fsdp shards full fine-tuning; LoRA (lora_r > 0) trains on one GPU: "
                            "set distributed: none or lora_r: 0")
    f.write_text("preset: paper\nlora_r: 64\ndistributed: none\n")
    assert GRPOConfig.load(f).lora_r == 64
    f.write_text("distributed: ddp\n")
    with pytest.raises(GRPOConfigError, match=r"grpo.yaml: distributed: Input should be 'none' or 'fsdp'$"):
        GRPOConfig.load(f)
    assert processes_for({"distributed": "none"}, None) == 1 and processes_for({}, 3) == 3
    with pytest.raises(ValueError, match="nproc_per_node: must be >= 1"):
        processes_for({}, 0)
    with pytest.raises(ValueError, match="nproc_per_node: must be >= 1"):
        torchrun_command(0, run_id="r", lake="l", base="b", out="o")
    # several processes but no sharding asked for: every rank would train and write alone -> refused up front
    pytest.importorskip("torch")
    from conductor.learning.grpo.trainer import PolicyTrainer, TrainError

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(TrainError, match=r"launched as 2 processes \(WORLD_SIZE\) but distributed is 'none'"):
        PolicyTrainer(str(tmp_path / "nowhere"), GRPOConfig.cpu())


def _weights(d: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(d / "model.safetensors")


def _max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _assert_same_checkpoint(single: Path, sharded: Path) -> float:
    import torch

    os_, of = (torch.load(d / "optimizer.pt", weights_only=True) for d in (single, sharded))
    assert os_["param_groups"] == of["param_groups"]                 # the very same file layout
    assert sorted(os_["state"]) == sorted(of["state"])
    for i, st in os_["state"].items():
        for k, v in st.items():
            assert torch.allclose(v.float(), of["state"][i][k].float(), rtol=RTOL, atol=1e-9), (i, k)
    moments = max(float((v.float() - of["state"][i][k].float()).abs().max())
                  for i, st in os_["state"].items() for k, v in st.items() if k == "exp_avg")
    print(f"\nmax |single - fsdp| AdamW exp_avg: {moments:.3g}")
    ws, wf = _weights(single), _weights(sharded)
    outliers = sum(int((~torch.isclose(ws[k], wf[k], rtol=RTOL, atol=ATOL)).sum()) for k in ws)
    assert outliers <= MAX_OUTLIERS * sum(v.numel() for v in ws.values()), outliers
    diff = _max_diff(ws, wf)
    assert diff <= MAX_DIFF, diff
    return diff


def test_two_rank_fsdp_step_equals_the_single_process_step_and_chains(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("trl")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    from transformers import AutoTokenizer

    from conductor.lake import load_trajectories, write_shard
    from conductor.learning.grpo.launch import torchrun_train_step
    from conductor.learning.grpo.trainer import grpo_step

    base = tiny_checkpoint(tmp_path / "base")
    tok = AutoTokenizer.from_pretrained(base)
    # 4 groups: one with stored token ids + behaviour log-probs, one without contrast (no forward pass), one
    # infra failure, completions of different lengths; micro-batch 2 gives shared-prompt (2-call) and single
    # (1-call) micro-batches in uneven numbers, so one rank runs zero-weight padding micro-batches.
    stored = ["model_id = [1]", "model_id = [0, 2]"]
    ids = [list(tok(c, add_special_tokens=False)["input_ids"]) for c in stored]
    ts = (rollout("fsdp-run", "q1", [1.0, 0.0, 0.5, 1.0, None])
          + rollout("fsdp-run", "q2", [0.0, 1.0, 1.0], prompt="Route: which planet is largest?")
          + rollout("fsdp-run", "q3", [0.5, 0.5], prompt="Route: flat group?")
          + rollout("fsdp-run", "q4", [1.0, 0.0], prompt="Route: four?", completions=stored, token_ids=ids,
                    logprobs=[[-2.5] * len(i) for i in ids]))
    for t in ts:
        t.date = "2026-11-22"
    lake = str(tmp_path / "lake")
    write_shard(lake, ts, "00000")
    batch = load_trajectories(lake, "fsdp-run")
    cfg = GRPOConfig.cpu(learning_rate=LR, total_iterations=4, warmup_ratio=0.0, micro_batch_size=2,
                         max_grad_norm=0.02, distributed="fsdp")
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}

    # step 1: 2 processes (CLI under torchrun) vs this one process (fsdp degrades to the plain trainer)
    f1, mf = torchrun_train_step(2, run_id="fsdp-run", lake=lake, base=str(base), out=str(tmp_path / "fsdp-1"),
                                 config=cfg.to_json(), env=env, timeout=300)
    s1, ms = grpo_step(str(base), batch, cfg, out=str(tmp_path / "single-1"))
    assert Path(f1) == tmp_path / "fsdp-1"
    diff1 = _assert_same_checkpoint(Path(s1), Path(f1))
    moved = _max_diff(_weights(base), _weights(Path(s1)))
    assert moved > 0.5 * LR > 50 * diff1, (moved, diff1)              # a real update, reproduced to float noise
    assert mf["grad_norm"] == pytest.approx(ms["grad_norm"], rel=1e-5) and ms["grad_norm"] > 0.02  # clipped
    assert mf["loss"] == pytest.approx(ms["loss"], abs=1e-6)
    assert (mf["n_samples"], mf["n_recomputed_behaviour"], mf["n_infra_failed"]) == (ms["n_samples"], 7, 1)
    lin_f, lin_s = (json.loads((Path(d) / "lineage.json").read_text()) for d in (f1, s1))
    assert (lin_f["world_size"], lin_f["distributed"], lin_f["hyperparameters"]["distributed"]) == (2, "fsdp", "fsdp")
    assert (lin_s["world_size"], lin_s["distributed"]) == (1, "none")
    assert lin_f["rollout_run"] == "fsdp-run" and lin_f["global_step"] == 1

    # step 2 from the saved checkpoints, AdamW moments loaded back, with gradient checkpointing on
    cfg2 = cfg.model_copy(update={"gradient_checkpointing": True})
    f2, _ = torchrun_train_step(2, run_id="fsdp-run", lake=lake, base=f1, out=str(tmp_path / "fsdp-2"),
                                checkpoint_id="fsdp-2", config=cfg2.to_json(), env=env, timeout=300)
    s2, _ = grpo_step(s1, batch, cfg2, out=str(tmp_path / "single-2"))
    diff2 = _assert_same_checkpoint(Path(s2), Path(f2))
    lin2 = json.loads((Path(f2) / "lineage.json").read_text())
    assert (lin2["parent"], lin2["global_step"], lin2["world_size"], lin2["checkpoint_id"]) == (f1, 2, 2, "fsdp-2")
    # the moments matter: without them the second update is visibly different
    s2_fresh, _ = grpo_step(s1, batch, cfg2.model_copy(update={"save_optimizer": False}),
                            out=str(tmp_path / "single-2-fresh"))
    fresh = _max_diff(_weights(Path(s2_fresh)), _weights(Path(s2)))
    assert fresh > 0.1 * LR > 10 * diff2
    print(f"max |single - fsdp| weights step 1: {diff1:.3g}, step 2: {diff2:.3g} (update size {moved:.3g}; "
          f"step 2 without the saved moments: {fresh:.3g} away)")


def _lake_with_a_rollout(tmp_path: Path) -> str:
    from conductor.lake import write_shard

    ts = rollout("flow-run", "q1", [1.0, 0.0, 0.5, 1.0]) + rollout("flow-run", "q2", [0.0, 1.0], prompt="Route: MCQ?")
    for t in ts:
        t.date = "2026-11-22"
    write_shard(str(tmp_path / "lake"), ts, "00000")
    return str(tmp_path / "lake")


@pytest.mark.slow
def test_train_flow_runs_the_sharded_step_under_torchrun_and_registers_it(tmp_path):
    pytest.importorskip("trl")
    pytest.importorskip("prefect")
    from conductor.run.config import TrainConfig
    from flows.train import train_flow

    base = tiny_checkpoint(tmp_path / "base")
    lake = _lake_with_a_rollout(tmp_path)
    cfg = GRPOConfig.cpu(learning_rate=LR, total_iterations=2, micro_batch_size=2, distributed="fsdp")
    res = train_flow(TrainConfig(base=str(base), lake=lake, run_id="flow-run", out=str(tmp_path / "it1"),
                                 checkpoint_id="it1", registry=str(tmp_path / "reg"), grpo=cfg.to_json(),
                                 nproc_per_node=2))
    lin = json.loads((tmp_path / "it1" / "lineage.json").read_text())
    assert res.uri == str(tmp_path / "it1") and res.metrics == lin["metrics"]
    assert (lin["world_size"], lin["distributed"], lin["checkpoint_id"], lin["rollout_run"]) == (2, "fsdp", "it1",
                                                                                                  "flow-run")
    assert json.loads((tmp_path / "reg" / "registry.json").read_text())["checkpoints"]["it1"]["uri"] == res.uri
    with pytest.raises(Exception, match=r"torchrun train-step \(2 processes\) failed: .*distributed is 'none'"):
        train_flow(TrainConfig(base=str(base), lake=lake, run_id="flow-run", out=str(tmp_path / "it1-none"),
                               checkpoint_id="x", grpo=GRPOConfig.cpu().to_json(), nproc_per_node=2))
    assert not (tmp_path / "it1-none").exists()
