"""GRPO: advantages, fine-tune modes, the clipped loss, and real training steps on real (small) models."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from conductor.learning.grpo.advantages import group_advantages, trajectory_advantages
from conductor.learning.grpo.config import GRPOConfig, GRPOConfigError, lr_at
from conductor.learning.grpo.modes import RandomizedPoolConfig, forced_recursion_samples
from conductor.learning.grpo.samples import build_samples
from conductor.trajectory import Round
from conductor.workers.pool import load_pool
from grpo_fixtures import rollout

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------ pure parts

def test_group_advantages_match_the_formula_and_skip_infra_failures():
    rewards = [1.0, 0.5, 0.0, None, 1.0]
    adv = group_advantages(rewards, eps=0.0)
    valid = [1.0, 0.5, 0.0, 1.0]
    mean = sum(valid) / 4
    std = math.sqrt(sum((r - mean) ** 2 for r in valid) / 3)
    assert adv[3] is None
    for r, a in zip(rewards, adv):
        if r is not None:
            assert a == pytest.approx((r - mean) / std)
    assert sum(a for a in adv if a is not None) == pytest.approx(0.0, abs=1e-12)
    assert group_advantages([None, None]) == [None, None]
    assert group_advantages([1.0, 0.0], ddof=0, eps=0.0) == [1.0, -1.0]


def test_trajectory_advantages_group_by_run_and_question():
    ts = rollout("r1", "q1", [1.0, 0.0]) + rollout("r1", "q2", [0.5, 0.5]) + rollout("r2", "q1", [0.0, 1.0, None])
    adv = trajectory_advantages(ts, eps=0.0)
    by = {(t.run_id, t.question_id, t.sample_index): adv[t.trajectory_id] for t in ts}
    assert by[("r1", "q1", 0)] > 0 > by[("r1", "q1", 1)]
    assert by[("r1", "q2", 0)] == 0 and by[("r1", "q2", 1)] == 0   # no contrast in the group
    assert by[("r2", "q1", 1)] > 0 and by[("r2", "q1", 2)] is None  # same question, other run: its own group


def test_recursion_rounds_are_samples_normalised_across_rounds_with_the_scored_discount():
    from conductor.grading.reward import recursion_round_rewards

    ts = rollout("r", "q", [1.0, 0.5, 1.0])
    for t in ts[::2]:
        t.rounds.append(Round(1, "recursion prompt", "model_id = []", None, None, "ok", kept_previous=True))
    ts[0].round_rewards = recursion_round_rewards([1.0, 1.0])      # as scoring writes it: root discounted
    ts[2].round_rewards = [0.25, None]                              # the recursion round's grading failed
    samples, stats = build_samples(ts)
    rewards = {(s.trajectory_id, s.depth): s.reward for s in samples}
    assert rewards == {(ts[0].trajectory_id, 0): 0.25, (ts[0].trajectory_id, 1): 1.0,
                       (ts[1].trajectory_id, 0): 0.5, (ts[2].trajectory_id, 0): 0.25}   # no second discount
    assert stats.n_samples == 4 and stats.n_groups == 1   # all rounds of the question form one group
    assert sum(s.advantage for s in samples) == pytest.approx(0.0, abs=1e-9)
    top = max(samples, key=lambda s: s.advantage)
    assert (top.trajectory_id, top.depth) == (ts[0].trajectory_id, 1)


def test_forced_recursion_assignment_is_half_of_each_group_and_reproducible():
    qs = [f"q{i}" for i in range(20)]
    a = forced_recursion_samples(qs, group_size=64, seed=3)
    assert all(len(v) == 32 and all(0 <= i < 64 for i in v) for v in a.values())
    assert a == forced_recursion_samples(qs, group_size=64, seed=3)
    assert a != forced_recursion_samples(qs, group_size=64, seed=4)
    with pytest.raises(ValueError):
        forced_recursion_samples(qs, 4, fraction=1.5)


def test_randomized_pool_gives_one_subpool_per_question_within_k_bounds():
    pool = load_pool(ROOT / "data" / "pools" / "simulated.yaml")
    cfg = RandomizedPoolConfig(k_min=2, k_max=3, seed=5)
    subs = {q: cfg.subpool_for(pool, q) for q in (f"q{i}" for i in range(40))}
    assert all(2 <= len(s) <= 3 for s in subs.values())
    assert {len(s) for s in subs.values()} == {2, 3}
    assert len({tuple(s.names) for s in subs.values()}) > 3                     # really varies by question
    assert all(cfg.subpool_for(pool, q).names == s.names for q, s in subs.items())   # stable for the whole group


def test_lr_schedule_warms_up_then_decays_to_min():
    cfg = GRPOConfig(total_iterations=200)       # the paper: lr 1e-6, warm-up 3% of 200 = 6 steps
    lrs = [lr_at(s, cfg) for s in range(200)]
    assert lrs[0] == pytest.approx(1e-6 / 6) and lrs[5] == pytest.approx(1e-6)
    assert all(a >= b for a, b in zip(lrs[6:], lrs[7:]))
    assert lrs[-1] == pytest.approx(0.0, abs=1e-12)


def test_config_defaults_are_the_papers_and_bad_fields_are_named(tmp_path):
    c = GRPOConfig()
    assert (c.learning_rate, c.warmup_ratio, c.clip_eps_low, c.kl_beta, c.total_iterations, c.max_completion_tokens) == (
        1e-6, 0.03, 0.2, 0.0, 200, 1024)
    f = tmp_path / "grpo.yaml"
    f.write_text("preset: cpu\nlearning_rate: -1\n")
    with pytest.raises(GRPOConfigError, match=r"grpo.yaml: learning_rate"):
        GRPOConfig.load(f)
    f.write_text("preset: cpu\ntotal_iterations: 7\n")
    assert GRPOConfig.load(f).total_iterations == 7 and GRPOConfig.load(f).dtype == "float32"


# ------------------------------------------------------------------ the loss (torch)

torch = pytest.importorskip("torch")


def test_clipped_loss_clips_only_in_the_direction_of_the_advantage():
    from conductor.learning.grpo.loss import clipped_token_loss

    logp = torch.tensor([[math.log(1.5), math.log(0.5)]], requires_grad=True)
    beh = torch.zeros(1, 2)
    tl = clipped_token_loss(logp, beh, torch.tensor([1.0]), 0.2, 0.2)
    # ratio 1.5 with A > 0: clipped at 1.2 (no gradient); ratio 0.5 with A > 0: not clipped
    assert tl.loss[0, 0].item() == pytest.approx(-1.2) and tl.loss[0, 1].item() == pytest.approx(-0.5)
    tl.loss.sum().backward()
    assert logp.grad[0, 0].item() == 0.0 and logp.grad[0, 1].item() == pytest.approx(-0.5)
    tl2 = clipped_token_loss(torch.tensor([[math.log(0.5)]]), torch.zeros(1, 1), torch.tensor([-1.0]), 0.2, 0.2)
    assert tl2.loss.item() == pytest.approx(0.8) and bool(tl2.clipped.item())


def test_kl_term_is_zero_at_the_reference_and_positive_elsewhere():
    from conductor.learning.grpo.loss import clipped_token_loss

    logp = torch.tensor([[-1.0, -2.0]])
    same = clipped_token_loss(logp, logp, torch.tensor([0.0]), ref_logp=logp, beta=0.1)
    assert torch.allclose(same.kl, torch.zeros(1, 2))
    other = clipped_token_loss(logp, logp, torch.tensor([0.0]), ref_logp=logp - 0.5, beta=0.1)
    assert bool((other.kl > 0).all()) and bool((other.loss > 0).all())


@pytest.mark.parametrize("mode", ["sequence-mean", "dapo", "dr-grpo"])
def test_micro_batch_contributions_sum_to_the_full_batch_loss(mode):
    from conductor.learning.grpo.loss import aggregate

    g = torch.Generator().manual_seed(0)
    loss = torch.randn(6, 5, generator=g)
    mask = torch.tensor([[1] * n + [0] * (5 - n) for n in (5, 3, 1, 4, 2, 5)], dtype=torch.bool)
    kw = dict(n_seqs_total=6, n_tokens_total=int(mask.sum()), max_len=5)
    full = aggregate(loss, mask, mode, n_micro=1, **kw)
    parts = sum(aggregate(loss[i:i + 2], mask[i:i + 2], mode, n_micro=3, **kw) for i in range(0, 6, 2))
    assert parts.item() == pytest.approx(full.item(), rel=1e-6)


# ------------------------------------------------------------------ real training steps

@pytest.fixture(scope="module")
def tiny(tiny: Path) -> Path:
    """The session's tiny checkpoint (tests/conftest.py); training it needs trl."""
    pytest.importorskip("trl")
    return tiny


