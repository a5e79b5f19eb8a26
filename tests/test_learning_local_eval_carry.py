"""bench/learning_local.py: the trained arm's held-out workflows are cached, so a machine without the checkpoint
evaluates it without training (or replaying) first. Real SQLite cache, real Parquet lake, the simulated pool
through the project's executor; the "trained" conductor is a fixed workflow, since what is tested is when the
bench builds it, not what it learned."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from conductor.data.questions import Question
from conductor.execution.cache import ResponseCache
from conductor.policy.cached import CachedPolicy
from conductor.policy.fixed import FixedWorkflowPolicy
from conductor.run.pipeline import RunSpec
from conductor.workers.pool import load_pool

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("learning_local", ROOT / "bench/learning_local.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

QUESTIONS = [Question(id=f"q{i}", dataset="gsm8k_test", domain="math", prompt=f"What is {i} + {i}?", gold=str(2 * i))
             for i in range(5)]


def _policy(cache: ResponseCache, builds: list[int]) -> CachedPolicy:
    def build() -> FixedWorkflowPolicy:
        builds.append(1)
        return FixedWorkflowPolicy.single_worker(0)

    return CachedPolicy(bench.TrainedOnDemand(build), cache, "learning-local/run/it0002")


def test_a_fresh_machine_evaluates_the_trained_arm_from_the_cache_without_training(tmp_path: Path) -> None:
    a = bench._args(["--smoke", "--state-dir", str(tmp_path / "state")])     # shards of 3 questions
    (tmp_path / "state").mkdir()
    state = bench.State(tmp_path / "state", a)
    spec = RunSpec(run_id="eval-trained", kind="eval", checkpoint_id="trained", temperature=0.0, seed=7,
                   pool=load_pool(str(ROOT / "data/pools/simulated.yaml")))
    lake, cache = str(tmp_path / "lake"), ResponseCache(tmp_path / "cache.sqlite")

    first: list[int] = []          # the machine that trained: every workflow generated once, training built once
    policy = _policy(cache, first)
    bench.pregenerate("trained", QUESTIONS, spec, policy, lake, a, state)
    assert first == [1] and (policy.misses, policy.hits) == (5, 0)

    fresh: list[int] = []          # another machine with the carried cache: no training, the same workflows
    policy = _policy(cache, fresh)
    bench.pregenerate("trained", QUESTIONS, spec, policy, lake, a, state)
    rows = bench.run_eval("trained", QUESTIONS, spec, policy, bench.ReuseExecutor(), lake, a, state)
    assert fresh == [] and policy.misses == 0 and policy.hits == 10
    assert sorted(r.question_id for r in rows) == [q.id for q in QUESTIONS]
    assert all(r.root.steps[0]["worker"] == 0 and r.parse_status == "ok" for r in rows)

    other: list[int] = []          # every shard committed: nothing is generated, even for a key the cache lacks
    policy = CachedPolicy(bench.TrainedOnDemand(lambda: other.append(1)), cache, "another-checkpoint")
    bench.pregenerate("trained", QUESTIONS, spec, policy, lake, a, state)
    assert other == [] and policy.misses == 0
    assert state.data["phases"]["trained"]["seconds"] >= 0
    cache.close()
