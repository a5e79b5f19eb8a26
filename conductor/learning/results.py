"""What the learning flows return: an evaluation (``EvalResult``) and a GRPO step (``TrainResult``).

WHY records, not dicts: the nightly flow, the command line and the tests read these results by field, and a
mistyped key in a dict is a ``KeyError`` at the end of a long night where a mistyped attribute is a type
error before it starts. ``to_json()`` is the mapping the flows always wrote (evaluation.json keeps its shape).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from conductor.learning.evaluation import EvalReport


@dataclass(frozen=True)
class EvalResult:
    """A candidate against the champion, per pool: ``"main"``, and ``"heldout"`` when held-out workers were
    named. ``runs[pool]`` maps each checkpoint id to its evaluation run id in the lake."""

    reports: dict[str, EvalReport]
    runs: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def main(self) -> EvalReport:
        """The comparison on the pool itself: what promotion decides on."""
        return self.reports["main"]

    @property
    def heldout(self) -> EvalReport | None:
        """The comparison on the held-out sub-pool, if one was evaluated."""
        return self.reports.get("heldout")

    def run_of(self, checkpoint_id: str, pool: str = "main") -> str:
        """The evaluation run id of ``checkpoint_id`` on ``pool``."""
        return self.runs[pool][checkpoint_id]

    @property
    def candidate_run(self) -> str:
        """The candidate's evaluation run on the main pool (the nightly report's lake report reads it)."""
        return self.run_of(self.main.candidate_id)

    def render(self) -> str:
        """Each pool's comparison as text, main pool first."""
        return "\n".join(f"== {name} pool ==\n{rep.render()}" for name, rep in self.reports.items())

    def to_json(self) -> dict[str, Any]:
        """evaluation.json: ``{"reports": {pool: report}, "runs": {pool: {checkpoint id: run id}}}``."""
        return {"reports": {k: r.to_json() for k, r in self.reports.items()},
                "runs": {k: dict(v) for k, v in self.runs.items()}}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EvalResult:
        return cls({k: EvalReport.from_json(r) for k, r in d["reports"].items()},
                   {k: dict(v) for k, v in (d.get("runs") or {}).items()})


@dataclass(frozen=True)
class TrainResult:
    """One GRPO step's checkpoint: where it is (``uri``), its id, the step's metrics; ``resumed`` when it was
    already saved (nothing trained), ``mlflow_run_id`` when the metrics were logged to MLflow.

    >>> TrainResult("ckpt/it1", "it1", {"loss": 0.25}).to_json()
    {'uri': 'ckpt/it1', 'checkpoint_id': 'it1', 'metrics': {'loss': 0.25}}
    """

    uri: str
    checkpoint_id: str
    metrics: dict[str, Any] = field(default_factory=dict)
    resumed: bool = False
    mlflow_run_id: str | None = None

    @property
    def loss(self) -> float | None:
        """The step's loss, as the nightly report shows it (None when the metrics have none)."""
        loss = self.metrics.get("loss")
        return None if loss is None else float(loss)

    def to_json(self) -> dict[str, Any]:
        """The mapping the train flow always returned: ``resumed`` and ``mlflow_run_id`` only when set."""
        d: dict[str, Any] = {"uri": self.uri, "checkpoint_id": self.checkpoint_id, "metrics": dict(self.metrics)}
        if self.resumed:
            d["resumed"] = True
        if self.mlflow_run_id is not None:
            d["mlflow_run_id"] = self.mlflow_run_id
        return d
