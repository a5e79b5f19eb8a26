"""A conductor that chooses a workflow SHAPE from a menu: one token picks a whole workflow, defences included.

WHY: the routing prefill (``conductor.policy.prefill``) leaves a small conductor one free choice, the worker of a
one-step workflow; that is learnable from reward on CPU (docs/learning.md), but a one-step workflow cannot defend
itself. When the faulty worker is drawn at random per question (issue #36's random regime) no routing can avoid
it; what helps is a defensive SHAPE: independent answers and a vote, or answers and a reviewer that sees them.
An untrained 135M model writes no parseable multi-step workflow, so the shapes are offered as a menu: the turn is
prefilled with ``MENU_PREFILL``, ``IndexConstraint`` lets the model write only a menu index, and the sampled
index is expanded here into that entry's workflow.

The returned ``Generation`` carries both halves of that choice, each where its reader looks:

- ``token_ids``: what the model sampled (the prefill, the index, ``]``, end of turn). The GRPO trainer trains on
  stored token ids (``conductor.learning.grpo.batching.encode``), so it trains the very choice that was made.
- ``text``: the expanded workflow, rendered in the conductor's format. The parser, executor and lake see the
  workflow that ran, so every row shows its steps, workers and access lists like any other conductor's.

The menu is written as strategy specs (``fixed:i``, ``sc:i:k``, ``moa:p+q:agg``, ``vote:p+q``; ``conductor.policy.strategies``),
so each entry is also a baseline that runs on its own (``conductor run --conductor sc:0:3``) and the menu's best
entry per domain is a ceiling a bench can measure beside the trained conductor. At most ten entries: the
indices must be single tokens (``0``..``9`` in SmolLM2's and Qwen2.5's vocabularies).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from conductor.generation import Generation, GenerationParams, PolicyBackend
from conductor.policy.spec import (
    STRATEGY_FORMS,
    ConductorSpecError,
    StrategyError,
    is_strategy_text,
    parse_conductor_spec,
)
from conductor.workflow import Step, Workflow

if TYPE_CHECKING:
    from conductor.trajectory import Trajectory
    from conductor.workers.pool import Pool

# About as many tokens as ONE_STEP_PREFILL (29 in SmolLM2's tokenizer): the trainer averages its loss over every
# completion token, so the prefill's length scales the step the choice token gets (keeping the learning rate
# measured for routing meaningful here).
MENU_PREFILL = "# Workflow shape, by its number: a worker alone, attempts and a vote, or answers and a reviewer.\nshape = ["
MAX_ENTRIES = 10
_INDEX_RE = re.compile(r"shape = \[\s*(\d+)\s*\]?\s*$")


@dataclass(frozen=True)
class MenuEntry:
    """One shape on the menu: the strategy spec it was written as and the workflow it expands to."""

    spec: str
    workflow: Workflow


@dataclass(frozen=True)
class WorkflowMenu:
    """The shapes a menu conductor may choose, in index order, over one pool (``pool``: with the vote tool
    worker appended when an entry votes)."""

    entries: tuple[MenuEntry, ...]
    pool: Pool

    @classmethod
    def parse(cls, specs: str | Sequence[str], pool: Pool) -> WorkflowMenu:
        """A menu from comma-separated strategy specs over ``pool``; StrategyError naming the bad entry.

        >>> from conductor.workers.pool import Pool, Worker
        >>> p = Pool(pool_id="p", workers=[Worker(name=n, provider="simulated", model=n) for n in "ab"])
        >>> m = WorkflowMenu.parse("fixed:0,fixed:1,sc:0:3", p)
        >>> [len(e.workflow) for e in m.entries], [w.name for w in m.pool.workers]
        ([1, 1, 4], ['a', 'b', 'majority-vote'])
        >>> WorkflowMenu.parse("fixed:0,random", p)
        Traceback (most recent call last):
        ...
        conductor.policy.spec.StrategyError: menu entry 2 'random': not a fixed workflow (fixed, sc, moa or vote)
        """
        from conductor.policy.fixed import FixedWorkflowPolicy
        from conductor.policy.strategies import make_strategy, strategy_pool

        names = [s.strip() for s in (specs.split(",") if isinstance(specs, str) else specs)]
        if not 1 <= len(names) <= MAX_ENTRIES:
            raise StrategyError(f"menu: {len(names)} entries; 1 to {MAX_ENTRIES} (single-token indices)")
        typed = []
        for i, s in enumerate(names, 1):   # each entry's text parsed once, here
            if not is_strategy_text(s):
                raise StrategyError(f"menu entry {i} {s!r}: strategy {s!r}: expected {STRATEGY_FORMS}")
            try:
                typed.append(parse_conductor_spec(s))
            except ConductorSpecError as e:
                raise StrategyError(f"menu entry {i} {s!r}: {e}") from None
        # the tool workers every entry needs, after the pool's own (their ordinals as for each alone)
        pool = strategy_pool(typed, pool)
        entries = []
        for i, (s, spec) in enumerate(zip(names, typed), 1):
            try:
                policy = make_strategy(spec, pool)
            except StrategyError as e:
                raise StrategyError(f"menu entry {i} {s!r}: {e}") from None
            if not isinstance(policy, FixedWorkflowPolicy):
                raise StrategyError(f"menu entry {i} {s!r}: not a fixed workflow (fixed, sc, moa or vote)")
            entries.append(MenuEntry(s, policy.workflow))
        return cls(tuple(entries), pool)

    def __len__(self) -> int:
        return len(self.entries)

    def specs(self) -> list[str]:
        return [e.spec for e in self.entries]

    def index_grammar(self) -> str:
        """GBNF for what follows ``MENU_PREFILL``: one entry's index, then ``]`` (llama.cpp's grammar sampler; the
        transformers path masks the same tokens with ``IndexConstraint``).

        >>> from conductor.workers.pool import Pool, Worker
        >>> WorkflowMenu.parse("fixed:0,fixed:1,sc:0:3", Pool(pool_id="p", workers=[
        ...     Worker(name=n, provider="simulated", model=n) for n in "ab"])).index_grammar()
        'root ::= ("0" | "1" | "2") "]"'
        """
        return "root ::= (" + " | ".join(f'"{i}"' for i in range(len(self.entries))) + ') "]"'

    def expand(self, completion: str) -> str | None:
        """The workflow text a prefilled completion chose, or None when it names no entry (the parser then
        rejects the completion as written, so a bad sample is graded as the failure it is).

        >>> from conductor.workers.pool import Pool, Worker
        >>> m = WorkflowMenu.parse("fixed:0,fixed:1", Pool(pool_id="p", workers=[
        ...     Worker(name=n, provider="simulated", model=n) for n in "ab"]))
        >>> m.expand(MENU_PREFILL + "1]").splitlines()[0], m.expand(MENU_PREFILL + "7]"), m.expand("shape = [")
        ('model_id = [1]', None, None)
        """
        found = _INDEX_RE.search(completion)
        if found is None or int(found.group(1)) >= len(self.entries):
            return None
        return self.entries[int(found.group(1))].workflow.render()

    def chosen(self, steps: Sequence[dict[str, object]]) -> str | None:
        """The spec of the entry whose workflow these parsed steps (``Round.steps``) are, None for another one.

        >>> from conductor.workers.pool import Pool, Worker
        >>> m = WorkflowMenu.parse("fixed:0,sc:1:2", Pool(pool_id="p", workers=[
        ...     Worker(name=n, provider="simulated", model=n) for n in "ab"]))
        >>> m.chosen([s.to_json() for s in m.entries[1].workflow.steps]), m.chosen([])
        ('sc:1:2', None)
        """
        wf = tuple(Step.from_json(dict(d)) for d in steps)
        return next((e.spec for e in self.entries if e.workflow.steps == wf), None)

    def shares(self, trajectories: Sequence[Trajectory]) -> dict[str, dict[str, float]]:
        """Per domain: the share of the trajectories whose root workflow is each entry (``other``: none)."""
        counts: dict[str, dict[str, int]] = {}
        for t in trajectories:
            spec = (self.chosen(t.rounds[0].steps) if t.rounds else None) or "other"
            dom = counts.setdefault(t.domain, {})
            dom[spec] = dom.get(spec, 0) + 1
        return {d: {s: k / sum(c.values()) for s, k in sorted(c.items())} for d, c in sorted(counts.items())}


class MenuBackend:
    """``inner`` (a backend whose turns start with ``MENU_PREFILL`` and end at an index: a ``PrefilledBackend``
    with an ``IndexConstraint`` on transformers, or ``LlamaCppBackend(prefill=MENU_PREFILL)`` with
    ``index_grammar=True``) whose completions are expanded into the chosen entry's workflow (module docstring).

    ``index_grammar``: every generation is asked with the menu's ``index_grammar()`` in place of the run's grammar
    (llama.cpp applies it after the prefill; the run's grammar is the workflow grammar, for a turn the menu writes).
    """

    def __init__(self, inner: PolicyBackend, menu: WorkflowMenu, *, index_grammar: bool = False):
        self.inner = inner
        self.menu = menu
        self.grammar = menu.index_grammar() if index_grammar else None

    @property
    def name(self) -> str:
        return f"{self.inner.name}+menu"

    def generate(self, prompts: list[str], n: int, params: GenerationParams) -> list[list[Generation]]:
        if self.grammar is not None:
            params = replace(params, grammar=self.grammar)
        return [[self._expanded(g) for g in gens] for gens in self.inner.generate(prompts, n, params)]

    def _expanded(self, g: Generation) -> Generation:
        text = self.menu.expand(g.text)
        if text is None:
            return g
        return Generation(text=text, token_ids=g.token_ids, logprobs=g.logprobs, finish_reason=g.finish_reason,
                          prompt_token_ids=g.prompt_token_ids)

    def close(self) -> None:
        self.inner.close()
