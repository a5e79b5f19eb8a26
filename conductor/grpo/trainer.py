"""One GRPO update from a stored rollout run: load a checkpoint, train on its trajectories, save the next one.

WHY not TRL's ``GRPOTrainer``: it couples generation and training in one process
(it samples the group itself, then updates). Here rollouts are produced by a
separate, resumable Prefect flow (vLLM on GPU, other backends on CPU), executed
against real worker pools and stored in the Parquet lake; training reads one
rollout run back. So this module keeps GRPOTrainer's math (the same clipped
objective, group advantages, loss aggregations, temperature-scaled log-probs)
but drives it from stored trajectories. From TRL it reuses
``selective_log_softmax`` (memory-efficient log_softmax + gather with
temperature); from transformers the models, tokenizers and chat
templates; from peft the LoRA adapters. See docs/learning.md.

``PolicyTrainer`` keeps model and optimizer in memory across updates (the CPU
benchmark trains many small steps in one process); ``grpo_step`` is the
stateless form a flow task calls: checkpoint in, checkpoint + metrics out.
With ``distributed: fsdp`` under ``torchrun`` both run sharded over the
processes (FSDP2, ``conductor.grpo.distributed``) and give the same update.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from conductor.grpo.config import GRPOConfig, lr_at
from conductor.grpo.samples import Sample, build_samples

if TYPE_CHECKING:
    from conductor.grpo.format import ConductorFormat


class TrainError(ValueError):
    """A training input that cannot be used (bad checkpoint path, empty run, ...); one line."""


# ------------------------------------------------------------------ checkpoints in and out

def _is_remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


def _cache_root() -> Path:
    from conductor.embedded import conductor_home

    return conductor_home() / "checkpoints-cache"


def resolve_model(spec: str) -> tuple[Path, str | None]:
    """A checkpoint spec -> (local directory, gguf file name or None).

    Accepts a HF checkpoint directory, a ``.gguf`` file (de-quantised by
    transformers; its converted copy under ``$CONDUCTOR_HOME/hf`` is used when
    the transformers backend made one), or an ``s3://``/fsspec URL of a
    checkpoint directory (downloaded once into a local cache).
    """
    if _is_remote(spec):
        import fsspec

        local = _cache_root() / hashlib.sha256(spec.encode()).hexdigest()[:16]
        if not (local / "config.json").is_file():
            fs, path = fsspec.core.url_to_fs(spec)
            if not fs.exists(f"{path.rstrip('/')}/config.json"):
                raise TrainError(f"{spec}: not a checkpoint (no config.json)")
            tmp = Path(tempfile.mkdtemp(prefix=".dl-", dir=_ensure(local.parent)))
            fs.get(path.rstrip("/") + "/", str(tmp), recursive=True)
            tmp.rename(local)
        return local, None
    p = Path(spec.removeprefix("file://"))
    if p.is_file() and p.suffix == ".gguf":
        try:
            from conductor.policy.transformers_backend import converted_dir

            conv = converted_dir(p)
            if (conv / "config.json").is_file():
                return conv, None
        except ImportError:
            pass
        return p.parent, p.name
    if p.is_dir() and (p / "config.json").is_file():
        return p, None
    raise TrainError(f"{spec}: not a checkpoint directory (no config.json) nor a .gguf file")


def _ensure(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


def read_parent_lineage(spec: str) -> dict[str, Any]:
    try:
        local, gguf = resolve_model(spec)
    except TrainError:
        return {}
    f = local / "lineage.json"
    if gguf is None and f.is_file():
        try:
            return json.loads(f.read_text())
        except ValueError:
            return {}
    return {}


def _parent_format(spec: str) -> Any:
    """The parent checkpoint's ``conductor_format.json`` (``conductor.grpo.format``), or None."""
    from conductor.grpo.format import load_format

    try:
        local, gguf = resolve_model(spec)
    except TrainError:
        return None
    return None if gguf is not None else load_format(local)


def _dtype_mode(cfg: GRPOConfig, device: str) -> str:
    """``cfg.dtype`` with ``auto`` resolved: bf16-mixed on GPU, float32 elsewhere.

    >>> _dtype_mode(GRPOConfig(), "cuda:0"), _dtype_mode(GRPOConfig(), "cpu"), _dtype_mode(GRPOConfig(dtype="float16"), "cpu")
    ('bf16-mixed', 'float32', 'float16')
    """
    return cfg.dtype if cfg.dtype != "auto" else ("bf16-mixed" if device.startswith("cuda") else "float32")


