"""A checkpoint's decoding contract: the workflow grammar it was trained under, carried with its weights.

WHY: a small conductor trained under a constrained grammar (a subtask vocabulary, at most N steps, no plan
line) must be decoded under the same grammar wherever it is used later (rollouts of the next night, the
evaluation flow, ``conductor answer --conductor champion``), or it writes out of distribution. So the
contract is a file in the checkpoint directory, ``conductor_format.json``; the trainer copies it from parent
to child, and the transformers policy backend applies it to every generation (replacing any generic
grammar a caller passes). The number of workers is read from the prompt's model list.

The default vocabulary (``DEFAULT_SUBTASKS``) is what the local learning benchmark trains over: the direct
subtask the single-worker baselines use (so those calls are shared through the response cache), a "reason,
then write a program" subtask whose program the python tool worker can run, and a "check the earlier work"
subtask.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from conductor.policy.fixed import DIRECT_SUBTASK

FORMAT_FILE = "conductor_format.json"
# Reasoning first, then the program: measured on the local pool, a program written without reasoning first
# was no better than the 1.5B answering alone (11 vs 12 of 30 GSM8K tuning questions), and the reasoned
# program run by the python worker was right on 13 of 30 held-out ones where the 1.5B alone got 8
# (docs/learning.md). "Prints only the final answer" because a two-step workflow ends on what it prints.
CODE_SUBTASK = ("Work out the solution step by step in a few short sentences. Then write a short Python program "
                "that follows your steps and prints only the final answer, in one python code block. "
                "Do not write its output.")
CHECK_SUBTASK = ("Check the earlier work step by step, fix any mistake, and give the final answer "
                 "in the format the question asks for.")
# Plain step-by-step work, then the answer. Measured on training questions: level with DIRECT_SUBTASK in both
# domains, below CHECK_SUBTASK on GSM8K (docs/learning.md); so not in the default vocabulary.
REASON_SUBTASK = ("Solve the question step by step in a few short sentences, then give the final answer "
                  "in the format the question asks for.")
# The worker picks checked step-by-step work or a direct answer by the question's form, a choice the 135M conductor
# never learned to make per domain. The 1.5B alone on training questions: GSM8K 0.69, MMLU-STEM 0.52, against 0.63
# and 0.35 for "check", 0.42 and 0.40 for "direct" (docs/learning.md, eighth attempt).
ADAPT_SUBTASK = ("If the answer is a number to be calculated, work it out step by step, check each step and fix "
                 "any mistake. Otherwise answer directly. Either way, give the final answer in the format the "
                 "question asks for.")
# "adapt" for a worker shown earlier steps. In the eighth attempt's chains (the 0.5B, then the 1.5B seeing it) the
# 1.5B copied the 0.5B's wrong MMLU-STEM letter in 153 of 332 chains from iteration 18 on: the chain scored 0.29
# where the 1.5B told to "adapt" alone scored 0.46 on the same questions (docs/learning.md).
# On 48 MMLU-STEM validation questions it did not stop the copying: the chain ending on "own" scored 0.29 against
# 0.375 for the 1.5B told to "adapt" alone. Kept for probes; not in any vocabulary trained so far.
OWN_SUBTASK = ("Earlier answers may be wrong: do not copy them, solve the question yourself. If the answer is a "
               "number to be calculated, work it out step by step and check each step. Otherwise answer directly. "
               "Either way, give the final answer in the format the question asks for.")
DEFAULT_SUBTASKS = (DIRECT_SUBTASK, CODE_SUBTASK, CHECK_SUBTASK)
# Short names for the vocabulary's subtasks, as benches print workflow shapes ("qwen2.5-coder-1.5b/check").
SUBTASK_LABELS = {"direct": DIRECT_SUBTASK, "code": CODE_SUBTASK, "check": CHECK_SUBTASK, "reason": REASON_SUBTASK,
                  "adapt": ADAPT_SUBTASK, "own": OWN_SUBTASK}
_MODEL_LINE = re.compile(r"^Model (\d+)\b", re.MULTILINE)


@dataclass(frozen=True)
class ConductorFormat:
    """What the grammar lets the conductor choose: workers (always), subtasks from ``subtasks`` (free text when
    empty), access lists (binary), and the length ``min_steps``..``max_steps``; ``plan_chars`` 0 = no plan."""

    subtasks: tuple[str, ...] = field(default_factory=lambda: DEFAULT_SUBTASKS)
    max_steps: int = 2
    min_steps: int = 1
    plan_chars: int = 0
    subtask_chars: int = 400

    def __post_init__(self) -> None:
        self.grammar(1)        # validates the vocabulary and the step bounds

    def grammar(self, n_workers: int) -> str:
        from conductor.grammar import workflow_grammar

        return workflow_grammar(n_workers, self.max_steps, plan_chars=self.plan_chars,
                                subtask_chars=self.subtask_chars, subtasks=list(self.subtasks) or None,
                                min_steps=self.min_steps)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["subtasks"] = list(self.subtasks)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ConductorFormat:
        unknown = set(d) - {"subtasks", "max_steps", "min_steps", "plan_chars", "subtask_chars"}
        if unknown:
            raise ValueError(f"conductor format: unknown field(s) {sorted(unknown)}")
        return cls(**{**d, "subtasks": tuple(d.get("subtasks", DEFAULT_SUBTASKS))})

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:12]


def n_workers_in(prompt: str) -> int | None:
    """How many workers a conductor prompt lists (its ``Model i`` lines), or None when it lists none.

    >>> n_workers_in("AVAILABLE LANGUAGE MODELS:\\nModel 0\\nModel 1: a coder\\nModel 2")
    3
    """
    ids = [int(m) for m in _MODEL_LINE.findall(prompt)]
    return max(ids) + 1 if ids else None


def load_format(checkpoint_dir: str | Path) -> ConductorFormat | None:
    f = Path(checkpoint_dir) / FORMAT_FILE
    if not f.is_file():
        return None
    try:
        return ConductorFormat.from_json(json.loads(f.read_text(encoding="utf-8")))
    except (ValueError, TypeError) as e:
        raise ValueError(f"{f}: {e}") from None


def write_format(checkpoint_dir: str | Path, fmt: ConductorFormat) -> Path:
    f = Path(checkpoint_dir) / FORMAT_FILE
    f.write_text(json.dumps(fmt.to_json(), indent=1), encoding="utf-8")
    return f
