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
- ``pot:i`` — program of thought: worker i writes a program that prints the answer, the pool's ``python`` tool
  worker runs it, and the printout is the answer;
- ``chain:i:r`` — the untrained default's calculation pattern as a fixed workflow: worker i reasons and writes a
  program following its steps, the python tool runs it, reporter r states the result (the subtasks are the
  informed examples' own, ``data/fewshot/informed.yaml``, so these calls are the default conductor's calls);
- ``vote:a+b+...`` and ``cascade:a+b+...:j`` over *answer items* (``i``, ``pot-i``, ``chain-i-r``): a vote of
  different kinds of answers; a cascade whose ``agree`` gate accepts the cheap answers when they agree, and
  only otherwise lets worker j decide (``conductor.workers.providers.agree``);
- ``random[:seed[:max_steps]]`` — a random workflow per question: length uniform in 1..max_steps (default 5),
  each step's worker uniform over the pool, each step's access list uniform over the subsets of earlier steps.

Repeated calls of one worker get distinct subtasks ("independent attempt j of k"), so they are distinct
requests with distinct cache keys: k samples never collapse into one cached reply, and a rerun reads back
the same k replies. The first attempt's subtask is the single-worker subtask, so ``sc:i:k`` reuses
``fixed:i``'s cached call. Likewise an answer item inside a vote or a cascade renders exactly the messages of the
same strategy alone (a worker's message names earlier steps by worker, not by position), so a menu recorded
once shares every call between its entries. Strategies see the whole pool: do not combine them with ``--k``
sub-pools.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from conductor.generation import Generation, GenerationParams
from conductor.policy.fixed import DIRECT_SUBTASK, FixedWorkflowPolicy
from conductor.policy.spec import (
    STRATEGY_FORMS,
    STRATEGY_SPECS,
    CascadeSpec,
    ChainSpec,
    ConductorSpec,
    FixedSpec,
    MixtureSpec,
    ProgramSpec,
    RandomSpec,
    SelfConsistencySpec,
    StrategyError,
    StrategySpec,
    VoteSpec,
)
from conductor.workflow import ALL, DEFAULT_MAX_STEPS, Step, Workflow

if TYPE_CHECKING:
    from conductor.workers.pool import Pool

VOTE_WORKER = "majority-vote"
VOTE_SUBTASK = "Take a majority vote over the final answers above."
GATE_WORKER = "agree-gate"
GATE_SUBTASK = "Accept the answer above if every response gives the same final answer."
DECIDE_SUBTASK = ("Different methods above reached different answers to the user question. Check them critically, "
                  "work out the correct answer, and write one final answer. Follow the question's instructions on "
                  "the answer format exactly.")
PROGRAM_SUBTASK = ("Write a short Python program that computes the answer to the user question and prints only the "
                   "final answer (for a multiple-choice question, the letter of the correct option), in one python "
                   "code block. Do not write its output.")
RUN_SUBTASK = "Run the program."
# The informed examples' calculation pattern (data/fewshot/informed.yaml), word for word: chain:i:r's calls are
# the untrained default conductor's own calls (tests/test_workflow_menu.py checks they stay equal).
REASON_SUBTASK = ("Work out the solution step by step in a few short sentences. Then write a short Python program "
                  "that follows your steps and prints the result, in one python code block. Do not write its output.")
REPORT_SUBTASK = ("Give the final answer in the format the question asks for: the program's printed result or, if "
                  "the program failed, the result the reasoning above reached.")
AGGREGATE_SUBTASK = ("You are shown answers to the user question from several other models; some may be wrong. "
                     "Check them critically, work out the correct answer, and write one final answer. "
                     "Follow the question's instructions on the answer format exactly.")


def is_strategy(spec: ConductorSpec) -> bool:
    """True for the baseline specs this module builds (text: ``conductor.policy.spec.is_strategy_text``).

    >>> from conductor.policy.spec import parse_conductor_spec
    >>> [is_strategy(parse_conductor_spec(s)) for s in ("fixed:0", "sc:1:5", "moa:0+1:2", "random", "embedded")]
    [True, True, True, True, False]
    """
    return spec.is_strategy


def strategy_spec(spec: ConductorSpec) -> StrategySpec | None:
    """The typed strategy a spec is, None for a model spec."""
    return spec if isinstance(spec, STRATEGY_SPECS) else None


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
    runs_a_model: ClassVar[bool] = False    # a replay may write its workflows: no model runs (policy/cached.py)

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


@dataclass(frozen=True)
class Ordinals:
    """The pool positions an answer item's steps need: the python tool, and the bound on language models."""

    n_models: int
    python: int | None


def item_steps(item: int | ProgramSpec | ChainSpec, at: int, where: Ordinals, spec: StrategySpec) -> list[Step]:
    """An answer item's steps, placed from step ``at`` on (access lists point at absolute step indices); the last
    of them holds the item's answer.

    >>> where = Ordinals(n_models=3, python=3)
    >>> [(s.worker, s.access) for s in item_steps(ChainSpec(worker=0, reporter=1), 4, where, ChainSpec(worker=0, reporter=1))]
    [(0, ()), (3, (4,)), (1, (4, 5))]
    """
    if isinstance(item, int):
        return [Step(_in_pool(item, where.n_models, spec), DIRECT_SUBTASK, ())]
    tool = _python_worker(where, spec)
    if isinstance(item, ProgramSpec):
        return [Step(_in_pool(item.worker, where.n_models, spec), PROGRAM_SUBTASK, ()),
                Step(tool, RUN_SUBTASK, (at,))]
    return [Step(_in_pool(item.worker, where.n_models, spec), REASON_SUBTASK, ()),
            Step(tool, RUN_SUBTASK, (at,)),
            Step(_in_pool(item.reporter, where.n_models, spec), REPORT_SUBTASK, (at, at + 1))]


def answers(items: Sequence[int | ProgramSpec | ChainSpec], where: Ordinals,
            spec: StrategySpec) -> tuple[list[Step], tuple[int, ...]]:
    """The steps of several independent answer items, one after another, and the index of each item's answer."""
    steps: list[Step] = []
    finals: list[int] = []
    for item in items:
        steps += item_steps(item, len(steps), where, spec)
        finals.append(len(steps) - 1)
    return steps, tuple(finals)


def _python_worker(where: Ordinals, spec: StrategySpec) -> int:
    if where.python is None:
        raise StrategyError(f"strategy {str(spec)!r}: the pool has no python tool worker (provider: python) to run "
                            "the program")
    return where.python


def kinds_vote(spec: VoteSpec, where: Ordinals, vote: int) -> FixedWorkflowPolicy:
    """A vote over answer items of different kinds (direct, program of thought, chain)."""
    steps, finals = answers(spec.proposers, where, spec)
    steps.append(Step(vote, VOTE_SUBTASK, finals))
    return FixedWorkflowPolicy(Workflow(tuple(steps)), name=str(spec))


def cascade(spec: CascadeSpec, where: Ordinals, gate: int) -> FixedWorkflowPolicy:
    """The cheap answers, the agree gate over them, then the decider, which sees them and the gate's note and is
    left out by the executor when the gate accepts.

    >>> where = Ordinals(n_models=3, python=3)
    >>> from conductor.policy.spec import parse_conductor_spec
    >>> wf = cascade(parse_conductor_spec("cascade:0+pot-0:1"), where, 5).workflow
    >>> [(s.worker, s.access) for s in wf.steps]
    [(0, ()), (0, ()), (3, (1,)), (5, (0, 2)), (1, (0, 2, 3))]
    """
    steps, finals = answers(spec.cheap, where, spec)
    gate_at = len(steps)
    steps.append(Step(gate, GATE_SUBTASK, finals))
    steps.append(Step(_in_pool(spec.decider, where.n_models, spec), DECIDE_SUBTASK, (*finals, gate_at)))
    return FixedWorkflowPolicy(Workflow(tuple(steps)), name=str(spec))


def strategy_pool(spec: ConductorSpec | Sequence[ConductorSpec], pool: Pool) -> Pool:
    """The pool a strategy (or every entry of a menu) runs over: the pool's own workers, then the agree gate when a
    ``cascade`` needs it, then the vote tool when ``sc`` or ``vote`` needs it (each once).

    The gate always sits right after the pool's own workers, so a cascade's decider, which sees the gate's step
    (named by its worker ordinal), gets the same message alone and inside any menu: a recording made with one
    replays with the other. The vote step is seen by no later step, so its ordinal never reaches a message.

    >>> from conductor.policy.spec import parse_conductor_spec
    >>> from conductor.workers.pool import Pool, Worker
    >>> p = Pool(pool_id="p", workers=[Worker(name=n, provider="simulated", model=n) for n in "ab"])
    >>> [w.provider for w in strategy_pool([parse_conductor_spec("sc:0:3"), parse_conductor_spec("cascade:0+1:0")],
    ...                                    p).workers]
    ['simulated', 'simulated', 'agree', 'vote']
    >>> [w.provider for w in strategy_pool(parse_conductor_spec("cascade:0+1:0"), p).workers]
    ['simulated', 'simulated', 'agree']
    >>> [w.provider for w in strategy_pool(parse_conductor_spec("menu:fixed:1,vote:0+1"), p).workers]
    ['simulated', 'simulated', 'vote']
    """
    from conductor.policy.spec import MenuSpec
    from conductor.workers.pool import Worker

    specs = list(spec) if isinstance(spec, Sequence) else [spec]
    # a menu runs its entries' workflows: their tool workers too
    typed = [t for s in specs for t in (s.entries if isinstance(s, MenuSpec) else (strategy_spec(s),))]
    own = [w for w in pool.workers if w.provider not in ("vote", "agree")]
    gates = [w for w in pool.workers if w.provider == "agree"]
    votes = [w for w in pool.workers if w.provider == "vote"]
    if any(isinstance(t, CascadeSpec) for t in typed) and not gates:
        gates = [Worker(name=GATE_WORKER, provider="agree", model="agree-gate",
                        notes="Not a language model: accepts the answers it is shown when they all agree.")]
    if any(isinstance(t, SelfConsistencySpec | VoteSpec) for t in typed) and not votes:
        votes = [Worker(name=VOTE_WORKER, provider="vote", model="majority-vote",
                        notes="Not a language model: returns the response whose extracted final answer is most common.")]
    workers = (*own, *gates[:1], *votes[:1])
    return pool if workers == tuple(pool.workers) else pool.model_copy(update={"workers": workers})


def steps_needed(spec: ConductorSpec) -> int:
    """The longest workflow a strategy writes (a run's ``max_steps`` must allow it); 1 for a model spec.

    >>> from conductor.policy.spec import parse_conductor_spec
    >>> [steps_needed(parse_conductor_spec(s)) for s in ("sc:0:5", "moa:0+1+2:0", "random:1:4", "fixed:2")]
    [6, 4, 4, 1]
    """
    from conductor.policy.spec import MenuSpec

    if isinstance(spec, MenuSpec):
        return spec.steps_needed
    typed = strategy_spec(spec)
    return 1 if typed is None else typed.steps_needed


def make_strategy(spec: ConductorSpec, pool: Pool) -> FixedWorkflowPolicy | RandomWorkflowPolicy:
    """The policy for a strategy spec over ``pool`` (as returned by ``strategy_pool``); StrategyError if unusable."""
    typed = strategy_spec(spec)
    # the vote and gate workers are the strategies', not the pool's (appended last)
    n = sum(1 for w in pool.workers if w.provider not in ("vote", "agree"))
    python = next((j for j, w in enumerate(pool.workers) if w.provider == "python"), None)
    where = Ordinals(n, python)
    match typed:
        case FixedSpec(worker=i):
            return FixedWorkflowPolicy.single_worker(_in_pool(i, n, typed))
        case SelfConsistencySpec(worker=i, k=k):
            return self_consistency(_in_pool(i, n, typed), k, _tool_worker(pool, typed, "vote"))
        case MixtureSpec(proposers=proposers, aggregator=agg):
            return mixture_of_agents([_in_pool(p, n, typed) for p in proposers], _in_pool(agg, n, typed))
        case VoteSpec(proposers=proposers) if all(isinstance(p, int) for p in proposers):
            return majority_vote([_in_pool(p, n, typed) for p in proposers if isinstance(p, int)],
                                 _tool_worker(pool, typed, "vote"))
        case VoteSpec():
            return kinds_vote(typed, where, _tool_worker(pool, typed, "vote"))
        case ProgramSpec() | ChainSpec():
            steps, _ = answers([typed], where, typed)
            return FixedWorkflowPolicy(Workflow(tuple(steps)), name=str(typed))
        case CascadeSpec():
            return cascade(typed, where, _tool_worker(pool, typed, "agree"))
        case RandomSpec(seed=seed, max_steps=max_steps):
            return RandomWorkflowPolicy(n, max_steps or DEFAULT_MAX_STEPS, seed or 0, name=str(typed))
    raise StrategyError(f"strategy {str(spec)!r}: expected {STRATEGY_FORMS}")


def _tool_worker(pool: Pool, spec: StrategySpec, provider: str) -> int:
    found = [j for j, w in enumerate(pool.workers) if w.provider == provider]
    if not found:
        raise StrategyError(f"strategy {str(spec)!r}: the pool has no {provider} worker (build it with strategy_pool)")
    return found[0]


def check_strategy(spec: ConductorSpec, pool: Pool, max_steps: int) -> None:
    """Refuse, before anything starts, a strategy spec that cannot run over ``pool`` within ``max_steps``."""
    typed = strategy_spec(spec)
    if typed is None:
        return
    make_strategy(typed, strategy_pool(typed, pool))
    if typed.steps_needed > max_steps:
        raise StrategyError(f"strategy {str(typed)!r} writes {typed.steps_needed} steps: run it with --max-steps "
                            f"{typed.steps_needed} or more")
