"""The shard loop of bulk answering: find what is not done yet, run the stages as tasks, commit.

Resume is by content (conductor/lake/resume.py): a question is done when every trajectory id the run gives
it (``RunSpec.trajectory_ids``: the question's id and content and the settings that change answers) is
committed intact and not infra-failed. Everything else is regrouped into shards named by what they hold,
so another shard size redoes nothing, an edited question redoes only itself, and a damaged shard file or
an infrastructure failure is redone on the next run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from prefect import get_run_logger

from conductor.pipeline import RunSpec
from tasks.lake import committed_task, write_shard_task
from tasks.pipeline import execute_shard, generate_shard, plan_shard, score_shard

MAX_CONDUCTOR_FAILURES = 2   # consecutive shards whose conductor endpoint failed before the run stops trying


@dataclass
class ShardPlan:
    """What a (re)run has to do."""

    todo: list[tuple[str, list[Any]]]                 # (shard id, questions) still to answer
    done_questions: int = 0                           # already answered in the lake
    retried_questions: int = 0                        # in ``todo`` because they failed on infrastructure
    damaged: list[str] = field(default_factory=list)  # shard files found damaged and moved aside
    current_ids: list[str] = field(default_factory=list)   # trajectory ids of the input as it is now


def pending_shards(questions: Sequence[Any], spec: RunSpec, lake: str, shard_size: int,
                   retry_failed: bool = True) -> ShardPlan:
    """The shards still to do; ``retry_failed=False`` leaves infra-failed questions as they are."""
    from conductor.questions import content_sharded

    state = committed_task(lake, spec.kind, spec.run_id)
    ids = {q.id: spec.trajectory_ids(q) for q in questions}
    finished = state.done if retry_failed else state.done | state.failed
    todo = [q for q in questions if not all(t in finished for t in ids[q.id])]
    retried = sum(1 for q in todo if any(t in state.failed for t in ids[q.id]))
    shards = content_sharded(todo, shard_size, key=lambda q: "\x1f".join(ids[q.id]))
    return ShardPlan(todo=shards, done_questions=len(questions) - len(todo), retried_questions=retried,
                     damaged=state.damaged, current_ids=[t for q in questions for t in ids[q.id]])


def run_shards(todo: Sequence[tuple[str, Sequence[Any]]], spec: RunSpec, lake: str, policy: Any, executor: Any,
               on_done: Any = None, scheme: Any = None) -> int:
    """Run and commit each pending shard in order; returns how many trajectories were written.

    When the conductor's endpoint fails, the shard's questions are committed as infra-failed (a rerun
    retries them); after ``MAX_CONDUCTOR_FAILURES`` such shards in a row, or one refused key, the remaining
    shards are left for the rerun instead of waiting on a dead endpoint.
    """
    log = get_run_logger()
    written = failures = 0
    for n, (sid, sq) in enumerate(todo):
        trajs, error = generate_or_record(sid, sq, spec, lake, policy, on_done)
        if error is not None:
            written += len(trajs)
            failures += 1
            if failures >= MAX_CONDUCTOR_FAILURES or error.kind == "auth":
                log.warning("%s: stopping; %d shards left for a rerun", error.kind, len(todo) - n - 1)
                break
            continue
        failures = 0
        trajs = execute_shard(trajs, spec, executor, policy, on_done)
        trajs = score_shard(trajs, sq, scheme)
        write_shard_task(lake, trajs, sid)
        written += len(trajs)
        log.info("%s shard %s committed: %d trajectories", spec.kind, sid, len(trajs))
    return written


def generate_or_record(sid: str, sq: Sequence[Any], spec: RunSpec, lake: str, policy: Any,
                       on_done: Any = None) -> tuple[list[Any], Any]:
    """Plan and generate one shard: (trajectories, None), or, when the conductor's endpoint fails, the shard
    committed as infra-failed (a rerun retries it) and (its trajectories, the EndpointError)."""
    from conductor.policy.openai_backend import EndpointError

    trajs = plan_shard(sq, spec, sid)
    try:
        return generate_shard(trajs, policy, spec), None
    except EndpointError as e:
        _mark_failed(trajs, f"conductor: {e}", on_done)
        write_shard_task(lake, trajs, sid)
        get_run_logger().warning("%s shard %s: conductor failed, %d trajectories recorded as infra-failed: %s",
                                 spec.kind, sid, len(trajs), e)
        return trajs, e


def _mark_failed(trajs: list[Any], cause: str, on_done: Any) -> None:
    for t in trajs:
        t.infra_failed, t.infra_cause, t.final_answer, t.reward = True, cause, None, None
        if on_done is not None:
            on_done(t)