def _seq_logprob(trainer, prompt: str, completion: str) -> float:
    from conductor.learning.grpo.batching import encode, make_batch
    from conductor.learning.grpo.logprobs import completion_logprobs
    from conductor.learning.grpo.samples import Sample

    e = encode(trainer.tokenizer, Sample("x", 0, ("r", "q"), prompt, completion, 0.0), trainer.cfg)
    with torch.no_grad():
        return float(completion_logprobs(trainer.model, make_batch([e], trainer.tokenizer.pad_token_id, "cpu"), 1.0).sum())


def test_gradient_step_raises_rewarded_completion_and_lowers_punished_one(tiny):
    from conductor.learning.grpo.trainer import PolicyTrainer

    cfg = GRPOConfig.cpu(learning_rate=3e-3, total_iterations=3, warmup_ratio=0.0, micro_batch_size=1)
    tr = PolicyTrainer(str(tiny), cfg)
    good, bad, prompt = "model_id = [1]", "model_id = [0]", "Route: what is 2+2?"
    before = (_seq_logprob(tr, prompt, good), _seq_logprob(tr, prompt, bad))
    m = tr.step(rollout("r1", "q1", [1.0, 0.0], completions=[good, bad], prompt=prompt))
    after = (_seq_logprob(tr, prompt, good), _seq_logprob(tr, prompt, bad))
    assert after[0] > before[0] and after[1] < before[1]
    assert m["n_recomputed_behaviour"] == 2 and m["ratio_mean"] == pytest.approx(1.0)   # first step: ratio 1
    assert math.isfinite(m["loss"]) and m["grad_norm"] > 0


