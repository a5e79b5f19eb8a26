"""A checkpoint's decoding contract: the workflow grammar it was trained under, carried with its weights.

WHY: a small conductor trained under a constrained grammar (a subtask vocabulary, at most N steps, no plan
line) must be decoded under the same grammar wherever it is used later (rollouts of the next night, the
evaluation flow, ``conductor answer --conductor champion``), or it writes out of distribution. So the
contract is a file in the checkpoint directory, ``conductor_format.json``; the trainer copies it from parent
to child, and the transformers policy backend applies it to every generation (replacing any generic
grammar a caller passes). The contract fixes everything but the number of workers, which is the sub-pool's:
the caller that built the prompt says it (``GenerationParams.n_workers``, ``Sample.n_workers``), and
``ConductorFormat.for_workers(k)`` gives the grammar.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from conductor.decoding.grammar import WorkflowGrammar
from conductor.decoding.subtasks import DEFAULT_SUBTASKS

FORMAT_FILE = "conductor_format.json"


@dataclass(frozen=True)
class ConductorFormat:
    """What the grammar lets the conductor choose: workers (always), subtasks from ``subtasks`` (free text when
    empty), access lists (binary), and the length ``min_steps``..``max_steps``; ``plan_chars`` 0 = no plan.

    >>> fmt = ConductorFormat(subtasks=("Go.",), max_steps=1)
    >>> fmt.for_workers(3).n_workers, 'id ::= "0" | "1" | "2"' in fmt.grammar(3)
    (3, True)
    """

    subtasks: tuple[str, ...] = field(default_factory=lambda: DEFAULT_SUBTASKS)
    max_steps: int = 2
    min_steps: int = 1
    plan_chars: int = 0
    subtask_chars: int = 400

    def __post_init__(self) -> None:
        self.for_workers(1)        # validates the vocabulary and the step bounds

    def for_workers(self, n_workers: int) -> WorkflowGrammar:
        """The contract's grammar over a sub-pool of ``n_workers`` workers."""
        return WorkflowGrammar(n_workers, self.max_steps, plan_chars=self.plan_chars, subtask_chars=self.subtask_chars,
                               subtasks=tuple(self.subtasks) or None, min_steps=self.min_steps)

    def grammar(self, n_workers: int) -> str:
        """GBNF text of ``for_workers(n_workers)``."""
        return self.for_workers(n_workers).gbnf()

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


def load_format(checkpoint_dir: str | Path) -> ConductorFormat | None:
    """The contract in ``checkpoint_dir``, None when it has none; a ValueError naming the file when it is bad."""
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
