"""Prefect tasks for the shard pipeline: each wraps one library function from conductor.run.pipeline, and
``TASK_STAGES`` hands them to the one shard loop (conductor/run/shards.py) so a flow's run shows a task per stage.

Tasks take live objects (the policy, the executor) and so opt out of input hashing (cache_policy=NONE);
what makes reruns cheap is the lake (finished shards are skipped) and the response cache, not Prefect.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from prefect import get_run_logger, task
from prefect.cache_policies import NONE

from conductor.run import pipeline
from conductor.run.shards import Stages
from conductor.trajectory import Trajectory
from tasks.batch import execute_waves_task
from tasks.lake import committed_task, write_shard_task

if TYPE_CHECKING:
    from conductor.data.questions import Question
    from conductor.execution.executor import Executor
    from conductor.generation import PolicyBackend
    from conductor.grading.reward import RewardScheme


@task(name="plan-shard", cache_policy=NONE)
def plan_shard(questions: Sequence[Question], spec: pipeline.RunSpec, shard: str) -> list[Trajectory]:
    return pipeline.plan(questions, spec, shard)


@task(name="generate-conductor", cache_policy=NONE)
def generate_shard(trajectories: list[Trajectory], policy: PolicyBackend, spec: pipeline.RunSpec) -> list[Trajectory]:
    return pipeline.generate(trajectories, policy, spec)


@task(name="execute-workflows", cache_policy=NONE)
def execute_shard(trajectories: list[Trajectory], spec: pipeline.RunSpec, executor: Executor,
                  policy: PolicyBackend | None = None,
                  on_done: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
    return pipeline.execute(trajectories, spec, executor, policy, on_done)


@task(name="grade-and-reward", cache_policy=NONE)
def score_shard(trajectories: list[Trajectory], questions: Sequence[Question],
                scheme: RewardScheme | None = None) -> list[Trajectory]:
    return pipeline.score(trajectories, questions, scheme)


TASK_STAGES = Stages(plan=plan_shard, generate=generate_shard, execute=execute_shard, execute_waves=execute_waves_task,
                     score=score_shard, write=write_shard_task, committed=committed_task, logger=get_run_logger)
