"""One GRPO update from a stored rollout run: load a checkpoint, train on its trajectories, save the next one.

WHY not TRL's ``GRPOTrainer``: it couples generation and training in one process
(it samples the group itself, then updates). Here rollouts are produced by a
separate, resumable Prefect flow (vLLM on GPU, other backends on CPU), executed
against real worker pools and stored in the Parquet lake; training reads one
rollout run back. So this package keeps GRPOTrainer's math (the same clipped
objective, group advantages, loss aggregations, temperature-scaled log-probs)
but drives it from stored trajectories. From TRL it reuses
``selective_log_softmax``; from transformers the models, tokenizers and chat
templates; from peft the LoRA adapters. See docs/learning.md.

The pieces, by role: ``checkpoint`` (checkpoints in and out), ``batching`` (samples to padded tensors),
``logprobs`` (per-token log-probs under a model), ``update`` (the optimizer steps and their named sums),
``loss`` (the clipped objective). This module holds the state that ties them together.

``PolicyTrainer`` keeps model and optimizer in memory across updates (the CPU
benchmark trains many small steps in one process); ``grpo_step`` is the
stateless form a flow task calls: checkpoint in, checkpoint + metrics out.
With ``distributed: fsdp`` under ``torchrun`` both run sharded over the
processes (FSDP2, ``conductor.learning.grpo.distributed``) and give the same update.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from conductor.learning.grpo.batching import Encoded, encode, make_batch, micro_batches, model_calls
from conductor.learning.grpo.checkpoint import (
    TrainError,
    check_free,
    child_checkpoint_path,
    load_policy,
    optimizer_state_file,
    parent_format,
    read_parent_lineage,
    resolve_model,
    write_checkpoint,
)
from conductor.learning.grpo.config import GRPOConfig, lr_at
from conductor.learning.grpo.logprobs import completion_logprobs
from conductor.learning.grpo.precision import autocast, device_dtype, dtype_mode
from conductor.learning.grpo.samples import Sample, SampleStats, build_samples
from conductor.learning.grpo.update import iteration_metrics, run_update

if TYPE_CHECKING:
    from conductor.learning.grpo.tracking import MetricsTracker
    from conductor.trajectory import Trajectory

__all__ = ["PolicyTrainer", "TrainError", "grpo_step"]


class PolicyTrainer:
    """Model + optimiser kept in memory across GRPO updates.

    With ``distributed: fsdp`` under ``torchrun`` (WORLD_SIZE > 1) every rank builds one of these: the model
    (and the KL reference, when ``kl_beta > 0``) is sharded with FSDP2, each rank trains on its share of the
    micro-batches, and ``save`` gathers the full checkpoint that rank 0 writes. ``self.model`` is then an
    FSDP module whose forwards are collective: sample from saved checkpoints (vLLM), not from it.
    """

    def __init__(self, spec: str, config: GRPOConfig, *, system_prompt: str | None = None,
                 reference: str | None = None, tracker: MetricsTracker | None = None):
        """``reference``: the starting policy that KL is measured against (and penalised, ``kl_beta > 0``);
        default: ``spec`` itself. A chain of one-step processes (the nightly flow) passes the chain's start.
        ``tracker``: a ``conductor.learning.grpo.tracking.MetricsTracker``; every ``step`` logs its metrics there."""
        import torch

        from conductor.learning.grpo import distributed

        self.spec = spec
        self.reference = reference or spec
        self.tracker = tracker
        self.cfg = config
        self.system_prompt = system_prompt
        self.world = distributed.world()
        self.sharded = config.distributed == "fsdp" and self.world.size > 1
        if self.world.size > 1 and not self.sharded:
            raise TrainError(f"launched as {self.world.size} processes (WORLD_SIZE) but distributed is "
                             f"{config.distributed!r}: set distributed: fsdp, or run one process")
        if self.sharded:
            self.device = distributed.init(device_dtype(config)[0])
            distributed.on_rank0(lambda: resolve_model(spec), TrainError)   # an s3:// parent downloads once
        else:
            self.device, _ = device_dtype(config)
        self.parent_lineage = read_parent_lineage(spec)
        self.conductor_format = parent_format(spec)     # the decoding contract travels to every child
        self._lltok: Any = None                         # llguidance's vocabulary, for the contract's choices
        self.model, self.tokenizer = load_policy(spec, config, for_sharding=self.sharded)
        self.global_step = int(self.parent_lineage.get("global_step", 0))
        self.iteration = int(self.parent_lineage.get("iteration", 0))
        self.ref_model = None
        wants_ref = config.kl_beta > 0 or config.track_kl
        if self.sharded:
            mode = dtype_mode(config, self.device)
            if wants_ref:      # the frozen reference is sharded the same way
                self.ref_model = self._load_reference(for_sharding=True)
                distributed.shard_model(self.ref_model, mode, self.device)
            distributed.shard_model(self.model, mode, self.device)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=lr_at(self.global_step, config),
                                           betas=(config.adam_beta1, config.adam_beta2), eps=config.adam_eps,
                                           weight_decay=config.weight_decay)
        self._load_optimizer_state()
        self.history: list[dict[str, Any]] = []
        self.runs: list[str] = []
        self.pools: list[str] = []
        if wants_ref and not self.sharded and (config.lora_r == 0 or self.reference != self.spec):
            self.ref_model = self._load_reference(for_sharding=False)

    def _load_reference(self, for_sharding: bool) -> Any:
        """A frozen copy of the starting policy: this model when it is the reference, else loaded from ``reference``.
        (LoRA on its own parent needs no copy: the base model with the adapters disabled is the reference.)"""
        import copy

        if self.reference == self.spec:
            ref = copy.deepcopy(self.model)
            if self.cfg.lora_r > 0:
                ref = ref.merge_and_unload()
        else:
            ref, _ = load_policy(self.reference, self.cfg.model_copy(update={"lora_r": 0, "gradient_checkpointing": False}),
                                 for_sharding=for_sharding)
        ref.eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    def _load_optimizer_state(self) -> None:
        import torch

        if not self.cfg.save_optimizer or self.cfg.lora_r > 0:
            return
        f = optimizer_state_file(self.spec)
        if f is not None:
            try:
                if not self.sharded:
                    self.optimizer.load_state_dict(torch.load(f, map_location=self.device, weights_only=True))
                    return
                from conductor.learning.grpo import distributed

                # optimizer.pt has the single-process layout whatever wrote it; rank 0 reads it and broadcasts.
                state = distributed.on_rank0(lambda: torch.load(f, map_location="cpu", weights_only=True), TrainError)
                distributed.load_full_optimizer_state(self.model, self.optimizer, state)
            except (ValueError, RuntimeError, KeyError) as e:
                raise TrainError(f"{f}: optimizer state does not match the model ({e})") from None

    def ref_logprobs(self, batch: dict[str, Any]) -> Any:
        import torch

        with torch.no_grad():
            if self.ref_model is not None:
                return completion_logprobs(self.ref_model, batch, self.cfg.temperature)
            with self.model.disable_adapter():      # LoRA: the base model is the reference, for free
                return completion_logprobs(self.model, batch, self.cfg.temperature)

    def assigned(self, chunks: list[list[Encoded]], share: bool) -> list[tuple[int, bool]]:
        """(chunk index, real?) this rank runs; one process runs every chunk in order (see ``assign_micro_batches``)."""
        from conductor.learning.grpo.distributed import assign_micro_batches

        if not self.sharded:
            return [(i, True) for i in range(len(chunks))]
        costs = [sum(len(e.prompt_ids) + len(e.completion_ids) for e in c) for c in chunks]
        return assign_micro_batches(costs, [model_calls(c, share) for c in chunks], self.world.rank, self.world.size)

    def _check_same_batch(self, enc: list[Encoded]) -> None:
        """Every rank must have built the very same samples (the shards are indices into this list)."""
        from conductor.learning.grpo import distributed

        h = hashlib.sha256(json.dumps([(e.prompt_ids, e.completion_ids, e.advantage, e.behaviour) for e in enc])
                           .encode()).hexdigest()
        if len(set(distributed.all_gather(h))) > 1:
            raise TrainError("ranks built different sample lists from the rollout batch (trajectory order "
                             "or tokenizer differs between processes)")

    def _recompute_behaviour(self, missing: list[Encoded], share: bool) -> None:
        """Behaviour log-probs under the current weights for samples stored without them (ratio = 1 now)."""
        import torch

        cfg, pad = self.cfg, self.tokenizer.pad_token_id
        chunks = micro_batches(missing, cfg.micro_batch_size, share)
        done: dict[int, list[float]] = {}
        where = {id(e): i for i, e in enumerate(missing)}
        self.model.eval()
        with torch.no_grad():
            for ci, real in self.assigned(chunks, share):
                chunk = chunks[ci]
                b = make_batch(chunk, pad, self.device, share)
                with autocast(cfg, self.device):
                    lp = completion_logprobs(self.model, b, cfg.temperature)
                if real:
                    for j, e in enumerate(chunk):
                        done[where[id(e)]] = lp[j, : len(e.completion_ids)].tolist()
        if self.sharded:
            from conductor.learning.grpo import distributed

            for part in distributed.all_gather(done):
                done.update(part)
        for i, e in enumerate(missing):
            e.behaviour = done[i]

    def step(self, trajectories: Iterable[Trajectory]) -> dict[str, Any]:
        """One GRPO iteration over a rollout batch; returns metrics (the same on every rank when sharded)."""
        t0 = time.time()
        cfg = self.cfg
        trajectories = list(trajectories)
        samples, stats = self._samples(trajectories)
        enc = [encode(self.tokenizer, s, cfg, self.system_prompt) for s in samples]
        self._mark_choices(enc, samples)
        enc = [e for e in enc if e.completion_ids]
        if self.sharded:
            self._check_same_batch(enc)
        # Behaviour log-probs missing (backend gave none): recompute under the current weights, so ratio = 1 now.
        missing = [e for e in enc if e.behaviour is None and (e.advantage != 0 or cfg.kl_beta > 0)]
        share = cfg.share_prompt_forward and not cfg.gradient_checkpointing
        self._recompute_behaviour(missing, share)
        self.model.train()
        result = run_update(self, enc, share)
        self.iteration += 1
        self.model.eval()            # ready to sample from (a backend may share this model object)
        metrics = iteration_metrics(self, result, trajectories, samples, stats, enc, len(missing), t0)
        self.history.append(metrics)
        if self.tracker is not None and (not self.sharded or self.world.rank == 0):
            self.tracker.log(metrics, step=self.iteration)
        return metrics

    def _mark_choices(self, enc: list[Encoded], samples: list[Sample]) -> None:
        """Under a decoding contract, the loss sees only the tokens where the grammar left a choice
        (``conductor.decoding.vocabulary.choice_positions``); without one, every completion token."""
        fmt = self.conductor_format
        if fmt is None:
            return
        from conductor.decoding.vocabulary import choice_positions, eos_token_ids, llguidance_vocabulary

        if self._lltok is None:
            self._lltok = llguidance_vocabulary(self.model, self.tokenizer, eos_token_ids(self.model, self.tokenizer))
        for e, s in zip(enc, samples, strict=True):
            if s.n_workers and e.completion_ids:
                e.choice = choice_positions(self._lltok, fmt.grammar(s.n_workers), e.completion_ids)

    def _samples(self, trajectories: list[Any]) -> tuple[list[Sample], SampleStats]:
        """The batch's samples with their advantages; records the rollout runs and pools for the lineage."""
        cfg = self.cfg
        samples, stats = build_samples(trajectories, cfg.advantage_scale, cfg.advantage_eps, cfg.advantage_ddof,
                                       objective=cfg.objective)
        if not samples:
            raise TrainError(f"no trainable samples in {stats.n_trajectories} trajectories "
                             f"({stats.n_infra_failed} infra-failed, {stats.n_no_completion} without a completion)")
        for t in trajectories:
            if t.run_id and t.run_id not in self.runs:
                self.runs.append(t.run_id)
            if t.pool_id and t.pool_id not in self.pools:
                self.pools.append(t.pool_id)
        return samples, stats

    def lineage(self, checkpoint_id: str, metrics: dict[str, Any] | None = None) -> dict[str, Any]:
        import torch
        import transformers

        pl = self.parent_lineage
        try:
            import trl
            trl_v = trl.__version__
        except ImportError:  # pragma: no cover - trl is in the same extra
            trl_v = None
        return {
            "checkpoint_id": checkpoint_id,
            "parent": self.spec,
            "parent_checkpoint_id": pl.get("checkpoint_id"),
            "base_model": pl.get("base_model") or self.spec,
            "rollout_run": self.runs[-1] if len(self.runs) == 1 else list(self.runs),
            "pool_id": self.pools[0] if len(self.pools) == 1 else list(self.pools),
            "iteration": self.iteration, "global_step": self.global_step,
            "hyperparameters": self.cfg.to_json(),
            "conductor_format": self.conductor_format.to_json() if self.conductor_format is not None else None,
            "distributed": "fsdp" if self.sharded else "none", "world_size": self.world.size if self.sharded else 1,
            "metrics": metrics if metrics is not None else (self.history[-1] if self.history else {}),
            "history": self.history,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl_v},
        }

    def save(self, out: str, checkpoint_id: str | None = None, overwrite: bool = False) -> str:
        """Write a HF checkpoint + tokenizer + lineage.json (+ optimizer.pt) to a local dir or fsspec URL, atomically.

        Sharded: every rank calls this; the full weights and optimizer state are gathered to rank 0's CPU,
        rank 0 writes (the same files, ``optimizer.pt`` included, a single process writes) and the others wait
        for its outcome (a failure on rank 0 raises on every rank).
        """
        cid = checkpoint_id or out.rstrip("/").rsplit("/", 1)[-1]
        wants_optim = self.cfg.save_optimizer and self.cfg.lora_r == 0
        if not self.sharded:
            self._write(out, cid, overwrite, None, self.optimizer.state_dict() if wants_optim else None)
            return out
        from conductor.learning.grpo import distributed

        distributed.on_rank0(lambda: check_free(out, overwrite), TrainError)   # before the costly gather
        weights = distributed.full_model_state(self.model)
        optim = distributed.full_optimizer_state(self.model, self.optimizer) if self.cfg.save_optimizer else None
        distributed.on_rank0(lambda: self._write(out, cid, overwrite, weights, optim), TrainError)
        return out

    def _write(self, out: str, cid: str, overwrite: bool, weights: dict[str, Any] | None,
               optim: dict[str, Any] | None) -> None:
        write_checkpoint(out, model=self.model, tokenizer=self.tokenizer, cfg=self.cfg,
                         lineage=lambda: self.lineage(cid), conductor_format=self.conductor_format,
                         weights=weights, optimizer_state=optim, overwrite=overwrite)


def grpo_step(model_dir_or_spec: str, trajectories: Iterable[Trajectory], config: GRPOConfig | None = None, *,
              out: str | None = None, checkpoint_id: str | None = None,
              system_prompt: str | None = None, reference: str | None = None,
              tracker: MetricsTracker | None = None) -> tuple[str, dict[str, Any]]:
    """Load a checkpoint, run one GRPO iteration on ``trajectories``, save the child checkpoint.

    ``out`` defaults to a sibling directory ``<parent>-it<N>`` (for a .gguf
    parent: ``$CONDUCTOR_HOME/checkpoints/<name>-it<N>``). Returns (checkpoint path/URL, metrics).
    Under ``torchrun`` with ``distributed: fsdp`` every rank calls it with the same arguments; all return the
    same result and rank 0 writes the checkpoint. ``reference``/``tracker``: see ``PolicyTrainer``.
    """
    cfg = config or GRPOConfig()
    trainer = PolicyTrainer(model_dir_or_spec, cfg, system_prompt=system_prompt, reference=reference, tracker=tracker)
    metrics = trainer.step(trajectories)
    path = trainer.save(out or child_checkpoint_path(model_dir_or_spec, trainer.iteration), checkpoint_id)
    return path, metrics
