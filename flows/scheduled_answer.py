"""Scheduled bulk answering: one dated output directory per scheduled night, then the answer flow.

WHY a wrapper: a deployment's parameters are fixed, but the answer flow's run id is
derived from its inputs, so the same parameters every night would "resume" the
first night's finished run and do nothing. Each scheduled run writes under
``OUT_ROOT/<scheduled date>/`` instead; a retry of the same flow run (same scheduled
time) lands in the same directory and resumes its unfinished shards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from conductor.run.config import DEFAULT_POOL, AnswerConfig
from conductor.run.summary import RunSummary
from flows.answer import answer_flow


def dated_out(out_root: str, scheduled: Any) -> str:
    """The output directory of the run scheduled at ``scheduled`` (a datetime; None means today, UTC).

    >>> import datetime as dt
    >>> dated_out("runs/nightly-answers", dt.datetime(2026, 11, 22, 6, 0, tzinfo=dt.timezone.utc))
    'runs/nightly-answers/2026-11-22'
    """
    import datetime as dt

    when = scheduled or dt.datetime.now(dt.UTC)
    return str(Path(out_root) / when.astimezone(dt.UTC).date().isoformat())


@flow(name="conductor-scheduled-answer", persist_result=False, log_prints=True)
def scheduled_answer_flow(questions: str, out_root: str, pool: str = DEFAULT_POOL, conductor: str = "auto",
                          samples: int = 1, recursion_depth: int = 0, limit: int | None = None, shard_size: int = 5,
                          k: int | None = None, seed: int = 0, temperature: float = 0.7,
                          max_tokens: int = 768, secret_blocks: dict[str, str] | None = None,
                          batch: bool = False, batch_poll_s: float = 60.0) -> RunSummary:
    """Answer QUESTIONS into OUT_ROOT/<scheduled date>/ (lake, answers.jsonl, report) with the answer flow.

    ``secret_blocks`` maps provider key variables to Prefect Secret block names, e.g.
    ``{"OPENAI_API_KEY": "openai-api-key"}`` (see docs/operations.md: rotating keys). ``batch``: the providers'
    batch APIs at half price, answers within hours (docs/operations.md: batch mode).
    """
    from prefect.runtime import flow_run

    from flows.secret_env import export_secret_blocks

    log = get_run_logger()
    exported = export_secret_blocks(secret_blocks)
    if exported:
        log.info("provider keys from Secret blocks: %s", ", ".join(exported))
    out = dated_out(out_root, flow_run.scheduled_start_time if flow_run.id else None)
    log.info("scheduled answering of %s into %s", questions, out)
    return answer_flow(AnswerConfig(questions=questions, out=out, pool=pool, conductor=conductor, samples=samples,
                                    recursion_depth=recursion_depth, limit=limit, shard_size=shard_size, k=k,
                                    seed=seed, temperature=temperature, max_tokens=max_tokens, show_progress=False,
                                    batch=batch, batch_poll_s=batch_poll_s))
