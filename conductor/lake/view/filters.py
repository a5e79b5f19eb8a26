"""The trajectory table's filters: query-string parameters in, one parameterised SQL ``WHERE`` out.

Every value reaches DuckDB as a bound parameter (never spliced into the text), numbers are parsed here with a
clear message, and an unknown choice is refused, so a hand-edited URL cannot change the query's shape.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FAILURES = ("any", "infra", "parse", "call_error", "none")
TRAINING = ("used", "unused", "unrecorded")
SORTS = {"": "", "cost_desc": "cost_usd DESC", "cost_asc": "cost_usd ASC", "steps_desc": "n_steps DESC",
         "reward_desc": "reward DESC NULLS LAST", "reward_asc": "reward ASC NULLS LAST",
         "advantage_desc": "advantage DESC NULLS LAST", "advantage_asc": "advantage ASC NULLS LAST"}
# A worker is "used" when any round's workflow names it (subpool ordinals -> names), read from the trajectory
# row itself, so the filter needs no join with the calls table.
_WORKER_USED = ("(list_contains(list_transform(steps, lambda s: subpool[s.worker + 1]), ?) OR "
                "list_contains(flatten(list_transform(recursion_rounds, lambda r: "
                "list_transform(r.steps, lambda s: subpool[s.worker + 1]))), ?))")


class FilterError(ValueError):
    """A filter value that cannot be used (names the parameter)."""


@dataclass(frozen=True)
class TrajectoryFilter:
    """What the trajectory table shows; empty strings and None mean "any"."""

    lake: int | None = None
    kind: str = ""
    run: str = ""
    checkpoint: str = ""
    dataset: str = ""
    domain: str = ""
    question_id: str = ""
    correct: str = ""           # true | false | ungraded
    reward_min: float | None = None
    reward_max: float | None = None
    worker: str = ""
    steps_min: int | None = None
    steps_max: int | None = None
    cost_min: float | None = None
    cost_max: float | None = None
    parse_status: str = ""
    failure: str = ""           # any | infra | parse | call_error | none
    training: str = ""          # used | unused | unrecorded
    unused_reason: str = ""
    q: str = ""                 # free text over the question
    sort: str = ""

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> TrajectoryFilter:
        """Parse query-string values (blank = unset); bad ones raise ``FilterError`` naming the parameter.

        >>> TrajectoryFilter.from_params({"dataset": "gsm8k", "cost_max": "0.01", "steps_min": ""}).cost_max
        0.01
        >>> TrajectoryFilter.from_params({"steps_min": "two"})
        Traceback (most recent call last):
        ...
        conductor.lake.view.filters.FilterError: steps_min: 'two' is not a whole number
        """
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = (params.get(f.name) or "").strip()
            if not raw:
                continue
            if f.name in ("lake", "steps_min", "steps_max"):
                try:
                    kw[f.name] = int(raw)
                except ValueError:
                    raise FilterError(f"{f.name}: {raw!r} is not a whole number") from None
            elif f.name in ("reward_min", "reward_max", "cost_min", "cost_max"):
                try:
                    kw[f.name] = float(raw)
                except ValueError:
                    raise FilterError(f"{f.name}: {raw!r} is not a number") from None
            else:
                kw[f.name] = raw
        out = cls(**kw)
        out._check()
        return out

    def _check(self) -> None:
        for name, value, allowed in (("correct", self.correct, ("true", "false", "ungraded")),
                                     ("failure", self.failure, FAILURES), ("training", self.training, TRAINING),
                                     ("sort", self.sort, tuple(SORTS))):
            if value and value not in allowed:
                raise FilterError(f"{name}: {value!r} is not one of {', '.join(a for a in allowed if a)}")

    def where(self) -> tuple[str, list[Any]]:
        """SQL condition over the trajectories view and its parameters.

        >>> TrajectoryFilter(dataset="gsm8k", correct="false", q="50%").where()
        ("dataset = ? AND correct = false AND question ILIKE ? ESCAPE '\\\\'", ['gsm8k', '%50\\\\%%'])
        >>> TrajectoryFilter().where()
        ('true', [])
        """
        conds: list[str] = []
        params: list[Any] = []
        for col, value in (("lake", self.lake), ("kind", self.kind), ("run_id", self.run),
                           ("checkpoint_id", self.checkpoint), ("dataset", self.dataset), ("domain", self.domain),
                           ("question_id", self.question_id), ("parse_status", self.parse_status),
                           ("unused_reason", self.unused_reason)):
            if value not in (None, ""):
                conds.append(f"{col} = ?")
                params.append(value)
        conds += {"true": ["correct = true"], "false": ["correct = false"], "ungraded": ["correct IS NULL"],
                  "": []}[self.correct]
        for col, lo, hi in (("reward", self.reward_min, self.reward_max), ("n_steps", self.steps_min, self.steps_max),
                            ("cost_usd", self.cost_min, self.cost_max)):
            if lo is not None:
                conds.append(f"{col} >= ?")
                params.append(lo)
            if hi is not None:
                conds.append(f"{col} <= ?")
                params.append(hi)
        if self.worker:
            conds.append(_WORKER_USED)
            params += [self.worker, self.worker]
        conds += {"any": ["(infra_failed OR parse_status <> 'ok' OR n_call_errors > 0)"],
                  "infra": ["infra_failed"], "parse": ["parse_status <> 'ok'"], "call_error": ["n_call_errors > 0"],
                  "none": ["(NOT infra_failed AND parse_status = 'ok' AND n_call_errors = 0)"], "": []}[self.failure]
        conds += {"used": ["used_in_training = true"], "unused": ["used_in_training = false"],
                  "unrecorded": ["used_in_training IS NULL"], "": []}[self.training]
        if self.q:
            conds.append("question ILIKE ? ESCAPE '\\'")
            params.append("%" + self.q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%")
        return (" AND ".join(conds) or "true"), params

    def order_by(self) -> str:
        return SORTS[self.sort]

    def params(self, **change: Any) -> dict[str, str]:
        """The query-string values of this filter (with ``change`` applied), unset ones left out."""
        values = {**dataclasses.asdict(self), **change}
        return {k: str(v) for k, v in values.items() if v not in (None, "")}

    @property
    def active(self) -> bool:
        return any(v not in (None, "") for k, v in dataclasses.asdict(self).items() if k != "sort")
