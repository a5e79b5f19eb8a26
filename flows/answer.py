"""Bulk answering: a question set through the conductor and a worker pool, shard by shard, into the lake.

Resumable by content: the run id is derived from the question set and the settings, every shard is
committed to the lake atomically, and a rerun answers exactly the questions with no intact, successful
row for their current content and settings (flows/shards.py): another shard size redoes nothing, an
edited question redoes itself, infrastructure failures and damaged shard files are retried.

    python -m flows.answer gsm8k_test:5 --out runs/demo
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from conductor.pipeline import RunSpec
from conductor.preflight import derive_run_id  # noqa: F401  (kept importable from here)
from flows.shards import batch_mode, pending_shards, run_shards
from tasks.summary import summarize_run

DEFAULT_POOL = str(Path(__file__).resolve().parent.parent / "data" / "pools" / "local.yaml")


@flow(name="conductor-answer", persist_result=False, log_prints=True)
def answer_flow(questions: str, out: str, pool: str = DEFAULT_POOL, conductor: str = "auto",
                samples: int = 1, recursion_depth: int = 0, limit: int | None = None, shard_size: int = 5,
                k: int | None = None, seed: int = 0, temperature: float | None = None, max_tokens: int = 768,
                run_id: str | None = None, cache: str | None = None, replay: bool = False,
                show_progress: bool | None = None, lake: str | None = None, fewshot: str = "auto",
                constrained: bool | None = None, max_steps: int = 5, retry_failed: bool = True,
                batch: bool = False, batch_poll_s: float = 60.0, limits: str | None = None,
                compact: bool = False) -> dict[str, Any]:
    """Answer a question set; trajectories go to the lake (OUT/lake, or any local or s3:// root given),
    answers to OUT/answers.jsonl, a summary and report to OUT. ``batch``: worker calls go through the providers'
    batch APIs at half price, polled every ``batch_poll_s`` seconds (flows/shards.py). ``limits``: a store
    shared with other processes spending the same provider quotas (``sqlite:PATH``, ``prefect``;
    conductor/shared_limits.py). ``compact``: merge the run's shard files afterwards (conductor/lake/compact.py)."""
    from conductor.preflight import prepare_answer
    from conductor.progress import RunProgress
    from conductor.runtime import serving
    from conductor.secrets import redact_prefect_logs

    redact_prefect_logs()
    log = get_run_logger()
    inp = prepare_answer(questions, out, pool, conductor, samples=samples, recursion_depth=recursion_depth,
                         limit=limit, shard_size=shard_size, k=k, seed=seed, temperature=temperature,
                         max_tokens=max_tokens, run_id=run_id, cache=cache, lake=lake, fewshot=fewshot,
                         constrained=constrained, max_steps=max_steps)
    qs, manifest, run_id, lake, out_dir = inp.questions, inp.pool, inp.run_id, inp.lake, inp.out
    probe = RunSpec(run_id=run_id, kind="answer", pool=manifest, samples=samples, settings_key=inp.settings_key)
    plan = pending_shards(qs, probe, lake, shard_size, retry_failed)
    todo = plan.todo
    log.info("run %s: %d questions, %d to answer in %d shards, pool %s, conductor %s", run_id, len(qs),
             len(qs) - plan.done_questions, len(todo), manifest.id, conductor)
    if plan.done_questions:
        log.info("resuming: %d of %d questions already in the lake", plan.done_questions, len(qs))
    if plan.retried_questions:
        log.info("retrying %d questions that failed on infrastructure", plan.retried_questions)
    if todo:
        with serving(manifest, conductor=conductor) as live:
            spec = RunSpec(run_id=run_id, kind="answer", pool=live.pool, checkpoint_id=live.checkpoint_id,
                           samples=samples, subpool_k=k, seed=seed, recursion_depth=recursion_depth,
                           temperature=inp.temperature, max_tokens=max_tokens, fewshot=inp.fewshot,
                           constrained=inp.constrained, max_steps=max_steps, settings_key=inp.settings_key)
            executor = live.executor(cache_path=inp.cache, replay=replay, limits=limits)
            with RunProgress(len(qs) * samples, "answering", enabled=show_progress) as progress:
                progress.skip((len(qs) - sum(len(sq) for _, sq in todo)) * samples)
                run_shards(todo, spec, lake, live.cached_policy(executor), executor, progress.done,
                           batch=batch_mode(batch, batch_poll_s, live.pool))
    if compact:
        from conductor.lake.compact import compact as compact_lake

        log.info("lake compaction: %s", compact_lake(lake, run_id=run_id, kind="answer").line())
    return summarize_run(lake, run_id, str(out_dir), current=plan.current_ids)


if __name__ == "__main__":  # pragma: no cover
    import runpy
    import sys

    sys.argv = [sys.argv[0], "answer", *sys.argv[1:]]   # the `conductor answer` command, without importing the CLI here
    runpy.run_module("conductor", run_name="__main__")
