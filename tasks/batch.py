"""Prefect task for batch mode: one wrapper over ``conductor.run.batch.execute_waves``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from prefect import task
from prefect.cache_policies import NONE

from conductor.run.batch import execute_waves
from conductor.trajectory import Trajectory

if TYPE_CHECKING:
    from conductor.execution.batch.executor import BatchExecutor
    from conductor.generation import PolicyBackend
    from conductor.run.pipeline import RunSpec


@task(name="execute-waves", cache_policy=NONE)
def execute_waves_task(trajectories: list[Trajectory], spec: RunSpec, executor: BatchExecutor,
                       policy: PolicyBackend | None = None,
                       on_done: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
    return execute_waves(trajectories, spec, executor, policy, on_done)
