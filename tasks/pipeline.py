"""Prefect tasks for the shard pipeline: each wraps one library function from conductor.run.pipeline.

Tasks take live objects (the policy, the executor) and so opt out of input hashing (cache_policy=NONE);
what makes reruns cheap is the lake (finished shards are skipped) and the response cache, not Prefect.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from conductor.run import pipeline
from conductor.trajectory import Trajectory


@task(name="plan-shard", cache_policy=NONE)
def plan_shard(questions: Sequence[Any], spec: pipeline.RunSpec, shard: str) -> list[Trajectory]:
    return pipeline.plan(questions, spec, shard)


@task(name="generate-conductor", cache_policy=NONE)
def generate_shard(trajectories: list[Trajectory], policy: Any, spec: pipeline.RunSpec) -> list[Trajectory]:
    return pipeline.generate(trajectories, policy, spec)


@task(name="execute-workflows", cache_policy=NONE)
def execute_shard(trajectories: list[Trajectory], spec: pipeline.RunSpec, executor: Any, policy: Any = None,
                  on_done: Any = None) -> list[Trajectory]:
    return pipeline.execute(trajectories, spec, executor, policy, on_done)


@task(name="grade-and-reward", cache_policy=NONE)
def score_shard(trajectories: list[Trajectory], questions: Sequence[Any], scheme: Any = None) -> list[Trajectory]:
    return pipeline.score(trajectories, questions, scheme)
