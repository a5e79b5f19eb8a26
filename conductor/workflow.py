"""The typed workflow record: the conductor's whole action, as data.

A workflow is a list of steps; each step names a worker by its ordinal index in
the pool the conductor was shown, the subtask text written for it, and an access
list saying which earlier steps (subtask + response) the worker may see.

Access is either ``"all"`` (every earlier step), ``()`` (none), or a tuple of
earlier step indices (the paper's fine-grained ablation, App. B.8).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

ALL: Literal["all"] = "all"
Access = Literal["all"] | tuple[int, ...]
DEFAULT_MAX_STEPS = 5


class WorkflowError(ValueError):
    """A workflow that is well-typed but breaks a rule (length, range, reference)."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class Step:
    worker: int
    subtask: str
    access: Access = ()

    def sees(self, position: int) -> tuple[int, ...]:
        """Indices of the earlier steps this step (at ``position``) may see."""
        if self.access == ALL:
            return tuple(range(position))
        return tuple(self.access)

    def to_json(self) -> dict[str, Any]:
        return {"worker": self.worker, "subtask": self.subtask,
                "access": ALL if self.access == ALL else list(self.access)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Step:
        access = d.get("access", [])
        return cls(int(d["worker"]), str(d["subtask"]),
                   ALL if access == ALL else tuple(int(a) for a in access))


@dataclass(frozen=True)
class Workflow:
    steps: tuple[Step, ...]

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def is_empty(self) -> bool:
        """Three empty lists: in a recursion round, 'keep the previous answer'."""
        return not self.steps

    @property
    def workers(self) -> tuple[int, ...]:
        return tuple(s.worker for s in self.steps)

    @property
    def access_mode(self) -> str:
        """'binary' when every entry is all/none, else 'fine' (explicit indices)."""
        fine = any(s.access != ALL and len(s.access) > 0 for s in self.steps)
        return "fine" if fine else "binary"

    def dependencies(self) -> list[tuple[int, ...]]:
        """For each step, the earlier steps whose responses it needs."""
        return [s.sees(i) for i, s in enumerate(self.steps)]

    def validate(self, n_workers: int | None = None, max_steps: int = DEFAULT_MAX_STEPS,
                 allow_empty: bool = False) -> Workflow:
        """Raise WorkflowError naming the list and the reason; return self when valid."""
        if not self.steps:
            if allow_empty:
                return self
            raise WorkflowError("workflow", "all three lists are empty")
        if len(self.steps) > max_steps:
            raise WorkflowError("model_id", f"{len(self.steps)} steps, at most {max_steps} allowed")
        for i, s in enumerate(self.steps):
            if isinstance(s.worker, bool) or not isinstance(s.worker, int):
                raise WorkflowError("model_id", f"entry {i} is not an integer: {s.worker!r}")
            if s.worker < 0 or (n_workers is not None and s.worker >= n_workers):
                bound = f"0..{n_workers - 1}" if n_workers else ">= 0"
                raise WorkflowError("model_id", f"entry {i} is {s.worker}, outside the pool ({bound})")
            if not isinstance(s.subtask, str) or not s.subtask.strip():
                raise WorkflowError("subtasks", f"entry {i} is empty")
            if s.access != ALL:
                for ref in s.access:
                    if isinstance(ref, bool) or not isinstance(ref, int):
                        raise WorkflowError("access_list", f"entry {i} refers to {ref!r}, not a step index")
                    if ref == i:
                        raise WorkflowError("access_list", f"entry {i} refers to itself")
                    if ref > i:
                        raise WorkflowError("access_list", f"entry {i} refers forward to step {ref}")
                    if ref < 0:
                        raise WorkflowError("access_list", f"entry {i} refers to negative step {ref}")
                if len(set(s.access)) != len(s.access):
                    raise WorkflowError("access_list", f"entry {i} repeats a step index")
        return self

    def to_json(self) -> dict[str, Any]:
        return {"steps": [s.to_json() for s in self.steps]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Workflow:
        return cls(tuple(Step.from_json(s) for s in d.get("steps", [])))

    @classmethod
    def from_lists(cls, model_id: list[int], subtasks: list[str], access_list: list[Access]) -> Workflow:
        if not (len(model_id) == len(subtasks) == len(access_list)):
            raise WorkflowError("workflow", "lists have different lengths: "
                                f"model_id={len(model_id)}, subtasks={len(subtasks)}, access_list={len(access_list)}")
        return cls(tuple(Step(m, s, a) for m, s, a in zip(model_id, subtasks, access_list)))

    def render(self) -> str:
        """Canonical text form: the three Python list literals the parser reads back."""
        access = [["all"] if s.access == ALL else list(s.access) for s in self.steps]
        return (f"model_id = {[s.worker for s in self.steps]!r}\n"
                f"subtasks = {[s.subtask for s in self.steps]!r}\n"
                f"access_list = {access!r}")