def _device_dtype(cfg: GRPOConfig) -> tuple[str, Any]:
    """(device, weight dtype); bf16-mixed keeps fp32 weights and autocasts the forward (see ``_autocast``)."""
    import torch

    device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    mode = _dtype_mode(cfg, device)
    dtype = torch.float32 if mode in ("float32", "bf16-mixed") else getattr(torch, mode)
    return device, dtype


def _autocast(cfg: GRPOConfig, device: str) -> Any:
    """bf16 autocast for the forward pass under bf16-mixed; a no-op context otherwise."""
    import contextlib

    import torch

    if _dtype_mode(cfg, device) != "bf16-mixed":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16)


def load_policy(spec: str, cfg: GRPOConfig, *, for_sharding: bool = False) -> tuple[Any, Any]:
    """(model, tokenizer) ready to train: dtype/device per config, LoRA wrapped when ``lora_r > 0``.

    ``for_sharding``: left on the CPU (FSDP moves each shard to its GPU) and with non-reentrant gradient
    checkpointing, the kind FSDP2 supports.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local, gguf = resolve_model(spec)
    device, dtype = _device_dtype(cfg)
    kw = {"gguf_file": gguf} if gguf else {}
    tokenizer = AutoTokenizer.from_pretrained(local, local_files_only=True, **kw)
    model = AutoModelForCausalLM.from_pretrained(local, local_files_only=True, dtype=dtype, **kw)
    if gguf:   # de-quantised weights are plain tensors; drop the GGUF marker so save_pretrained works
        model.hf_quantizer = None
        for obj in (model, model.config):
            if hasattr(obj, "quantization_config"):
                try:
                    delattr(obj, "quantization_config")
                except AttributeError:
                    pass
        try:
            model.is_quantized = False
        except AttributeError:      # a read-only property in some transformers versions
            pass
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not for_sharding:
        model.to(device)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(**({"gradient_checkpointing_kwargs": {"use_reentrant": False}}
                                               if for_sharding else {}))
        model.config.use_cache = False
    if cfg.lora_r > 0:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                                                 target_modules=cfg.lora_target_modules, task_type="CAUSAL_LM"))
    torch.manual_seed(cfg.seed)
    return model, tokenizer


def ensure_hf_checkpoint(gguf_path: str | Path) -> Path:
    """A trainable HF checkpoint for a .gguf file: de-quantised once, cached where the transformers
    backend looks (``converted_dir``), written atomically. Training from the GGUF directly works too but
    de-quantises on every load (about a minute for SmolLM2-135M on two cores)."""
    from conductor.policy.transformers_backend import converted_dir

    gguf = Path(gguf_path)
    if not gguf.is_file():
        raise TrainError(f"{gguf}: no such GGUF file")
    dest = converted_dir(gguf)
    if (dest / "config.json").is_file():
        return dest
    model, tok = load_policy(str(gguf), GRPOConfig(device="cpu", dtype="float32"))
    _ensure(dest.parent)

    def fill(stage: Path) -> None:
        model.save_pretrained(stage)
        tok.save_pretrained(stage)

    return publish_dir(dest, "config.json", fill)


def publish_dir(dest: Path, marker: str, fill: Any) -> Path:
    """Write a directory atomically: ``fill`` a temp dir beside ``dest``, then rename it into place, unless
    another process published ``dest`` (its ``marker`` file exists) meanwhile; nothing half-written stays."""
    stage = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        fill(stage)
        if (dest / marker).is_file():      # another process won the race
            shutil.rmtree(stage, ignore_errors=True)
        else:
            os.rename(stage, dest)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return dest


# ------------------------------------------------------------------ tokenisation

@dataclass
class Encoded:
    prompt_ids: list[int]
    completion_ids: list[int]
    behaviour: list[float] | None
    advantage: float
    reward: float


def render_prompt(tokenizer: Any, prompt: str, system_prompt: str | None = None) -> list[int]:
    """Prompt token ids exactly as the transformers policy backend builds them (chat template, no extra specials)."""
    messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
        {"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode(tokenizer: Any, s: Sample, cfg: GRPOConfig, system_prompt: str | None = None) -> Encoded:
    p = render_prompt(tokenizer, s.prompt, system_prompt)[-cfg.max_prompt_tokens:]
    if s.completion_token_ids:
        c = list(s.completion_token_ids)
    else:     # no stored ids: re-tokenise the text (no EOS is added: the stop reason is unknown)
        c = list(tokenizer(s.completion, add_special_tokens=False)["input_ids"])
    c = c[: cfg.max_completion_tokens]
    b = s.behaviour_logprobs
    behaviour = list(b[: len(c)]) if b and len(b) >= len(c) and s.completion_token_ids else None
    return Encoded(p, c, behaviour, s.advantage, s.reward)


def _batch(items: list[Encoded], pad_id: int, device: str, share_prompt: bool = False) -> dict[str, Any]:
    """Tensors for a micro-batch.

    Normal layout: prompts left-padded and completions right-padded, so every
    completion starts at the same column. Shared layout (all items have the same
    prompt, as the samples of one GRPO group do): the prompt once, completions
    right-padded; the prompt is then run once for the whole micro-batch.
    """
    import torch

    C = max(len(e.completion_ids) for e in items)
    comp = torch.tensor([e.completion_ids + [pad_id] * (C - len(e.completion_ids)) for e in items], device=device)
    cmask = torch.tensor([[1] * len(e.completion_ids) + [0] * (C - len(e.completion_ids)) for e in items],
                         device=device, dtype=torch.bool)
    if share_prompt and len(items) > 1 and all(e.prompt_ids == items[0].prompt_ids for e in items):
        return {"prompt_ids": torch.tensor([items[0].prompt_ids], device=device), "completion_ids": comp,
                "completion_mask": cmask, "P": len(items[0].prompt_ids), "C": C, "shared": True}
    P = max(len(e.prompt_ids) for e in items)
    ids, att = [], []
    for e in items:
        lp, lc = len(e.prompt_ids), len(e.completion_ids)
        ids.append([pad_id] * (P - lp) + e.prompt_ids + e.completion_ids + [pad_id] * (C - lc))
        att.append([0] * (P - lp) + [1] * (lp + lc) + [0] * (C - lc))
    input_ids = torch.tensor(ids, device=device)
    attention = torch.tensor(att, device=device)
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": input_ids, "attention_mask": attention, "position_ids": position_ids,
            "completion_ids": comp, "completion_mask": cmask, "P": P, "C": C, "shared": False}


def completion_logprobs(model: Any, batch: dict[str, Any], temperature: float, with_entropy: bool = False) -> Any:
    """Per-token log-probs of the completion tokens, (B, C), under logits / temperature; with ``with_entropy``
    also the per-token entropy of that distribution (no gradient), as ``(logp, entropy)``."""
    from trl.trainer.utils import selective_log_softmax, selective_log_softmax_and_entropy

    C = batch["C"]
    if batch.get("shared"):
        logits = _shared_prompt_logits(model, batch)
    else:
        kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                      position_ids=batch["position_ids"], use_cache=False)
        try:
            logits = model(**kwargs, logits_to_keep=C + 1).logits      # only the positions that predict the completion
        except TypeError:
            logits = model(**kwargs).logits[:, -(C + 1):]
        logits = logits[:, :C]
    if with_entropy:
        return selective_log_softmax_and_entropy(logits.float(), batch["completion_ids"], entropy_requires_grad=False,
                                                 temperature=temperature)
    return selective_log_softmax(logits.float(), batch["completion_ids"], temperature=temperature)


def _shared_prompt_logits(model: Any, batch: dict[str, Any]) -> Any:
    """Run the shared prompt once, repeat its KV cache over the batch, then run the completions.

    Gradients flow back through the cache into the single prompt pass, so this is
    the same loss and gradient as the padded layout (tested) at a fraction of the
    cost when prompts are long (few-shot conductor prompts are ~1k tokens).
    """
    import torch

    comp, cmask, P, C = batch["completion_ids"], batch["completion_mask"], batch["P"], batch["C"]
    B = comp.shape[0]
    out = model(input_ids=batch["prompt_ids"], use_cache=True, logits_to_keep=1)
    first = out.logits[:, -1:].expand(B, 1, out.logits.shape[-1])
    if C == 1:
        return first
    cache = out.past_key_values
    cache.batch_repeat_interleave(B)
    att = torch.cat([torch.ones(B, P, dtype=torch.long, device=comp.device), cmask[:, :-1].long()], dim=1)
    pos = torch.arange(P, P + C - 1, device=comp.device).unsqueeze(0).expand(B, -1)
    rest = model(input_ids=comp[:, :-1], attention_mask=att, position_ids=pos, past_key_values=cache, use_cache=True)
    return torch.cat([first, rest.logits], dim=1)


def _model_calls(items: list[Encoded], share: bool) -> int:
    """How many forward calls ``completion_logprobs`` makes for this micro-batch (the shared layout: two)."""
    shared = share and len(items) > 1 and all(e.prompt_ids == items[0].prompt_ids for e in items)
    return 2 if shared and max(len(e.completion_ids) for e in items) > 1 else 1


def _chunks(items: list[Encoded], size: int, share: bool) -> list[list[Encoded]]:
    """Micro-batches of at most ``size``; with ``share``, each holds one prompt (one GRPO group's samples)."""
    if not share:
        return [items[i:i + size] for i in range(0, len(items), size)]
    by_prompt: dict[tuple[int, ...], list[Encoded]] = {}
    for e in items:
        by_prompt.setdefault(tuple(e.prompt_ids), []).append(e)
    return [g[i:i + size] for g in by_prompt.values() for i in range(0, len(g), size)]


# ------------------------------------------------------------------ the trainer

class PolicyTrainer:
    """Model + optimiser kept in memory across GRPO updates.

    With ``distributed: fsdp`` under ``torchrun`` (WORLD_SIZE > 1) every rank builds one of these: the model
    (and the KL reference, when ``kl_beta > 0``) is sharded with FSDP2, each rank trains on its share of the
    micro-batches, and ``save`` gathers the full checkpoint that rank 0 writes. ``self.model`` is then an
    FSDP module whose forwards are collective: sample from saved checkpoints (vLLM), not from it.
    """

    def __init__(self, spec: str, config: GRPOConfig, *, system_prompt: str | None = None,
                 reference: str | None = None, tracker: Any = None):
        """``reference``: the starting policy that KL is measured against (and penalised, ``kl_beta > 0``);
        default: ``spec`` itself. A chain of one-step processes (the nightly flow) passes the chain's start.
        ``tracker``: a ``conductor.grpo.tracking.MetricsTracker``; every ``step`` logs its metrics there."""
        import torch

        from conductor.grpo import distributed

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
            self.device = distributed.init(_device_dtype(config)[0])
            distributed.on_rank0(lambda: resolve_model(spec), TrainError)   # an s3:// parent downloads once
        else:
            self.device, _ = _device_dtype(config)
        self.parent_lineage = read_parent_lineage(spec)
        self.conductor_format = _parent_format(spec)     # the decoding contract travels to every child
        self.model, self.tokenizer = load_policy(spec, config, for_sharding=self.sharded)
        self.global_step = int(self.parent_lineage.get("global_step", 0))
        self.iteration = int(self.parent_lineage.get("iteration", 0))
        self.ref_model = None
        wants_ref = config.kl_beta > 0 or config.track_kl
        if self.sharded:
            mode = _dtype_mode(config, self.device)
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
        try:
            local, gguf = resolve_model(self.spec)
        except TrainError:
            return
        f = local / "optimizer.pt"
        if gguf is None and f.is_file():
            try:
                if not self.sharded:
                    self.optimizer.load_state_dict(torch.load(f, map_location=self.device, weights_only=True))
                    return
                from conductor.grpo import distributed

                # optimizer.pt has the single-process layout whatever wrote it; rank 0 reads it and broadcasts.
                state = distributed.on_rank0(lambda: torch.load(f, map_location="cpu", weights_only=True), TrainError)
                distributed.load_full_optimizer_state(self.model, self.optimizer, state)
            except (ValueError, RuntimeError, KeyError) as e:
                raise TrainError(f"{f}: optimizer state does not match the model ({e})") from None

    def _ref_logprobs(self, batch: dict[str, Any]) -> Any:
        import torch

        with torch.no_grad():
            if self.ref_model is not None:
                return completion_logprobs(self.ref_model, batch, self.cfg.temperature)
            with self.model.disable_adapter():      # LoRA: the base model is the reference, for free
                return completion_logprobs(self.model, batch, self.cfg.temperature)

    def _my_chunks(self, chunks: list[list[Encoded]], share: bool) -> list[tuple[int, bool]]:
        """(chunk index, real?) this rank runs; one process runs every chunk in order (see ``assign_micro_batches``)."""
        from conductor.grpo.distributed import assign_micro_batches

        if not self.sharded:
            return [(i, True) for i in range(len(chunks))]
        costs = [sum(len(e.prompt_ids) + len(e.completion_ids) for e in c) for c in chunks]
        return assign_micro_batches(costs, [_model_calls(c, share) for c in chunks], self.world.rank, self.world.size)

    def _check_same_batch(self, enc: list[Encoded]) -> None:
        """Every rank must have built the very same samples (the shards are indices into this list)."""
        from conductor.grpo import distributed

        h = hashlib.sha256(json.dumps([(e.prompt_ids, e.completion_ids, e.advantage, e.behaviour) for e in enc])
                           .encode()).hexdigest()
        if len(set(distributed.all_gather(h))) > 1:
            raise TrainError("ranks built different sample lists from the rollout batch (trajectory order "
                             "or tokenizer differs between processes)")

    def _recompute_behaviour(self, missing: list[Encoded], share: bool) -> None:
        """Behaviour log-probs under the current weights for samples stored without them (ratio = 1 now)."""
        import torch

        cfg, pad = self.cfg, self.tokenizer.pad_token_id
        chunks = _chunks(missing, cfg.micro_batch_size, share)
        done: dict[int, list[float]] = {}
        where = {id(e): i for i, e in enumerate(missing)}
        self.model.eval()
        with torch.no_grad():
            for ci, real in self._my_chunks(chunks, share):
                chunk = chunks[ci]
                b = _batch(chunk, pad, self.device, share)
                with _autocast(cfg, self.device):
                    lp = completion_logprobs(self.model, b, cfg.temperature)
                if real:
                    for j, e in enumerate(chunk):
                        done[where[id(e)]] = lp[j, : len(e.completion_ids)].tolist()
        if self.sharded:
            from conductor.grpo import distributed

            for part in distributed.all_gather(done):
                done.update(part)
        for i, e in enumerate(missing):
            e.behaviour = done[i]

    def step(self, trajectories: Iterable[Any]) -> dict[str, Any]:
        """One GRPO iteration over a rollout batch; returns metrics (the same on every rank when sharded)."""
        import torch

        from conductor.grpo.loss import aggregate, clipped_token_loss, loss_stats

        t0 = time.time()
        cfg = self.cfg
        trajectories = list(trajectories)
        samples, stats = build_samples(trajectories, cfg.advantage_scale,
                                       cfg.advantage_eps, cfg.advantage_ddof)
        if not samples:
            raise TrainError(f"no trainable samples in {stats.n_trajectories} trajectories "
                             f"({stats.n_infra_failed} infra-failed, {stats.n_no_completion} without a completion)")
        for t in trajectories:
            if t.run_id and t.run_id not in self.runs:
                self.runs.append(t.run_id)
            if t.pool_id and t.pool_id not in self.pools:
                self.pools.append(t.pool_id)
        enc = [encode(self.tokenizer, s, cfg, self.system_prompt) for s in samples]
        enc = [e for e in enc if e.completion_ids]
        if self.sharded:
            self._check_same_batch(enc)
        pad = self.tokenizer.pad_token_id
        mb = cfg.micro_batch_size
        # Behaviour log-probs missing (backend gave none): recompute under the current weights, so ratio = 1 now.
        missing = [e for e in enc if e.behaviour is None and (e.advantage != 0 or cfg.kl_beta > 0)]
        share = cfg.share_prompt_forward and not cfg.gradient_checkpointing
        self._recompute_behaviour(missing, share)
        self.model.train()
        rng = random.Random(cfg.seed * 1_000_003 + self.iteration)
        agg: dict[str, float] = {"loss": 0.0, "clip_fraction": 0.0, "ratio_mean": 0.0, "approx_kl": 0.0, "kl_ref": 0.0,
                                 "entropy": 0.0}
        n_tok_seen = 0
        grad_norms, lrs = [], []
        for _epoch in range(cfg.epochs):
            order = list(range(len(enc)))
            rng.shuffle(order)
            k = cfg.optimizer_steps_per_batch
            for part in range(k):
                idx = order[part::k]
                group = [enc[i] for i in idx]
                if not group:
                    continue
                n_seqs = len(group)
                n_tokens = sum(len(e.completion_ids) for e in group)
                # A zero advantage gives exactly zero gradient when beta = 0: skip its forward pass,
                # but keep it in the normalisers so the loss equals the full-batch loss.
                active = [e for e in group if e.advantage != 0 or cfg.kl_beta > 0]
                chunks = _chunks(active, mb, share)
                n_micro = max(1, len(chunks))
                lr = lr_at(self.global_step, cfg)
                for g in self.optimizer.param_groups:
                    g["lr"] = lr
                self.optimizer.zero_grad(set_to_none=True)
                # this rank's sums: loss, clip_fraction, ratio_mean, approx_kl, kl_ref (token-weighted), tokens,
                # non-finite losses, entropy (token-weighted)
                part_sums = [0.0] * 8
                for ci, real in self._my_chunks(chunks, share):
                    chunk = chunks[ci]
                    b = _batch(chunk, pad, self.device, share)
                    with _autocast(cfg, self.device):
                        logp, ent = completion_logprobs(self.model, b, cfg.temperature, with_entropy=True)
                    mask = b["completion_mask"]
                    beh = torch.zeros_like(logp)
                    for j, e in enumerate(chunk):
                        beh[j, : len(e.behaviour)] = torch.tensor(e.behaviour, dtype=logp.dtype, device=logp.device)
                    adv = torch.tensor([e.advantage for e in chunk], dtype=logp.dtype, device=logp.device)
                    with _autocast(cfg, self.device):
                        ref = self._ref_logprobs(b) if (cfg.kl_beta > 0 or cfg.track_kl) else None
                    tl = clipped_token_loss(logp, beh, adv, cfg.clip_eps_low, cfg.clip_eps_high, ref, cfg.kl_beta)
                    loss = aggregate(tl.loss, mask, cfg.loss_aggregation, n_seqs_total=n_seqs, n_tokens_total=n_tokens,
                                     n_micro=n_micro, max_len=cfg.max_completion_tokens)
                    if not real:    # a padding micro-batch: same collective calls as the others, zero gradient
                        (loss * 0.0).backward()
                        continue
                    if not torch.isfinite(loss):
                        if not self.sharded:
                            raise TrainError(f"non-finite loss at global step {self.global_step} (check lr and dtype)")
                        part_sums[6] += 1        # raised on every rank below, before the optimizer step
                    loss.backward()
                    part_sums[0] += float(loss.detach())
                    st = loss_stats(tl, mask, logp.detach(), beh, ref)
                    ntok = int(mask.sum())
                    part_sums[5] += ntok
                    for j, key in enumerate(("clip_fraction", "ratio_mean", "approx_kl"), start=1):
                        part_sums[j] += st[key] * ntok
                    part_sums[4] += (st["kl_ref"] or 0.0) * ntok
                    part_sums[7] += float((ent * mask).sum())
                if self.sharded:
                    from conductor.grpo.distributed import sum_over_ranks

                    part_sums = sum_over_ranks(part_sums)
                    if part_sums[6]:
                        raise TrainError(f"non-finite loss at global step {self.global_step} (check lr and dtype)")
                step_loss = part_sums[0]
                n_tok_seen += int(part_sums[5])
                agg["entropy"] += part_sums[7]
                for j, key in enumerate(("clip_fraction", "ratio_mean", "approx_kl", "kl_ref"), start=1):
                    agg[key] += part_sums[j]
                params = [p for p in self.model.parameters() if p.requires_grad]
                max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else float("inf")
                gn = torch.nn.utils.clip_grad_norm_(params, max_norm)    # DTensor grads: the global norm
                grad_norms.append(float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn))
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                self.global_step += 1
                lrs.append(lr)
                agg["loss"] += step_loss
        self.iteration += 1
        self.model.eval()            # ready to sample from (a backend may share this model object)
        n_updates = max(1, len(lrs))
        rewards = [s.reward for s in samples]
        reward_mean = sum(rewards) / len(rewards)
        metrics = {
            "iteration": self.iteration, "global_step": self.global_step,
            "loss": agg["loss"] / n_updates,
            "reward_mean": reward_mean,
            "reward_std": (sum((r - reward_mean) ** 2 for r in rewards) / len(rewards)) ** 0.5,
            "accuracy": (sum(1 for t in trajectories if t.correct) /
                         max(1, sum(1 for t in trajectories if t.reward is not None and not t.infra_failed))),
            "advantage_abs_mean": sum(abs(s.advantage) for s in samples) / len(samples),
            "clip_fraction": agg["clip_fraction"] / max(n_tok_seen, 1),
            "ratio_mean": agg["ratio_mean"] / max(n_tok_seen, 1) if n_tok_seen else 1.0,
            "approx_kl": agg["approx_kl"] / max(n_tok_seen, 1),
            # KL(current || starting policy), k3 estimate over the tokens of the samples with a gradient
            "kl_ref": agg["kl_ref"] / n_tok_seen if (cfg.kl_beta > 0 or cfg.track_kl) and n_tok_seen else None,
            "entropy": agg["entropy"] / n_tok_seen if n_tok_seen else None,
            "grad_norm": sum(grad_norms) / max(1, len(grad_norms)),
            "lr": lrs[-1] if lrs else None,
            "n_trajectories": stats.n_trajectories, "n_samples": stats.n_samples, "n_groups": stats.n_groups,
            "n_zero_advantage_groups": stats.n_zero_advantage_groups, "n_infra_failed": stats.n_infra_failed,
            "n_recomputed_behaviour": len(missing), "n_tokens": sum(len(e.completion_ids) for e in enc),
            "time_s": round(time.time() - t0, 3),
        }
        from conductor.grpo.tracking import rollout_metrics

        roll = rollout_metrics(trajectories)
        for key in ("parse_rate", "worker_share", "calls_per_trajectory", "cache_hit_rate", "steps_per_workflow",
                    "call_seconds", "rollout_s"):
            metrics[key] = roll[key]
        self.history.append(metrics)
        if self.tracker is not None and (not self.sharded or self.world.rank == 0):
            self.tracker.log(metrics, step=self.iteration)
        return metrics

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

    def _check_free(self, out: str, overwrite: bool) -> None:
        if overwrite:
            return
        if _is_remote(out):
            import fsspec

            fs, rpath = fsspec.core.url_to_fs(out)
            if fs.exists(f"{rpath.rstrip('/')}/lineage.json"):
                raise TrainError(f"{out}: a checkpoint already exists there")
        elif Path(out.removeprefix("file://")).exists():
            raise TrainError(f"{Path(out.removeprefix('file://'))}: a checkpoint already exists there")

    def save(self, out: str, checkpoint_id: str | None = None, overwrite: bool = False) -> str:
        """Write a HF checkpoint + tokenizer + lineage.json (+ optimizer.pt) to a local dir or fsspec URL, atomically.

        Sharded: every rank calls this; the full weights and optimizer state are gathered to rank 0's CPU,
        rank 0 writes (the same files, ``optimizer.pt`` included, a single process writes) and the others wait
        for its outcome (a failure on rank 0 raises on every rank).
        """
        cid = checkpoint_id or out.rstrip("/").rsplit("/", 1)[-1]
        if not self.sharded:
            self._write(out, cid, overwrite, None, None)
            return out
        from conductor.grpo import distributed

        distributed.on_rank0(lambda: self._check_free(out, overwrite), TrainError)   # before the costly gather
        weights = distributed.full_model_state(self.model)
        optim = distributed.full_optimizer_state(self.model, self.optimizer) if self.cfg.save_optimizer else None
        distributed.on_rank0(lambda: self._write(out, cid, overwrite, weights, optim), TrainError)
        return out

    def _write(self, out: str, cid: str, overwrite: bool, weights: dict[str, Any] | None,
               optim: dict[str, Any] | None) -> None:
        """Stage the files, then rename into place (local) or upload with lineage.json last (remote).
        ``weights``/``optim``: gathered full state dicts (sharded training) or None (this process's own)."""
        import torch

        self._check_free(out, overwrite)
        remote = _is_remote(out)
        if remote:
            import fsspec

            fs, rpath = fsspec.core.url_to_fs(out)
            stage = Path(tempfile.mkdtemp(prefix=".ckpt-"))
        else:
            dest = Path(out.removeprefix("file://"))
            _ensure(dest.parent)
            stage = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
        try:
            model = self.model
            if self.cfg.lora_r > 0 and self.cfg.lora_merge_on_save:
                import copy

                model = copy.deepcopy(self.model).merge_and_unload()
            if weights is not None:
                model.save_pretrained(stage, state_dict=weights)
            else:
                model.save_pretrained(stage)
            self.tokenizer.save_pretrained(stage)
            if self.conductor_format is not None:
                from conductor.grpo.format import write_format

                write_format(stage, self.conductor_format)
            if self.cfg.save_optimizer and self.cfg.lora_r == 0:
                torch.save(optim if optim is not None else self.optimizer.state_dict(), stage / "optimizer.pt")
            (stage / "lineage.json").write_text(json.dumps(self.lineage(cid), indent=1, default=str))
            if remote:
                lineage = stage / "lineage.json"
                for f in sorted(stage.iterdir()):
                    if f != lineage:
                        fs.put(str(f), f"{rpath.rstrip('/')}/{f.name}", recursive=f.is_dir())
                fs.put(str(lineage), f"{rpath.rstrip('/')}/lineage.json")   # last: marks a complete checkpoint
                shutil.rmtree(stage, ignore_errors=True)
            else:
                if dest.exists():
                    shutil.rmtree(dest)
                os.rename(stage, dest)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise


def grpo_step(model_dir_or_spec: str, trajectories: Iterable[Any], config: GRPOConfig | None = None, *,
              out: str | None = None, checkpoint_id: str | None = None,
              system_prompt: str | None = None, reference: str | None = None,
              tracker: Any = None) -> tuple[str, dict[str, Any]]:
    """Load a checkpoint, run one GRPO iteration on ``trajectories``, save the child checkpoint.

    ``out`` defaults to a sibling directory ``<parent>-it<N>`` (for a .gguf
    parent: ``$CONDUCTOR_HOME/checkpoints/<name>-it<N>``). Returns (checkpoint path/URL, metrics).
    Under ``torchrun`` with ``distributed: fsdp`` every rank calls it with the same arguments; all return the
    same result and rank 0 writes the checkpoint. ``reference``/``tracker``: see ``PolicyTrainer``.
    """
    cfg = config or GRPOConfig()
    trainer = PolicyTrainer(model_dir_or_spec, cfg, system_prompt=system_prompt, reference=reference, tracker=tracker)
    metrics = trainer.step(trajectories)
    if out is None:
        base = model_dir_or_spec.rstrip("/")
        stem = base.rsplit("/", 1)[-1].removesuffix(".gguf").split("-it")[0]
        if base.endswith(".gguf") or _is_remote(base):
            from conductor.embedded import conductor_home

            out = str(conductor_home() / "checkpoints" / f"{stem}-it{trainer.iteration:04d}")
        else:
            out = str(Path(base).parent / f"{stem}-it{trainer.iteration:04d}")
    path = trainer.save(out, checkpoint_id)
    return path, metrics


def formatted_base(base: str, fmt: "ConductorFormat", root: str | Path) -> Path:
    """A HF copy of ``base`` (a .gguf file or a checkpoint directory) carrying ``fmt``, under ``root``; made
    once (atomically), reused after. The trainer then carries the format to every descendant."""
    from conductor.grpo.format import FORMAT_FILE, write_format

    src = Path(base)
    if src.is_file() and src.suffix == ".gguf":
        src = ensure_hf_checkpoint(src)
    else:
        local, gguf = resolve_model(base)
        if gguf is not None:
            raise TrainError(f"{base}: a GGUF inside a directory; pass the .gguf file")
        src = local
    dest = Path(root) / f"{src.name}-fmt{fmt.digest}"
    if (dest / FORMAT_FILE).is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)

    def fill(stage: Path) -> None:
        for f in src.iterdir():
            if f.is_file() and f.name not in (FORMAT_FILE, "optimizer.pt"):
                shutil.copy2(f, stage / f.name)
        write_format(stage, fmt)

    return publish_dir(dest, FORMAT_FILE, fill)