def test_stored_behaviour_logprobs_are_used_for_the_ratio(tiny):
    from conductor.learning.grpo.trainer import PolicyTrainer

    cfg = GRPOConfig.cpu(learning_rate=1e-3, total_iterations=3)
    tr = PolicyTrainer(str(tiny), cfg)
    ids = [list(tr.tokenizer("model_id = [1]", add_special_tokens=False)["input_ids"]),
           list(tr.tokenizer("model_id = [0]", add_special_tokens=False)["input_ids"])]
    lps = [[-3.0] * len(ids[0]), [-3.0] * len(ids[1])]     # a behaviour policy unlike the current weights
    m = tr.step(rollout("r1", "q1", [1.0, 0.0], completions=["model_id = [1]", "model_id = [0]"],
                        token_ids=ids, logprobs=lps))
    assert m["n_recomputed_behaviour"] == 0
    assert m["ratio_mean"] != pytest.approx(1.0, abs=1e-3)


def test_grpo_step_saves_a_loadable_checkpoint_with_lineage_and_chains(tiny, tmp_path):
    from safetensors.torch import load_file

    from conductor.learning.grpo.trainer import grpo_step

    cfg = GRPOConfig.cpu(learning_rate=1e-3, total_iterations=4)
    ts = rollout("run-a", "q1", [1.0, 0.0, 0.5, None]) + rollout("run-a", "q2", [1.0, 1.0, 0.0, 0.0], prompt="Route: MCQ?")
    out1, m1 = grpo_step(str(tiny), ts, cfg, out=str(tmp_path / "ckpt-1"))
    lin = json.loads((Path(out1) / "lineage.json").read_text())
    assert lin["parent"] == str(tiny) and lin["rollout_run"] == "run-a" and lin["pool_id"] == "simulated-4@v1"
    assert lin["hyperparameters"]["learning_rate"] == 1e-3 and lin["metrics"]["n_infra_failed"] == 1
    assert lin["global_step"] == 1 and (Path(out1) / "optimizer.pt").is_file()
    w0, w1 = load_file(tiny / "model.safetensors"), load_file(Path(out1) / "model.safetensors")
    assert any(not torch.equal(w0[k], w1[k]) for k in w0), "weights did not change"
    assert math.isfinite(m1["loss"])
    out2, m2 = grpo_step(out1, ts, cfg, out=str(tmp_path / "ckpt-2"))
    lin2 = json.loads((Path(out2) / "lineage.json").read_text())
    assert lin2["parent"] == out1 and lin2["global_step"] == 2 and lin2["iteration"] == 2
    from conductor.learning.grpo.trainer import TrainError

    with pytest.raises(TrainError, match="already exists"):
        grpo_step(out1, ts, cfg, out=str(tmp_path / "ckpt-2"))
    with pytest.raises(TrainError, match="no trainable samples"):
        grpo_step(str(tiny), rollout("r", "q", [None, None]), cfg, out=str(tmp_path / "ckpt-x"))
    assert not (tmp_path / "ckpt-x").exists()


