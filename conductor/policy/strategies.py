"""Baselines as strategies: policies that write ordinary workflows, so every baseline runs through the very
same pipeline as the conductor (prompt, parse, executor, cache, grader, lake) and their rows compare one to one.

Specs (the ``--conductor`` family; ordinals are the pool's workers in manifest order):

- ``fixed:i`` — worker i answers alone (``conductor.policy.fixed``);
- ``sc:i:k`` — self-consistency: k independent samples of worker i, then a majority vote on the extracted
  answers by a ``vote`` tool worker that this strategy appends to the pool (``conductor.workers.providers.vote``);
- ``moa:p1+p2+...:agg`` (or ``moa:p1,p2,...:agg``) — Mixture-of-Agents, one layer: the proposers answer
  independently, the aggregator sees every proposal and writes the answer;
- ``vote:p1+p2+...`` — the proposers answer independently, then the ``vote`` tool takes the majority (ties: the
  first proposer's answer): different workers outvote a faulty one, where ``sc``'s attempts share its faults;
- ``random[:seed[:max_steps]]`` — a random workflow per question: length uniform in 1..max_steps (default 5),
  each step's worker uniform over the pool, each step's access list uniform over the subsets of earlier steps.

Repeated calls of one worker get distinct subtasks ("independent attempt j of k"), so they are distinct
requests with distinct cache keys: k samples never collapse into one cached reply, and a rerun reads back
the same k replies. The first attempt's subtask is the single-worker subtask, so ``sc:i:k`` reuses
``fixed:i``'s cached call. Strategies see the whole pool: do not combine them with ``--k`` sub-pools.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from conductor.policy.base import Generation, GenerationParams
from conductor.policy.fixed import DIRECT_SUBTASK, FixedWorkflowPolicy
from conductor.policy.spec import (
    STRATEGY_FORMS,
    ConductorSpec,
    FixedSpec,
    MixtureSpec,
    RandomSpec,
    SelfConsistencySpec,
    StrategyError,
    StrategySpec,
    VoteSpec,
    as_conductor_spec,
    is_strategy_text,
)
from conductor.workflow import ALL, DEFAULT_MAX_STEPS, Step, Workflow

if TYPE_CHECKING:
    from conductor.workers.pool import Pool

VOTE_WORKER = "majority-vote"
VOTE_SUBTASK = "Take a majority vote over the final answers above."
AGGREGATE_SUBTASK = ("You are shown answers to the user question from several other models; some may be wrong. "
                     "Check them critically, work out the correct answer, and write one final answer. "
                     "Follow the question's instructions on the answer format exactly.")


def is_strategy(spec: ConductorSpec | str) -> bool:
    """True for the baseline specs this module builds (text: by its kind, so a malformed one still gets its
    strategy's error from ``make_strategy``).

    >>> [is_strategy(s) for s in ("fixed:0", "sc:1:5", "moa:0+1:2", "random", "random:3", "embedded")]
    [True, True, True, True, True, False]
    """
    return is_strategy_text(spec)


def strategy_spec(spec: ConductorSpec | str) -> StrategySpec | None:
    """The typed strategy a spec names, None for a model spec; StrategyError for malformed strategy text."""
    if not is_strategy_text(spec):
        return None
    return as_conductor_spec(spec)  # type: ignore[return-value]


def attempt_subtask(j: int, k: int) -> str:
    """The subtask of attempt j (0-based) of k: the first is the single-worker subtask itself.

    >>> attempt_subtask(0, 3) == DIRECT_SUBTASK, attempt_subtask(2, 3).endswith("(Independent attempt 3 of 3.)")
    (True, True)
    """
    return DIRECT_SUBTASK if j == 0 else f"{DIRECT_SUBTASK} (Independent attempt {j + 1} of {k}.)"


def _in_pool(i: int, n: int, spec: StrategySpec) -> int:
    if not 0 <= i < n:
        raise StrategyError(f"strategy {str(spec)!r}: worker {i} is not in the pool (0..{n - 1})")
    return i


@dataclass
class RandomWorkflowPolicy:
    """A uniformly random workflow per (prompt, sample); reproducible from the seed."""

    n_workers: int
    max_steps: int = DEFAULT_MAX_STEPS
    seed: int = 0
    name: str = "random"

    def workflow(self, prompt: str, sample: int, run_seed: int | None = None) -> Workflow:
        digest = hashlib.sha256(f"{self.seed}\x1f{run_seed}\x1f{sample}\x1f{prompt}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "big"))
        steps = []
        for i in range(rng.randint(1, self.max_steps)):
            access = tuple(j for j in range(i) if rng.random() < 0.5)
            steps.append(Step(rng.randrange(self.n_workers), DIRECT_SUBTASK, access))
        return Workflow(tuple(steps))

    def generate(self, prompts: list[str], n: int, params: GenerationParams) -> list[list[Generation]]:
        return [[Generation(text=self.workflow(p, j, params.seed).render(), finish_reason="stop") for j in range(n)]
                for p in prompts]

    def close(self) -> None:
        return None


def self_consistency(worker: int, k: int, vote: int) -> FixedWorkflowPolicy:
    """k independent attempts of one worker, then the vote step (which sees all of them)."""
    steps = [Step(worker, attempt_subtask(j, k), ()) for j in range(k)]
    steps.append(Step(vote, VOTE_SUBTASK, ALL))
    return FixedWorkflowPolicy(Workflow(tuple(steps)), name=f"sc:{worker}:{k}")


def _proposals(proposers: list[int]) -> list[Step]:
    """Independent answers (a repeated proposer gets a distinct attempt), none seeing another."""
    return [Step(p, attempt_subtask(proposers[:j].count(p), proposers.count(p)), ()) for j, p in enumerate(proposers)]


def mixture_of_agents(proposers: list[int], aggregator: int) -> FixedWorkflowPolicy:
    """One MoA layer: proposers answer independently, the aggregator sees every proposal."""
    steps = [*_proposals(proposers), Step(aggregator, AGGREGATE_SUBTASK, ALL)]
    label = "+".join(str(p) for p in proposers)
    return FixedWorkflowPolicy(Workflow(tuple(steps)), name=f"moa:{label}:{aggregator}")


def majority_vote(proposers: list[int], vote: int) -> FixedWorkflowPolicy:
    """The proposers answer independently, then the vote step (which sees all of them).

    >>> [s.worker for s in majority_vote([0, 2, 3], 5).workflow.steps]
    [0, 2, 3, 5]
    """
    steps = [*_proposals(proposers), Step(vote, VOTE_SUBTASK, ALL)]
    return FixedWorkflowPolicy(Workflow(tuple(steps)), name="vote:" + "+".join(str(p) for p in proposers))


def strategy_pool(spec: ConductorSpec | str, pool: Pool) -> Pool:
    """The pool a strategy runs over: ``sc`` and ``vote`` append the vote tool worker (once); others use the pool
    as is."""
    from conductor.workers.pool import Worker

    if not isinstance(strategy_spec(spec), SelfConsistencySpec | VoteSpec) or any(w.provider == "vote" for w in pool.workers):
        return pool
    vote = Worker(name=VOTE_WORKER, provider="vote", model="majority-vote",
                  notes="Not a language model: returns the response whose extracted final answer is most common.")
    return pool.model_copy(update={"workers": (*pool.workers, vote)})


def steps_needed(spec: ConductorSpec | str) -> int:
    """The longest workflow a strategy writes (a run's ``max_steps`` must allow it); 1 for a model spec.

    >>> steps_needed("sc:0:5"), steps_needed("moa:0+1+2:0"), steps_needed("random:1:4"), steps_needed("fixed:2")
    (6, 4, 4, 1)
    """
    typed = strategy_spec(spec)
    return 1 if typed is None else typed.steps_needed


def make_strategy(spec: ConductorSpec | str, pool: Pool) -> FixedWorkflowPolicy | RandomWorkflowPolicy:
    """The policy for a strategy spec over ``pool`` (as returned by ``strategy_pool``); StrategyError if unusable."""
    typed = strategy_spec(spec)
    n = sum(1 for w in pool.workers if w.provider != "vote")      # the vote worker is the strategy's, not the pool's
    match typed:
        case FixedSpec(worker=i):
            return FixedWorkflowPolicy.single_worker(_in_pool(i, n, typed))
        case SelfConsistencySpec(worker=i, k=k):
            return self_consistency(_in_pool(i, n, typed), k, _vote_worker(pool, typed))
        case MixtureSpec(proposers=proposers, aggregator=agg):
            return mixture_of_agents([_in_pool(p, n, typed) for p in proposers], _in_pool(agg, n, typed))
        case VoteSpec(proposers=proposers):
            return majority_vote([_in_pool(p, n, typed) for p in proposers], _vote_worker(pool, typed))
        case RandomSpec(seed=seed, max_steps=max_steps):
            return RandomWorkflowPolicy(n, max_steps or DEFAULT_MAX_STEPS, seed or 0, name=str(typed))
    raise StrategyError(f"strategy {str(spec)!r}: expected {STRATEGY_FORMS}")


def _vote_worker(pool: Pool, spec: StrategySpec) -> int:
    votes = [j for j, w in enumerate(pool.workers) if w.provider == "vote"]
    if not votes:
        raise StrategyError(f"strategy {str(spec)!r}: the pool has no vote worker (build it with strategy_pool)")
    return votes[0]


def check_strategy(spec: ConductorSpec | str, pool: Pool, max_steps: int) -> None:
    """Refuse, before anything starts, a strategy spec that cannot run over ``pool`` within ``max_steps``."""
    typed = strategy_spec(spec)
    if typed is None:
        return
    make_strategy(typed, strategy_pool(typed, pool))
    if typed.steps_needed > max_steps:
        raise StrategyError(f"strategy {str(typed)!r} writes {typed.steps_needed} steps: run it with --max-steps "
                            f"{typed.steps_needed} or more")
