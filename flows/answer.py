"""Bulk answering: a question set through the conductor and a worker pool, shard by shard, into the lake.

Resumable by content: the run id is derived from the question set and the settings, every shard is
committed to the lake atomically, and a rerun answers exactly the questions with no intact, successful
row for their current content and settings (conductor/run/shards.py): another shard size redoes nothing, an
edited question redoes itself, infrastructure failures and damaged shard files are retried.

    python -m flows.answer gsm8k_test:5 --out runs/demo
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from conductor.run.config import AnswerConfig
from conductor.run.pipeline import RunSpec
from conductor.run.shards import ShardLoop, batch_mode, pending_shards
from conductor.run.summary import RunSummary
from tasks.pipeline import TASK_STAGES
from tasks.summary import summarize_run


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
    if todo:
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


if __name__ == "__main__":  # pragma: no cover
    import runpy
    import sys

    sys.argv = [sys.argv[0], "answer", *sys.argv[1:]]   # the `conductor answer` command, without importing the CLI here
    runpy.run_module("conductor", run_name="__main__")
