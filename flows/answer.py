"""Bulk answering: a question set through the conductor and a worker pool, shard by shard, into the lake.

Resumable by content: the run id is derived from the question set and the settings, every shard is
committed to the lake atomically, and a rerun answers exactly the questions with no intact, successful
row for their current content and settings (conductor/run/shards.py): another shard size redoes nothing, an
edited question redoes itself, infrastructure failures and damaged shard files are retried.

    python -m flows.answer gsm8k_test:5 --out runs/demo

On a Dask cluster (``conductor answer --dask ADDRESS|local:N``; flows/fanout.py) each pending shard is one task
(tasks/shard.py: ``answer_shard_task``) that builds the runtime on its worker and commits the shard there; the
lake, the response cache and the provider limits (``limits.sqlite`` beside the cache by default) are shared.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect import flow, get_run_logger

from conductor.run.config import AnswerConfig
from conductor.run.pipeline import RunSpec
from conductor.run.shards import ShardLoop, batch_mode, pending_shards
from conductor.run.summary import RunSummary
from flows.fanout import runs_remotely
from tasks.pipeline import TASK_STAGES
from tasks.summary import summarize_run

if TYPE_CHECKING:
    from conductor.run.preflight import AnswerInputs
    from conductor.run.shards import Shards


@flow(name="conductor-answer", persist_result=False, log_prints=True)
def answer_flow(config: AnswerConfig) -> RunSummary:
    """Answer a question set (conductor/run/config.py: ``AnswerConfig``); trajectories go to the lake (OUT/lake,
    or any local or s3:// root given), answers to OUT/answers.jsonl, a summary and report to OUT. ``batch``:
    worker calls go through the providers' batch APIs at half price, polled every ``batch_poll_s`` seconds
    (conductor/run/shards.py). ``limits``: a store shared with other processes spending the same provider quotas
    (``sqlite:PATH``, ``prefect``; conductor/execution/shared_limits.py). ``compact``: merge the run's shard files
    afterwards (conductor/lake/compact.py)."""
    from conductor.run.preflight import prepare_answer
    from conductor.run.progress import RunProgress
    from conductor.run.runtime import serving
    from conductor.workers.secrets import mask_url, redact_prefect_logs

    redact_prefect_logs()
    log = get_run_logger()
    inp = prepare_answer(config)
    cfg, qs, lake = inp.config, inp.questions, str(inp.config.lake)
    probe = RunSpec.of(cfg, inp.pool, inp.checkpoint, inp.settings_key)
    plan = pending_shards(qs, probe, lake, cfg.shard_size, cfg.retry_failed, TASK_STAGES)
    todo = plan.todo
    log.info("run %s: %d questions, %d to answer in %d shards, pool %s, conductor %s", cfg.run_id, len(qs),
             len(qs) - plan.done_questions, len(todo), inp.pool.id, mask_url(str(cfg.conductor)))
    if plan.done_questions:
        log.info("resuming: %d of %d questions already in the lake", plan.done_questions, len(qs))
    if plan.retried_questions:
        log.info("retrying %d questions that failed on infrastructure", plan.retried_questions)
    if todo and runs_remotely():
        fan_out_answer(todo, probe, inp)
    elif todo:
        with serving(inp.pool, conductor=cfg.conductor) as live:
            spec = RunSpec.of(cfg, live.pool, live.checkpoint_id, inp.settings_key)
            executor = live.executor(cache_path=cfg.cache, replay=cfg.replay, limits=cfg.limits)
            with RunProgress(len(qs) * cfg.samples, "answering", enabled=cfg.show_progress) as progress:
                progress.skip((len(qs) - sum(len(sq) for _, sq in todo)) * cfg.samples)
                ShardLoop(spec, live.cached_policy(executor), executor, lake=lake, stages=TASK_STAGES,
                          on_done=progress.done, batch=batch_mode(cfg.batch, cfg.batch_poll_s, live.pool)).run(todo)
    if cfg.compact:
        from conductor.lake.compact import compact as compact_lake

        log.info("lake compaction: %s", compact_lake(lake, run_id=cfg.run_id, kind="answer").line())
    summary = summarize_run(lake, str(cfg.run_id), str(inp.out), current=plan.current_ids)
    return summary.with_outputs(answered_now=len(qs) - plan.done_questions)   # the rest were in the lake (resumed)


def fan_out_answer(todo: Shards, spec: RunSpec, inp: AnswerInputs) -> int:
    """Each pending shard as one task on the flow's Dask/Ray task runner; returns trajectories written. A shard
    whose task failed (after its retry) is left for the rerun, as a shard the in-process run did not reach; the
    summary counts its questions as not attempted, and the command exits 4."""
    from prefect.futures import as_completed

    from conductor.execution.shared_limits import default_spec
    from conductor.run.progress import RunProgress
    from tasks.shard import answer_shard_task

    log = get_run_logger()
    cfg = inp.config
    limits = cfg.limits or default_spec(cfg.cache, fans_out=True)    # one quota for every worker process
    log.info("run %s: %d shards on the Dask cluster; provider limits shared through %s", cfg.run_id, len(todo), limits)
    sizes = {}
    futures = []
    for sid, sq in todo:
        f = answer_shard_task.submit(list(sq), spec, sid, str(cfg.lake), cfg.conductor, cfg.cache, cfg.replay, limits)
        sizes[f.task_run_id] = len(sq) * cfg.samples
        futures.append(f)
    written = lost = 0
    with RunProgress(sum(sizes.values()), "answering", enabled=cfg.show_progress) as progress:
        for f in as_completed(futures):
            try:
                written += f.result()
            except Exception as e:  # noqa: BLE001 - one lost shard does not lose the others
                lost += 1
                log.warning("shard task %s failed (%s: %s); its questions are left for the rerun",
                            f.task_run_id, type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            progress.advance(sizes[f.task_run_id])
    if lost:
        log.warning("run %s: %d of %d shard tasks failed; rerun the same command to answer them",
                    cfg.run_id, lost, len(todo))
    return written


if __name__ == "__main__":  # pragma: no cover
    import runpy
    import sys

    sys.argv = [sys.argv[0], "answer", *sys.argv[1:]]   # the `conductor answer` command, without importing the CLI here
    runpy.run_module("conductor", run_name="__main__")
