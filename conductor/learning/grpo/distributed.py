"""The process group and FSDP2 sharding: full fine-tuning across GPUs, one process per GPU under ``torchrun``.

WHY: full fine-tuning of a 7B conductor with fp32 master weights needs ~16 bytes per parameter (weights 4 +
gradients 4 + AdamW moments 8: ~112 GB), more than one 80 GB H100. torch's own FSDP2 (``fully_shard``)
shards all three over the ranks (ZeRO-3): each rank keeps 1/N of them and all-gathers one decoder layer's
weights only while that layer runs. With ``dtype: bf16-mixed`` the all-gathered weights are cast to bf16 for
compute (``MixedPrecisionPolicy``) while the shards, gradients after reduction and AdamW stay fp32.

The trainer stays data-parallel in the simplest exact way: every rank builds the same sample list, the
single-process micro-batches are dealt out to the ranks (whole micro-batches, so every loss aggregation,
token-mean included, keeps its normalisers), and gradients are SUMMED over ranks (divide factor 1), so one
sharded update equals the single-process update on the same batch. FSDP forwards are collective: every rank
must run the same sequence of model calls, so ranks with fewer micro-batches run zero-weight copies
(``assign_micro_batches``).

In one process (no ``torchrun``, or ``WORLD_SIZE=1``) nothing here runs: ``world().size == 1`` and the
trainer behaves exactly as with ``distributed: none``. torch is imported inside the functions.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    """This process's place among the ``torchrun`` processes."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def world(env: Mapping[str, str] | None = None) -> World:
    """Rank, world size and local rank from the variables ``torchrun`` sets (one process when unset).

    >>> world({}), world({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}).is_main
    (World(rank=0, size=1, local_rank=0), False)
    """
    env = os.environ if env is None else env
    return World(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0)))


def init(device: str) -> str:
    """Join the process group (NCCL on CUDA, gloo on CPU) once; returns this rank's device (``cuda:LOCAL_RANK``)."""
    import torch
    import torch.distributed as dist

    w = world()
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    dev = f"cuda:{w.local_rank}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(w.local_rank)
    if not dist.is_initialized():
        if cuda:
            dist.init_process_group("nccl", device_id=torch.device(dev))
        else:
            dist.init_process_group("gloo")
    if not w.is_main:        # one progress bar per run, not one per rank
        try:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        except ImportError:  # pragma: no cover - transformers is in the same extra
            pass
    return dev


def shutdown(wait_for_peers: bool = True, timeout_s: float = 120.0) -> None:
    """Leave the process group (a no-op, without importing torch, when none was joined).

    ``wait_for_peers``: meet every rank at a barrier first. Without it a rank that finished first tore its
    gloo pairs down while a peer's were still live, and aborted ("terminate called without an active
    exception", SIGABRT) in about 1 of 6 two-rank CPU steps here. On gloo the barrier is a monitored one with
    a timeout, so a peer that died does not hang the survivor; pass False on a failure path.
    """
    import sys
    from datetime import timedelta

    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    if wait_for_peers:
        try:
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=timedelta(seconds=timeout_s))
            else:
                dist.barrier()
        except RuntimeError:      # a peer died or timed out: leave anyway, the launcher reports the failure
            pass
    dist.destroy_process_group()


def decoder_layers(model: Any) -> list[Any]:
    """The transformer blocks to shard one by one.

    HF models name them in ``_no_split_modules`` (what accelerate's FSDP auto-wrap uses: LlamaDecoderLayer,
    Qwen2DecoderLayer, ...); otherwise the largest ModuleList of same-class children is taken.
    """
    import torch

    names = set(getattr(model, "_no_split_modules", None) or [])
    found = [m for m in model.modules() if type(m).__name__ in names]
    if found:
        return found
    best: list[Any] = []
    for m in model.modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) and len({type(c) for c in m}) == 1:
            if sum(p.numel() for p in m.parameters()) > sum(p.numel() for c in best for p in c.parameters()):
                best = list(m)
    return best


def shard_model(model: Any, dtype_mode: str, device: str) -> Any:
    """``fully_shard`` every decoder layer, then the root (embeddings, final norm, LM head); gradients summed.

    ``dtype_mode`` is the resolved ``GRPOConfig.dtype``: ``bf16-mixed`` computes in bf16 from fp32 shards and
    reduces gradients in fp32. Parameters move to ``device`` shard by shard.
    """
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.split(":")[0], (world().size,))
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if dtype_mode == "bf16-mixed" else MixedPrecisionPolicy())
    layers = decoder_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__}: no decoder layers found to shard")
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            # Each rank's loss is its share of the global loss (global normalisers), so the gradient is the SUM
            # over ranks, not FSDP's default mean. Sum-only collectives work on gloo and NCCL alike.
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    return model


