"""Execute a run's trajectories in batch mode: the pipeline's execute stage, with every trajectory counted.

The wave scheduler submits a wave only when every trajectory still running is parked on a batched call;
for that it must know how many trajectories the run has and when each one ends, which this wrapper tells it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from conductor.execution.batch.executor import BatchExecutor

if TYPE_CHECKING:
    from conductor.generation import PolicyBackend
    from conductor.run.pipeline import RunSpec
    from conductor.trajectory import Trajectory


def execute_waves(trajectories: list[Trajectory], spec: RunSpec, executor: BatchExecutor, policy: PolicyBackend | None = None,
                  on_done: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
    """Like ``conductor.run.pipeline.execute`` (same records, same cache), with calls batched wave by wave."""
    from conductor.run.pipeline import execute

    def done(t: Trajectory) -> None:
        executor.trajectory_done()
        if on_done is not None:
            on_done(t)

    executor.expect(len(trajectories))
    try:
        return execute(trajectories, spec, executor, policy, done)
    finally:
        executor.expect(None)
