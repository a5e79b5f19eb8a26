"""One shard of questions through the whole chain: prompt -> conductor -> parse -> execute -> grade -> rows.

Bulk answering, rollouts and evaluation are the same pipeline with a different
``kind``; they differ only in the ``RunSpec`` (samples per question, sub-pool
sampling, temperature). Each stage is a plain function so Prefect tasks can wrap
them one-to-one, and each reads only what the previous stage produced; the one
loop that runs them shard by shard and commits each shard is conductor/run/shards.py.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from conductor.execution.executor import Budget
from conductor.prompts import FewShotSpec, conductor_prompt
from conductor.trajectory import Kind, Round, Trajectory, trajectory_id
from conductor.workers.pool import Pool, SubPool
from conductor.workflow import DEFAULT_MAX_STEPS

if TYPE_CHECKING:
    from conductor.data.questions import Question
    from conductor.generation import Generation, GenerationParams, PolicyBackend
    from conductor.grading.reward import RewardScheme
    from conductor.run.config import AnswerConfig, RolloutConfig


@dataclass(frozen=True)
class RunSpec:
    """Everything that decides what a run produces; stored with every row it writes."""

    run_id: str
    kind: Kind
    pool: Pool
    checkpoint_id: str = "embedded-untrained"
    samples: int = 1                    # per question: the GRPO group size, or repeated eval samples
    subpool_k: int | None = None        # randomized k-of-n pools (None: the whole pool)
    seed: int = 0
    recursion_depth: int = 0            # extra conductor rounds allowed after the first
    recursion_call_factor: float = 2.0  # total worker calls stay below factor x the first round's (paper: < 2x)
    max_steps: int = DEFAULT_MAX_STEPS
    fewshot: FewShotSpec = field(default_factory=lambda: FewShotSpec(policy="ood"))   # resolved: never auto
    constrained: bool = False           # decode under the workflow grammar (small untrained conductors)
    temperature: float = 1.0            # conductor sampling (paper: 1.0 for GRPO groups)
    max_tokens: int = 1024              # conductor completion limit (paper: 1024)
    budget: Budget = field(default_factory=Budget)   # per question: calls, dollars, seconds (None: unlimited)
    # When set (bulk answering), trajectory ids also hash the question's content and these settings, so a
    # rerun after an edit or a settings change recognises stale rows instead of keeping them.
    settings_key: str = ""
    date: str = field(default_factory=lambda: _dt.datetime.now(_dt.UTC).date().isoformat())

    def __post_init__(self) -> None:
        if not isinstance(self.fewshot, FewShotSpec):   # a script's text (fewshot="none"): parsed once, here
            object.__setattr__(self, "fewshot", FewShotSpec.parse(self.fewshot))

    @classmethod
    def of(cls, config: AnswerConfig | RolloutConfig, pool: Pool, checkpoint_id: str,
           settings_key: str = "") -> RunSpec:
        """A run's configuration plus its resolved objects: the pool (embedded URLs resolved to the running
        servers) and the checkpoint id the conductor spec stands for."""
        if config.run_id is None:
            raise ValueError("RunSpec.of: resolve the run id first (conductor.run.preflight.prepare_answer)")
        return cls(run_id=config.run_id, kind=config.kind, pool=pool, checkpoint_id=checkpoint_id,
                   settings_key=settings_key, **config.pipeline_settings())

    def subpool_for(self, question_id: str) -> SubPool:
        """Seeded per question, so every sample in a GRPO group sees the same pool and reruns agree."""
        if not self.subpool_k or self.subpool_k >= len(self.pool.workers):
            return self.pool.full()
        digest = hashlib.sha256(f"{self.seed}\x1f{question_id}".encode()).digest()
        return self.pool.sample(self.subpool_k, int.from_bytes(digest[:8], "big"))

    def trajectory_ids(self, q: Question) -> list[str]:
        """The ids this run gives ``q``'s samples: the lake rows a rerun looks for."""
        salt = ""
        if self.settings_key:
            from conductor.data.questions import question_digest

            salt = hashlib.sha256(f"{self.settings_key}\x1f{question_digest(q)}".encode()).hexdigest()[:16]
        return [trajectory_id(self.run_id, q.id, i, salt) for i in range(self.samples)]

    def generation_params(self) -> GenerationParams:
        """Sampling settings, with the sub-pool's size (one per run): a checkpoint's decoding contract needs it."""
        from conductor.generation import GenerationParams

        k = len(self.pool.workers)
        return GenerationParams(temperature=self.temperature, max_tokens=self.max_tokens, seed=self.seed,
                                n_workers=min(self.subpool_k, k) if self.subpool_k else k)