def full_model_state(model: Any) -> dict[str, Any]:
    """The full (unsharded) state dict on CPU, on rank 0; ``{}`` on the others. Collective.

    Tied weights (an LM head sharing the embedding) come back as separate copies under both names, which
    ``save_pretrained`` can no longer recognise as tied: the later alias is dropped, as a single process's
    save does (it keeps ``model.embed_tokens.weight``, drops ``lm_head.weight``).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    seen: set[int] = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            sd.pop(name, None)
        seen.add(id(p))
    return sd


def _param_names(model: Any, optimizer: Any) -> list[str]:
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for g in optimizer.param_groups for p in g["params"]]


def full_optimizer_state(model: Any, optimizer: Any) -> dict[str, Any]:
    """The full optimizer state on rank 0 in ``Optimizer.state_dict()``'s own layout (parameters numbered in
    optimizer order), so ``optimizer.pt`` is the same file a single process writes; ``{}`` elsewhere. Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    osd: dict[str, Any] = cast("dict[str, Any]", get_optimizer_state_dict(
        model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)))
    if not world().is_main:
        return {}
    index = {name: i for i, name in enumerate(_param_names(model, optimizer))}
    return {"state": {index[name]: v for name, v in osd["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in osd["param_groups"]]}


def load_full_optimizer_state(model: Any, optimizer: Any, state: dict[str, Any] | None) -> None:
    """Load a single-process-layout optimizer state (read on rank 0 only; ``None`` elsewhere) into the sharded
    optimizer: rank 0 broadcasts it and every rank keeps its shards. Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    osd: dict[str, Any] = {}
    if world().is_main and state is not None:
        names = _param_names(model, optimizer)
        osd = {"state": {names[int(i)]: v for i, v in state["state"].items()},
               "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in state["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, osd,
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    for g in optimizer.param_groups:       # the broadcast turns tuples (AdamW betas) into lists
        for k, v in g.items():
            if k != "params" and isinstance(v, list):
                g[k] = tuple(v)


class RankError(RuntimeError):
    """Raised on the other ranks when rank 0 failed inside ``on_rank0`` (rank 0 raises its own error)."""


def on_rank0(fn: Callable[[], T], error: type[Exception] = RankError) -> T | None:
    """Run ``fn`` on rank 0 only, then tell every rank how it went (so none waits forever on a failed rank 0).

    Returns ``fn()``'s result on rank 0 and ``None`` elsewhere; when ``fn`` raised, rank 0 re-raises and the
    other ranks raise ``error`` with the same one-line message.
    """
    import torch.distributed as dist

    outcome: list[Any] = [None]
    result: T | None = None
    exc: BaseException | None = None
    if world().is_main:
        try:
            result = fn()
        except BaseException as e:      # noqa: BLE001 - reported to every rank, then re-raised
            exc = e
            outcome[0] = str(e) or type(e).__name__
    dist.broadcast_object_list(outcome, src=0)
    if exc is not None:
        raise exc
    if outcome[0] is not None:
        raise error(outcome[0])
    return result


def all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order. Collective."""
    import torch.distributed as dist

    out: list[Any] = [None] * world().size
    dist.all_gather_object(out, obj)
    return out


def sum_over_ranks(values: list[float]) -> list[float]:
    """Element-wise sum of a few floats over the ranks (metrics), in float64. Collective."""
    import torch
    import torch.distributed as dist

    dev = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor(values, dtype=torch.float64, device=dev)
    dist.all_reduce(t)
    return t.tolist()


def assign_micro_batches(costs: list[int], kinds: list[Hashable], rank: int, size: int) -> list[tuple[int, bool]]:
    """This rank's share of the global micro-batches: ``(index, real)`` in the order to run them.

    Micro-batches of each kind (the number of model calls one makes: the shared-prompt layout makes two)
    are dealt to the ranks in snake order by decreasing cost, so loads balance and every rank gets the same
    count per kind; a rank short of one runs a zero-weight copy of the cheapest micro-batch of that kind
    (``real=False``). So all ranks make the same sequence of (collective) FSDP model calls. One rank gets
    everything in the original order.

    >>> assign_micro_batches([5, 1, 3], [1, 1, 1], 0, 1)
    [(0, True), (1, True), (2, True)]
    >>> [assign_micro_batches([5, 1, 3, 2, 4], [2, 2, 1, 2, 2], r, 2) for r in (0, 1)]
    [[(0, True), (1, True), (2, True)], [(4, True), (3, True), (2, False)]]
    """
    if size == 1:
        return [(i, True) for i in range(len(costs))]
    mine: list[tuple[int, bool]] = []
    for kind in dict.fromkeys(kinds):
        idx = sorted((i for i, k in enumerate(kinds) if k == kind), key=lambda i: -costs[i])
        for r in range(0, len(idx), size):
            row = idx[r:r + size]
            slot = rank if (r // size) % 2 == 0 else size - 1 - rank
            mine.append((row[slot], True) if slot < len(row) else (idx[-1], False))
    return mine
