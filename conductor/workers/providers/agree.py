"""A gate that accepts agreeing answers: ``provider: agree`` (no model, no code), the cascade's decision.

WHY: the field's best cost result on GSM8K is a cascade, not a router (Yue et al. 2023, "mixture of thought
representations", arXiv 2310.03094): accept the cheap model's answer when two different ways of reaching it
(chain of thought, a program) agree, and pay for a stronger step only when they disagree. The decision is a
workflow step like any other, so a cascade runs through the same executor, cache, grader and lake.

The gate extracts each visible response's final answer with the vote tool's ``answer_key`` (numbers by value,
choice letters case-blind). When every visible response has the same answer it replies with the first of them
and finish reason ``SETTLED``: the executor then leaves out every later step that sees the gate (the escalation
is never called, never paid) and the gate's reply is the round's answer. Otherwise it replies with a short note
naming the answers it saw (the deciding step reads it) and finish reason ``stop``. Free and deterministic.

The cascade strategy (``cascade:A+B:J``, ``conductor.policy.strategies``) appends this worker to its pool.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from conductor.workers.providers.base import SETTLED, Completion, Message, register_provider

if TYPE_CHECKING:
    from conductor.workers.pool import Worker

NOTHING = "No answers to compare: this step was shown fewer than two earlier responses."


def agreed(responses: list[str]) -> str | None:
    """The first response when every response gives the same final answer (at least two of them), else None.

    >>> agreed(["So it costs $1,200.\\n<answer>1200</answer>", "1200\\n"])
    'So it costs $1,200.\\n<answer>1200</answer>'
    >>> agreed(["The answer is (b).", "<answer>B</answer>"]) is not None
    True
    >>> agreed(["<answer>3</answer>", "4\\n"]) is None, agreed(["<answer>3</answer>"]) is None
    (True, True)
    """
    from conductor.workers.providers.vote import answer_key

    if len(responses) < 2:
        return None
    keys = {answer_key(r) for r in responses}
    return responses[0] if len(keys) == 1 else None


def disagreement_note(responses: list[str]) -> str:
    """What the deciding step is told when the answers differ.

    >>> disagreement_note(["<answer>3</answer>", "4\\n"])
    'The 2 answers above disagree (3 | 4): decide between them.'
    """
    from conductor.extract.answer import extract  # the recorded deciders' messages hold this text: keep it

    found = [(extract(r) or "no answer").strip() for r in responses]
    return f"The {len(responses)} answers above disagree ({' | '.join(found)}): decide between them."


class AgreeGate:
    def __init__(self, worker: Worker):
        self.worker = worker

    async def complete(self, messages: list[Message], *, sample_index: int = 0) -> Completion:
        from conductor.workers.providers.python_tool import shown_responses

        responses = shown_responses(messages)
        if len(responses) < 2:
            return Completion(NOTHING, 0, 0, "stop")
        accepted = agreed(responses)
        if accepted is not None:
            return Completion(accepted, 0, 0, SETTLED)
        return Completion(disagreement_note(responses), 0, 0, "stop")

    async def aclose(self) -> None:
        return None


@register_provider("agree")
def _factory(worker: Worker) -> AgreeGate:
    return AgreeGate(worker)