def plan(questions: Sequence[Question], spec: RunSpec, shard: str = "") -> list[Trajectory]:
    """Empty trajectories, one per (question, sample), with their prompts and sub-pools decided."""
    out = []
    for q in questions:
        sub = spec.subpool_for(q.id)
        prompt = conductor_prompt(q.prompt, sub, fewshot=spec.fewshot, domain=q.domain,
                                  max_steps=spec.max_steps)
        for i, tid in enumerate(spec.trajectory_ids(q)):
            out.append(Trajectory(
                trajectory_id=tid, run_id=spec.run_id, kind=spec.kind,
                question_id=q.id, dataset=q.dataset, domain=q.domain, question=q.prompt, sample_index=i,
                date=spec.date, checkpoint_id=spec.checkpoint_id, pool_id=spec.pool.id, subpool=sub.names,
                gold=q.gold, rounds=[Round(depth=0, prompt=prompt, completion="")], shard=shard))
    return out


def generate(trajectories: list[Trajectory], policy: PolicyBackend, spec: RunSpec) -> list[Trajectory]:
    """Sample the conductor: one batched call with n = samples per distinct prompt (the GRPO group), per
    grammar (randomized sub-pools of different shapes need different grammars)."""
    groups: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.rounds[0].prompt, []).append(t)
    if not groups:
        return trajectories
    n = max(len(v) for v in groups.values())
    by_params: dict[GenerationParams, list[str]] = {}
    for prompt, trajs in groups.items():
        by_params.setdefault(_params_for(spec, trajs[0].question_id), []).append(prompt)
    for params, prompts in by_params.items():
        start = time.perf_counter()
        outputs = policy.generate(prompts, n, params)
        share = (time.perf_counter() - start) / sum(len(groups[p]) for p in prompts)   # conductor time per question
        for prompt, gens in zip(prompts, outputs):
            for t, g in zip(groups[prompt], gens):
                _fill_round(t.rounds[0], g)
                t.conductor_s = share if g.seconds is None else g.seconds
    return trajectories


def _params_for(spec: RunSpec, question_id: str) -> GenerationParams:
    """Sampling settings for one question's prompt; under ``constrained`` the grammar of its sub-pool."""
    params = spec.generation_params()
    if not spec.constrained:
        return params
    from conductor.decoding.grammar import workflow_grammar

    sub = spec.subpool_for(question_id)
    plan = 0 if spec.fewshot.policy == "informed" else 240   # informed examples: no plan line
    return replace(params, grammar=workflow_grammar(len(sub), spec.max_steps, plan_chars=plan, tools=sub.tool_ordinals))


def _fill_round(r: Round, g: Generation) -> None:
    r.completion = g.text
    r.completion_token_ids = list(g.token_ids) if g.token_ids is not None else None
    r.completion_logprobs = [float(x) for x in g.logprobs] if g.logprobs is not None else None


def execute(trajectories: list[Trajectory], spec: RunSpec, executor: Any,
            policy: PolicyBackend | None = None, on_done: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
    """Parse and run every workflow concurrently under the executor's shared rate limits
    (``conductor.execution.recursion.execute_batch``: one trajectory's failure never stops the others).

    With ``spec.recursion_depth > 0`` and a policy, the conductor is called again on its own final answer.
    """
    from conductor.execution.recursion import conductor_fn_from_backend, run_batch

    conductor_fn = (conductor_fn_from_backend(policy, replace(spec.generation_params(), seed=None))
                    if (policy is not None and spec.recursion_depth > 0) else None)
    return run_batch(   # one event loop for the stage; its SDK clients are closed on it, not left to the GC
        trajectories, lambda t: spec.subpool_for(t.question_id), executor, on_done=on_done, conductor=conductor_fn,
        max_depth=spec.recursion_depth, max_steps=spec.max_steps, budget=spec.budget, call_factor=spec.recursion_call_factor)


def score(trajectories: list[Trajectory], questions: Sequence[Question], scheme: RewardScheme | None = None) -> list[Trajectory]:
    """Grade final answers against gold where there is one; the reward follows the paper's scheme.
    Graders run on threads, so sandboxed code runs of one shard proceed in parallel."""
    from conductor.grading.reward import PAPER, score_trajectories

    return score_trajectories(trajectories, questions, scheme or PAPER)

