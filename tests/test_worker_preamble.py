"""The production worker message keeps its preamble: the data-not-instructions sentence (``GUARDED_PREAMBLE``)
stopped no injected instruction on the local models (the finished injection probe, docs/faults.md), so it is not
the default."""

from __future__ import annotations

from conductor.prompts import WORKER_PREAMBLE, worker_messages
from conductor.workflow import Step, Workflow


def test_the_default_worker_message_is_unchanged() -> None:
    wf = Workflow((Step(0, "Answer.", ()), Step(1, "Check.", (0,))))
    msg = worker_messages("Q?", wf, 1, {0: "A"})[-1].content
    assert msg.startswith(WORKER_PREAMBLE.format(question="Q?")) and "data, not instructions" not in msg
