"""A policy that always writes the same workflow: the single-worker baselines as conductor output.

Running "worker i alone" through the very same pipeline (prompt, parse, execute,
grade, lake) makes baselines and conductor runs comparable row for row, cost
included. Spec: ``fixed:2`` (Model 2 answers the question directly).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from conductor.decoding.subtasks import DIRECT_SUBTASK
from conductor.generation import Generation, GenerationParams
from conductor.workflow import Step, Workflow


@dataclass
class FixedWorkflowPolicy:
    workflow: Workflow
    name: str = "fixed"
    runs_a_model: ClassVar[bool] = False    # a replay may write its workflows: no model runs (policy/cached.py)

    @classmethod
    def single_worker(cls, ordinal: int, subtask: str = DIRECT_SUBTASK) -> FixedWorkflowPolicy:
        """``fixed:i`` — one step, worker i, the question as the subtask.

        >>> FixedWorkflowPolicy.single_worker(2).generate(["q"], 1, GenerationParams())[0][0].text.splitlines()[0]
        'model_id = [2]'
        """
        return cls(Workflow((Step(ordinal, subtask, ()),)), name=f"fixed:{ordinal}")

    def generate(self, prompts: list[str], n: int, params: GenerationParams) -> list[list[Generation]]:
        text = self.workflow.render()
        return [[Generation(text=text, finish_reason="stop") for _ in range(n)] for _ in prompts]

    def close(self) -> None:
        return None
