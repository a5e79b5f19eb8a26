"""Prefect task for batch mode: one wrapper over ``conductor.run.batch.execute_waves``."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from conductor.run.batch import execute_waves
from conductor.trajectory import Trajectory


@task(name="execute-waves", cache_policy=NONE)
def execute_waves_task(trajectories: list[Trajectory], spec: Any, executor: Any, policy: Any = None,
                       on_done: Any = None) -> list[Trajectory]:
    return execute_waves(trajectories, spec, executor, policy, on_done)