def test_lora_step_saves_a_merged_checkpoint(tiny, tmp_path):
    pytest.importorskip("peft")
    from safetensors.torch import load_file

    from conductor.learning.grpo.trainer import grpo_step

    cfg = GRPOConfig.cpu(learning_rate=5e-3, total_iterations=2, lora_r=4, lora_alpha=8, warmup_ratio=0.0)
    out, m = grpo_step(str(tiny), rollout("r", "q", [1.0, 0.0]), cfg, out=str(tmp_path / "lora-1"))
    w0, w1 = load_file(tiny / "model.safetensors"), load_file(Path(out) / "model.safetensors")
    assert set(w0) == set(w1)                                  # a plain (merged) HF checkpoint
    assert any(not torch.equal(w0[k], w1[k]) for k in w0)
    assert not (Path(out) / "optimizer.pt").exists() and math.isfinite(m["loss"])


def test_kl_against_the_reference_is_reported_when_beta_is_set(tiny):
    from conductor.learning.grpo.trainer import PolicyTrainer

    tr = PolicyTrainer(str(tiny), GRPOConfig.cpu(learning_rate=1e-2, total_iterations=3, kl_beta=0.1, warmup_ratio=0.0))
    ts = rollout("r", "q", [1.0, 0.0])
    assert tr.step(ts)["kl_ref"] == pytest.approx(0.0, abs=1e-9)   # first step: policy == reference
    assert tr.step(rollout("r2", "q", [1.0, 0.0]))["kl_ref"] > 0


def _smollm2_checkpoint() -> Path | None:
    """SmolLM2-135M as a HF checkpoint, converted once from the embedded GGUF (cached under $CONDUCTOR_HOME/hf)."""
    try:
        from conductor.local.embedded import installed
    except ImportError:
        return None
    gguf = installed().get("smollm2-135m-instruct")
    if gguf is None:
        return None
    from conductor.learning.grpo.checkpoint import ensure_hf_checkpoint

    return ensure_hf_checkpoint(gguf)


def test_real_grpo_step_on_smollm2_135m(tmp_path):
    """A real GRPO step on SmolLM2-135M (transformers, CPU, fp32): weights change, loss finite, lineage written."""
    ckpt = _smollm2_checkpoint()
    if ckpt is None:
        pytest.skip("SmolLM2-135M not installed: run `python -m conductor.local.embedded smollm2-135m-instruct`")
    from safetensors.torch import load_file

    from conductor.learning.grpo.trainer import grpo_step

    prompt = "Route this question to one of Model 0, Model 1. Question: what is 17*3?"
    comps = ["model_id = [0]\nsubtasks = [\"Solve it\"]\naccess_list = [[]]",
             "model_id = [1]\nsubtasks = [\"Solve it\"]\naccess_list = [[]]",
             "I don't know.", "model_id = [0, 1]\nsubtasks = [\"Solve\", \"Check\"]\naccess_list = [[], [\"all\"]]"]
    ts = rollout("smol-run", "q1", [1.0, 0.5, 0.0, None], completions=comps, prompt=prompt)
    cfg = GRPOConfig.cpu(learning_rate=1e-5, total_iterations=2, micro_batch_size=2, save_optimizer=False)
    out, m = grpo_step(str(ckpt), ts, cfg, out=str(tmp_path / "smol-it1"))
    assert math.isfinite(m["loss"]) and m["n_samples"] == 3 and m["n_infra_failed"] == 1
    lin = json.loads((Path(out) / "lineage.json").read_text())
    assert lin["rollout_run"] == "smol-run" and lin["parent"] == str(ckpt)
    w0, w1 = load_file(ckpt / "model.safetensors"), load_file(Path(out) / "model.safetensors")
    changed = [k for k in w1 if k in w0 and not torch.equal(w0[k], w1[k])]
    assert len(changed) > 10


