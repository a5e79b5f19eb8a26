"""Scheduled bulk answering: one dated output directory per scheduled night, then the answer flow.

WHY a wrapper: a deployment's parameters are fixed, but the answer flow's run id is
derived from its inputs, so the same parameters every night would "resume" the
first night's finished run and do nothing. Each scheduled run writes under
``OUT_ROOT/<scheduled date>/`` instead; a retry of the same flow run (same scheduled
time) lands in the same directory and resumes its unfinished shards.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from prefect import flow, get_run_logger

from conductor.run.config import ScheduledAnswerConfig
from conductor.run.summary import RunSummary
from flows.answer import answer_flow


def dated_out(out_root: str, scheduled: dt.datetime | None) -> str:
    """The output directory of the run scheduled at ``scheduled`` (None means today, UTC).

    >>> dated_out("runs/nightly-answers", dt.datetime(2026, 11, 22, 6, 0, tzinfo=dt.timezone.utc))
    'runs/nightly-answers/2026-11-22'
    """
    when = scheduled or dt.datetime.now(dt.UTC)
    return str(Path(out_root) / when.astimezone(dt.UTC).date().isoformat())


@flow(name="conductor-scheduled-answer", persist_result=False, log_prints=True)
def scheduled_answer_flow(config: ScheduledAnswerConfig) -> RunSummary:
    """Answer QUESTIONS into OUT_ROOT/<scheduled date>/ (lake, answers.jsonl, report) with the answer flow.

    ``secret_blocks`` maps provider key variables to Prefect Secret block names, e.g.
    ``{"OPENAI_API_KEY": "openai-api-key"}`` (see docs/operations.md: rotating keys). ``batch``: the providers'
    batch APIs at half price, answers within hours (docs/operations.md: batch mode).
    """
    from prefect.runtime import flow_run

    from flows.secret_env import export_secret_blocks

    log = get_run_logger()
    exported = export_secret_blocks(config.secret_blocks)
    if exported:
        log.info("provider keys from Secret blocks: %s", ", ".join(exported))
    out = dated_out(config.out_root, flow_run.scheduled_start_time if flow_run.id else None)
    log.info("scheduled answering of %s into %s", config.questions, out)
    return answer_flow(config.answer_config(out))
