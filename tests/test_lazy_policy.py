"""A trained conductor behind ``CachedPolicy`` wrapped in ``LazyPolicy`` (conductor/policy/lazy.py, from the
finished local-pool learning experiment): its held-out workflows are cached, so a machine without the checkpoint
evaluates the trained arm from the cache without building (training) it."""

from __future__ import annotations

from pathlib import Path

from conductor.data.questions import Question
from conductor.execution.cache import ResponseCache
from conductor.execution.greedy import ReuseExecutor
from conductor.policy.cached import CachedPolicy
from conductor.policy.fixed import FixedWorkflowPolicy
from conductor.policy.lazy import LazyPolicy
from conductor.run import pipeline
from conductor.run.pipeline import RunSpec
from conductor.run.shards import run_shard
from conductor.workers.pool import load_pool

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = [Question(id=f"q{i}", dataset="gsm8k_test", domain="math", prompt=f"What is {i} + {i}?", gold=str(2 * i))
             for i in range(5)]


def _policy(cache: ResponseCache, builds: list[int], checkpoint: str = "learning-local/run/it0002") -> CachedPolicy:
    def build() -> FixedWorkflowPolicy:
        builds.append(1)
        return FixedWorkflowPolicy.single_worker(0)

    return CachedPolicy(LazyPolicy(build), cache, checkpoint)


def test_a_fresh_machine_evaluates_the_trained_arm_from_the_cache_without_building_it(tmp_path: Path) -> None:
    spec = RunSpec(run_id="eval-trained", kind="eval", checkpoint_id="trained", temperature=0.0, seed=7,
                   pool=load_pool(str(ROOT / "data/pools/simulated.yaml")))
    cache = ResponseCache(tmp_path / "cache.sqlite")

    first: list[int] = []          # the machine that trained: every workflow generated once, built once
    policy = _policy(cache, first)
    pipeline.generate(pipeline.plan(QUESTIONS, spec), policy, spec)
    assert first == [1] and (policy.misses, policy.hits) == (5, 0) and policy.inner.built

    fresh: list[int] = []          # another machine with the carried cache: no build, the same workflows
    policy = _policy(cache, fresh)
    rows = run_shard(QUESTIONS, spec, policy, ReuseExecutor())
    assert fresh == [] and policy.misses == 0 and policy.hits == 5 and not policy.inner.built
    assert sorted(r.question_id for r in rows) == [q.id for q in QUESTIONS]
    assert all(r.root.steps[0]["worker"] == 0 and r.parse_status == "ok" for r in rows)

    other: list[int] = []          # another checkpoint's key is missing: it is built, once
    policy = _policy(cache, other, "another-checkpoint")
    pipeline.generate(pipeline.plan(QUESTIONS[:2], spec), policy, spec)
    pipeline.generate(pipeline.plan(QUESTIONS[2:], spec), policy, spec)
    assert other == [1] and policy.misses == 5 and policy.inner.build_s >= 0.0
    cache.close()
