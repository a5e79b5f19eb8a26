"""A tool worker that takes a majority vote: ``provider: vote`` (no model, no code).

WHY: self-consistency (k samples, majority answer) must run through the same
executor, grader and lake as every other strategy, so the vote is a workflow
step like any other. It extracts each visible response's final answer with
``conductor.extract.answer`` (tag, boxed, "the answer is", last number), groups equal
answers (numbers by value, choice letters case-blind, other text by its
whitespace-normalised lower case; a response with no extractable answer votes
with its whole text), and replies with the first response holding the most
common answer: ties go to the answer seen first. The grader then reads that
response as it would any worker's. Free (0 tokens) and deterministic.

The self-consistency strategy adds this worker to its pool itself
(``conductor.policy.strategies``); it is never part of a shipped manifest.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from conductor.workers.providers.base import Completion, Message, register_provider

if TYPE_CHECKING:
    from conductor.workers.pool import Worker

NOTHING = "No answers to vote on: this step was shown no earlier responses."


def answer_key(response: str) -> str:
    """What two responses must share to count as the same vote.

    >>> answer_key("so <answer>$1,200</answer>") == answer_key("The answer is 1200.")
    True
    >>> answer_key("The answer is (b).") == answer_key("<answer>B</answer>")
    True
    >>> answer_key("no answer here at all")
    'text:no answer here at all'
    """
    from conductor.extract.answer import extract
    from conductor.extract.numbers import to_number

    found = extract(response)
    if found is None:
        return "text:" + " ".join(response.lower().split())
    value = to_number(found)
    if value is not None:
        return f"num:{value:.12g}"
    bare = found.strip().strip("()[]*.$ ")
    if len(bare) == 1 and bare.isalpha():
        return "letter:" + bare.upper()
    return "text:" + " ".join(found.lower().split())


def majority(responses: list[str]) -> tuple[str, int]:
    """(the first response with the most common answer, its vote count); ties go to the answer seen first.

    >>> majority(["<answer>3</answer>", "<answer>4</answer>", "It is 4.", "<answer>3</answer>"])
    ('<answer>3</answer>', 2)
    """
    keys = [answer_key(r) for r in responses]
    counts = Counter(keys)
    best = max(counts.values())
    winner = next(k for k in keys if counts[k] == best)     # first seen among the most common
    return responses[keys.index(winner)], best


class VoteTool:
    def __init__(self, worker: Worker):
        self.worker = worker

    async def complete(self, messages: list[Message], *, sample_index: int = 0) -> Completion:
        from conductor.workers.providers.python_tool import shown_responses

        responses = shown_responses(messages)
        if not responses:
            return Completion(NOTHING, 0, 0, "stop")
        text, _ = majority(responses)
        return Completion(text, 0, 0, "stop")

    async def aclose(self) -> None:
        return None


@register_provider("vote")
def _factory(worker: Worker) -> VoteTool:
    return VoteTool(worker)
