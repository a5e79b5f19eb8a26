"""Bulk answering: a question set through the conductor and a worker pool, shard by shard, into the lake.

Resumable by construction: the run id is derived from what the run is, every
shard is committed to the lake atomically, and a rerun skips committed shards
(after a crash or Ctrl-C only unfinished shards are redone; rows are never
duplicated because a shard's file name is fixed).

    python -m flows.answer gsm8k_test:5 --out runs/demo
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from conductor.pipeline import RunSpec
from flows.shards import pending_shards, run_shards
from tasks.summary import summarize_run

DEFAULT_POOL = str(Path(__file__).resolve().parent.parent / "data" / "pools" / "local.yaml")


def derive_run_id(*parts: Any) -> str:
    """Same inputs, same run id: that is what makes a rerun resume instead of starting over."""
    return "answer-" + hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


@flow(name="conductor-answer", persist_result=False, log_prints=True)
def answer_flow(questions: str, out: str, pool: str = DEFAULT_POOL, conductor: str = "auto",
                samples: int = 1, recursion_depth: int = 0, limit: int | None = None, shard_size: int = 5,
                k: int | None = None, seed: int = 0, temperature: float = 0.7, max_tokens: int = 768,
                run_id: str | None = None, cache: str | None = None, replay: bool = False,
                show_progress: bool | None = None, lake: str | None = None, fewshot: str = "ood",
                constrained: bool | None = None, max_steps: int = 5) -> dict[str, Any]:
    """Answer a question set; trajectories go to the lake (OUT/lake, or any local or s3:// root given),
    answers to OUT/answers.jsonl, a summary and report to OUT."""
    from conductor.pool import load_pool
    from conductor.progress import RunProgress
    from conductor.questionset import load_questions
    from conductor.runtime import checkpoint_of, serving

    log = get_run_logger()
    qs = load_questions(questions, limit)
    manifest = load_pool(pool)
    checkpoint = checkpoint_of(conductor)
    if constrained is None:  # the untrained embedded conductor writes prose too often without the grammar
        constrained = checkpoint.startswith("embedded:")
    run_id = run_id or derive_run_id(questions, limit, manifest.id, manifest.fingerprint, checkpoint, samples,
                                     recursion_depth, k, seed, temperature, max_tokens, fewshot, constrained,
                                     max_steps)
    out_dir = Path(out)
    lake = lake or str(out_dir / "lake")
    probe = RunSpec(run_id=run_id, kind="answer", pool=manifest)
    shards, todo = pending_shards(qs, probe, lake, shard_size)
    log.info("run %s: %d questions in %d shards, pool %s, conductor %s", run_id, len(qs), len(shards), manifest.id, conductor)
    if len(todo) < len(shards):
        log.info("resuming: %d of %d shards already in the lake", len(shards) - len(todo), len(shards))
    if todo:
        with serving(manifest, conductor=conductor) as live:
            spec = RunSpec(run_id=run_id, kind="answer", pool=live.pool, checkpoint_id=live.checkpoint_id,
                           samples=samples, subpool_k=k, seed=seed, recursion_depth=recursion_depth,
                           temperature=temperature, max_tokens=max_tokens, fewshot=fewshot, constrained=constrained,
                           max_steps=max_steps)
            executor = live.executor(cache_path=cache or str(out_dir / "cache.sqlite"), replay=replay)
            with RunProgress(len(qs) * samples, "answering", enabled=show_progress) as progress:
                progress.skip((len(qs) - sum(len(sq) for _, sq in todo)) * samples)
                run_shards(todo, spec, lake, live.policy, executor, progress.done)
    return summarize_run(lake, run_id, str(out_dir))


if __name__ == "__main__":  # pragma: no cover
    import sys

    from conductor.cli import main

    sys.argv = [sys.argv[0], "answer", *sys.argv[1:]]
    main()
