"""Rollouts for GRPO: for each training question a sub-pool, a group of G conductor samples, executed,
scored and committed to the lake with token ids and log-probs. Resumable per shard; shards can fan out on a
Dask cluster (prefect-dask): ``on_dask(rollout_flow, address)(...)``.

    python -m flows.rollout --questions gsm8k_train:8 --lake runs/lake --pool data/pools/simulated.yaml \\
        --conductor transformers:~/.cache/conductor/models/smollm2-135m-instruct --group-size 4
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from conductor.pipeline import RunSpec
from flows.shards import fan_out_shards, run_shards, unfinished_shards


def rollout_spec(run_id: str, pool: Any, checkpoint_id: str, group_size: int, k: int | None, seed: int,
                 temperature: float, max_tokens: int, recursion_depth: int = 0, kind: str = "rollout",
                 fewshot: str = "ood") -> RunSpec:
    return RunSpec(run_id=run_id, kind=kind, pool=pool, checkpoint_id=checkpoint_id,  # type: ignore[arg-type]
                   samples=group_size, subpool_k=k, seed=seed, temperature=temperature, max_tokens=max_tokens,
                   recursion_depth=recursion_depth, fewshot=fewshot)


def _runs_remotely() -> bool:
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    return ctx is not None and type(ctx.task_runner).__name__ in ("DaskTaskRunner", "RayTaskRunner")


def on_dask(flow_fn: Any, address: str | None = None, n_workers: int = 2) -> Any:
    """The same flow with its shards on a Dask cluster: an existing one (``address``) or a local one."""
    from prefect_dask import DaskTaskRunner

    runner = (DaskTaskRunner(address=address) if address else
              DaskTaskRunner(cluster_kwargs={"n_workers": n_workers, "threads_per_worker": 1, "processes": True}))
    return flow_fn.with_options(task_runner=runner)


@flow(name="conductor-rollout", persist_result=False)
def rollout_flow(questions: str, lake: str, pool: str, conductor: str, run_id: str, group_size: int = 8,
                 k: int | None = None, seed: int = 0, temperature: float = 1.0, max_tokens: int = 1024,
                 recursion_depth: int = 0, limit: int | None = None, offset: int = 0, shard_size: int = 4,
                 cache: str | None = None, kind: str = "rollout", checkpoint_id: str | None = None,
                 fewshot: str = "ood", limits: str | None = None) -> dict[str, Any]:
    """Write one rollout run (GRPO groups) to the lake; returns counts and mean reward.

    ``limits``: the store the shard processes share provider limits through (``sqlite:PATH``, ``prefect``;
    conductor/shared_limits.py); fanned out on Dask/Ray it defaults to ``limits.sqlite`` next to the cache."""
    from conductor.pool import load_pool
    from conductor.questions import sharded
    from conductor.questionset import load_questions
    from conductor.runtime import checkpoint_of
    from conductor.secrets import redact_prefect_logs
    from conductor.summary import run_summary

    redact_prefect_logs()   # keys never reach Prefect's console or its log store
    log = get_run_logger()
    qs = load_questions(questions)
    if offset or limit is not None:  # a window over the set, wrapping around (iteration i of a training mix)
        n = limit if limit is not None else len(qs)
        qs = [qs[(offset + j) % len(qs)] for j in range(min(n, len(qs)))] if qs else []
    manifest = load_pool(pool)
    spec = rollout_spec(run_id, manifest, checkpoint_id or checkpoint_of(conductor), group_size, k, seed, temperature, max_tokens,
                        recursion_depth, kind, fewshot)
    shards = list(sharded(qs, shard_size))
    log.info("%s run %s: %d questions x %d samples in %d shards", kind, run_id, len(qs), group_size, len(shards))
    todo = unfinished_shards(shards, spec, lake)
    if todo and _runs_remotely():  # fan out: each Dask/Ray worker builds its own runtime from the plain specs
        from conductor.shared_limits import default_spec

        limits = limits or default_spec(cache, fans_out=True)   # one quota for every worker process
        log.info("%s run %s: provider limits shared through %s", kind, run_id, limits)
        written = fan_out_shards(todo, spec, lake, conductor, cache, limits)
    elif todo:            # in-process: one loaded policy, shards in order
        from dataclasses import replace

        from conductor.runtime import shared_live

        live = shared_live(manifest, conductor)
        written = run_shards(todo, replace(spec, pool=live.pool), lake, live.policy,
                             live.executor(cache, limits=limits), record_failures=False)
    else:
        written = 0
    summary, _ = run_summary(lake, run_id, kind)
    summary["written_now"] = written
    log.info("%s run %s: %d trajectories (%d new), mean reward %s, accuracy %s", kind, run_id,
             summary["trajectories"], written, summary["mean_reward"], summary["accuracy"])
    return summary