def test_shared_prompt_forward_gives_the_same_logprobs_and_gradients(tiny):
    from conductor.learning.grpo.batching import encode, make_batch
    from conductor.learning.grpo.logprobs import completion_logprobs
    from conductor.learning.grpo.samples import Sample
    from conductor.learning.grpo.trainer import PolicyTrainer

    tr = PolicyTrainer(str(tiny), GRPOConfig.cpu(total_iterations=2))
    comps = ["model_id = [1]", "model_id = [0, 2]\nsubtasks = ['a', 'b']", "x"]
    enc = [encode(tr.tokenizer, Sample("t", 0, ("r", "q"), "Route: what is 2+2?", c, 0.0), tr.cfg) for c in comps]
    results = []
    for share in (False, True):
        tr.model.zero_grad()
        b = make_batch(enc, tr.tokenizer.pad_token_id, "cpu", share)
        assert b["shared"] is share
        lp = completion_logprobs(tr.model, b, 1.0)
        (lp * b["completion_mask"]).sum().backward()
        results.append((lp.detach() * b["completion_mask"], {n: p.grad.clone() for n, p in tr.model.named_parameters()}))
    (lp0, g0), (lp1, g1) = results
    assert torch.allclose(lp0, lp1, atol=1e-5)
    for n in g0:
        assert torch.allclose(g0[n], g1[n], atol=1e-6, rtol=1e-4), n


def test_training_with_and_without_prompt_sharing_gives_the_same_update(tiny):
    from conductor.learning.grpo.trainer import PolicyTrainer

    ts = rollout("r", "q1", [1.0, 0.0, 0.5, 1.0]) + rollout("r", "q2", [0.0, 1.0, 1.0], prompt="Route: other?")
    metrics, weights = [], []
    for share in (False, True):
        tr = PolicyTrainer(str(tiny), GRPOConfig.cpu(learning_rate=1e-3, total_iterations=2, share_prompt_forward=share,
                                                     micro_batch_size=8))
        metrics.append(tr.step(ts))
        weights.append({n: p.detach().clone() for n, p in tr.model.named_parameters()})
    assert metrics[0]["grad_norm"] == pytest.approx(metrics[1]["grad_norm"], rel=1e-4)
    assert metrics[0]["loss"] == pytest.approx(metrics[1]["loss"], abs=1e-6)
    # Adam divides by sqrt(v): float noise on near-zero gradients can move a weight by up to ~lr, no more
    for n in weights[0]:
        assert torch.allclose(weights[0][n], weights[1][n], atol=1e-3), n


def test_bf16_mixed_precision_keeps_fp32_weights_and_trains(tiny):
    from conductor.learning.grpo.trainer import PolicyTrainer

    tr = PolicyTrainer(str(tiny), GRPOConfig.cpu(dtype="bf16-mixed", learning_rate=1e-3, total_iterations=2))
    w0 = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    m = tr.step(rollout("r", "q", [1.0, 0.0]))
    assert all(p.dtype == torch.float32 for p in tr.model.parameters())   # master weights stay fp32
    assert math.isfinite(m["loss"]) and any(not torch.equal(w0[n], p) for n, p in tr.model.named_parameters())


def test_behaviour_logprobs_from_the_transformers_backend_match_the_trainer(tiny):
    """Sample with the transformers policy backend from the very model being trained: the trainer's
    tokenisation and log-probs must reproduce the sampler's, i.e. the first ratio is 1 and the KL 0."""
    backend_mod = pytest.importorskip("conductor.policy.transformers_backend")
    from conductor.generation import GenerationParams
    from conductor.learning.grpo.trainer import PolicyTrainer

    tr = PolicyTrainer(str(tiny), GRPOConfig.cpu(learning_rate=1e-3, total_iterations=2))
    backend = backend_mod.TransformersBackend(tr.model, tr.tokenizer, batch_size=4)
    prompt = "Route: what is 2+2?"
    gens = backend.generate([prompt], 4, GenerationParams(temperature=1.0, max_tokens=12, seed=0))[0]
    ts = rollout("r", "q", [1.0, 0.0, 0.5, 0.0], completions=[g.text for g in gens], prompt=prompt,
                 token_ids=[g.token_ids for g in gens], logprobs=[g.logprobs for g in gens])
    m = tr.step(ts)
    assert m["n_recomputed_behaviour"] == 0
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-4) and m["approx_kl"] == pytest.approx(0.0, abs=1e-6)
