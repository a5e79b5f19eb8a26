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

An untrained model is asked differently (``MenuChoice``; ``--conductor menu:E1,E2,...`` on llama.cpp): in its own
workflow format, where the entries' ``model_id`` lines differ (``WorkflowMenu.native_choice``), since asked for an
index the untrained 1.5B showed only position bias (docs/default-conductor.md, "The menu conductor").
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

from conductor.generation import Generation, GenerationParams, PolicyBackend
from conductor.policy.spec import (
    MAX_MENU_ENTRIES,
    STRATEGY_FORMS,
    ConductorSpecError,
    StrategyError,
    is_strategy_text,
    parse_conductor_spec,
)
from conductor.workflow import Step, Workflow

if TYPE_CHECKING:
    from conductor.policy.spec import ConductorSpec, MenuSpec
    from conductor.trajectory import Trajectory
    from conductor.workers.pool import Pool

# About as many tokens as ONE_STEP_PREFILL (29 in SmolLM2's tokenizer): the trainer averages its loss over every
# completion token, so the prefill's length scales the step the choice token gets (keeping the learning rate
# measured for routing meaningful here).
MENU_PREFILL = "# Workflow shape, by its number: a worker alone, attempts and a vote, or answers and a reviewer.\nshape = ["
MENU_CHOICE = "# The best workflow for this question, by its number:\nshape = ["   # ends as MENU_PREFILL does
MAX_ENTRIES = MAX_MENU_ENTRIES
_INDEX_RE = re.compile(r"shape = \[\s*(\d+)\s*\]?\s*$")


@dataclass(frozen=True)
class MenuEntry:
    """One shape on the menu: the strategy spec it was written as and the workflow it expands to."""

    spec: str
    workflow: Workflow


@dataclass(frozen=True)
class MenuChoice:
    """How a model is asked to choose an entry: its turn starts with ``prefill`` and it may write only one of
    ``options`` (entry i's is ``options[i]``) after it (``grammar``: GBNF, llama.cpp's grammar sampler)."""

    prefill: str
    options: tuple[str, ...]

    @property
    def grammar(self) -> str:
        return "root ::= " + " | ".join(json.dumps(o) for o in self.options)   # JSON's escapes are GBNF's

    def index_of(self, completion: str) -> int | None:
        """The entry a completion (the prefill, then what the model wrote) chose; None when it chose none."""
        if not completion.startswith(self.prefill):
            return None
        rest = completion[len(self.prefill):].strip()
        return next((i for i, o in enumerate(self.options) if o.strip() == rest), None)


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
        return cls._built(names, typed, pool)

    @classmethod
    def of(cls, spec: MenuSpec, pool: Pool) -> WorkflowMenu:
        """The menu of a parsed ``menu:`` conductor spec over ``pool`` (its entries are typed already)."""
        return cls._built([str(e) for e in spec.entries], list(spec.entries), pool)

    @classmethod
    def _built(cls, names: Sequence[str], typed: Sequence[ConductorSpec], pool: Pool) -> WorkflowMenu:
        from conductor.policy.fixed import FixedWorkflowPolicy
        from conductor.policy.strategies import make_strategy, strategy_pool

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

    def describe(self) -> str:
        """The menu as the conductor model reads it: one line per entry, its steps' models and the first words of
        their subtasks (the pool's models are listed by number in the prompt), for a model that was not trained
        on the menu.

        >>> from conductor.workers.pool import Pool, Worker
        >>> print(WorkflowMenu.parse("fixed:0,moa:0+1:1", Pool(pool_id="p", workers=[
        ...     Worker(name=n, provider="simulated", model=n) for n in "ab"])).describe())
        0: model 0 (answer the user question)
        1: model 0 (answer the user question) and model 1 (answer the user question), then model 1 (you are shown answers to the user question from several other models)
        """
        return "\n".join(f"{i}: {_describe(e.workflow)}" for i, e in enumerate(self.entries))

    def index_choice(self, described: bool = False) -> MenuChoice:
        """Choose by index: the turn starts with ``MENU_PREFILL`` (``described``: with the menu described first,
        ``describe``, for a model that was not trained on it) and a grammar lets it write one index and ``]``.

        >>> from conductor.workers.pool import Pool, Worker
        >>> c = WorkflowMenu.parse("fixed:0,fixed:1,sc:0:3", Pool(pool_id="p", workers=[
        ...     Worker(name=n, provider="simulated", model=n) for n in "ab"])).index_choice()
        >>> c.grammar, c.index_of(MENU_PREFILL + "2]"), c.index_of(MENU_PREFILL + "7]")
        ('root ::= "0]" | "1]" | "2]"', 2, None)
        """
        head = f"# Ready-made workflows, one per line:\n{_commented(self.describe())}\n{MENU_CHOICE}" if described \
            else MENU_PREFILL
        return MenuChoice(head, tuple(f"{i}]" for i in range(len(self.entries))))

    def native_choice(self) -> MenuChoice | None:
        """Choose in the conductor's own format: the turn starts with what every entry's ``model_id`` line shares
        and a grammar lets the model finish that line only as one entry does, so the choice is the model's own
        next tokens where the entries part (``model_id = [0`` then ``]`` for one step, ``, 3, 1]`` for a chain):
        the decision an untrained conductor makes writing a workflow, without writing the subtasks. None when
        two entries have the same ``model_id`` line (then choose by index).

        >>> from conductor.workers.pool import Pool, Worker
        >>> m = WorkflowMenu.parse("fixed:0,moa:0+1:1,fixed:1", Pool(pool_id="p", workers=[
        ...     Worker(name=n, provider="simulated", model=n) for n in "ab"]))
        >>> c = m.native_choice()
        >>> c.prefill, c.options, c.index_of("model_id = [0, 1, 1]\\n")
        ('model_id = [', ('0]\\n', '0, 1, 1]\\n', '1]\\n'), 1)
        >>> WorkflowMenu.parse("fixed:0,moa:0+0:1", m.pool).native_choice().options
        (']\\n', ', 0, 1]\\n')
        >>> WorkflowMenu.parse("fixed:0,fixed:0", m.pool).native_choice() is None
        True
        """
        lines = [e.workflow.render().partition("\n")[0] for e in self.entries]
        if len(set(lines)) < len(lines):
            return None
        head = os.path.commonprefix(lines)
        # each option ends the line: a model writes "]\n" as one token where it ends a one-step list
        return MenuChoice(head, tuple(line[len(head):] + "\n" for line in lines))

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


def _describe(wf: Workflow) -> str:
    """Steps that see nothing earlier run side by side (``and``); a step that sees earlier ones comes after them
    (``then``)."""
    parts = []
    for k, step in enumerate(wf.steps):
        first = re.split(r"[.;:(]", step.subtask)[0].split()
        words = " ".join(first[:12]) + (" ..." if len(first) > 12 else "")
        phrase = f"model {step.worker} ({words[:1].lower()}{words[1:]})"
        parts.append(phrase if k == 0 else (" and " if not step.access else ", then ") + phrase)
    return "".join(parts)


def _commented(text: str) -> str:
    return "\n".join(f"# {line}" for line in text.splitlines())


class MenuBackend:
    """``inner`` (a backend whose turns start with a menu's prefill: a ``PrefilledBackend`` with an
    ``IndexConstraint`` on transformers, or a ``LlamaCppBackend(prefill=choice.prefill)``) whose completions are
    expanded into the chosen entry's workflow (module docstring).

    ``choice``: how the model was asked (``WorkflowMenu.index_choice`` or ``native_choice``); every generation is
    then asked with its grammar in place of the run's (llama.cpp applies it after the prefill; the run's grammar
    is the workflow grammar, for a turn the menu writes). None: ``MENU_PREFILL`` and an index constraint inside
    ``inner`` (the transformers path the trainer uses).
    """

    # its decision is a few tokens; written beside the workers on the same cores, it would slow them
    # (conductor/run/overlap.py: overlaps_execution; conductor/local/layout.py)
    overlaps_execution: ClassVar[bool] = False

    def __init__(self, inner: PolicyBackend, menu: WorkflowMenu, *, choice: MenuChoice | None = None):
        self.inner = inner
        self.menu = menu
        self.choice = choice

    @property
    def name(self) -> str:
        return f"{self.inner.name}+menu"

    def generate(self, prompts: list[str], n: int, params: GenerationParams) -> list[list[Generation]]:
        if self.choice is not None:
            params = replace(params, grammar=self.choice.grammar)
        return [[self._expanded(g) for g in gens] for gens in self.inner.generate(prompts, n, params)]

    def _expanded(self, g: Generation) -> Generation:
        if self.choice is None:
            text = self.menu.expand(g.text)
        else:
            i = self.choice.index_of(g.text)
            text = None if i is None else self.menu.entries[i].workflow.render()
        if text is None:
            return g
        return Generation(text=text, token_ids=g.token_ids, logprobs=g.logprobs, finish_reason=g.finish_reason,
                          prompt_token_ids=g.prompt_token_ids)

    def close(self) -> None:
        self.inner.close()


def default_menu(pool: Pool) -> MenuSpec | None:
    """What ``auto`` runs over ``pool`` before a champion exists (conductor/run/runtime.py: ``effective_spec``):
    the untrained embedded model choosing between the two workflows it writes itself when it writes well, the
    reasoner alone and the reasoner's calculation run by python and stated by the reporter (``menu:fixed:R,
    chain:R:P``; roles from ``conductor.prompts.role_ordinals``). None without a python tool (no calculation to
    run) or where the reasoner is not an embedded model (where it was measured; a pool of API models gets the
    writing conductor, which adapts to any pool). On 85 held-out questions this menu scored 0.529 against the
    writing conductor's 0.435 (+9.4 +- 4.0 paired) at 1.28x the 1.5B alone's worker seconds against 1.75x
    (docs/default-conductor.md, "The menu conductor").

    >>> from conductor.resources import data_path
    >>> from conductor.workers.pool import load_pool
    >>> str(default_menu(load_pool(str(data_path("pools", "local.yaml")))))
    'menu:fixed:0,chain:0:1'
    >>> from conductor.workers.pool import Pool
    >>> default_menu(Pool.model_validate({"pool_id": "p", "workers": [{"name": "a", "provider": "simulated",
    ...                                                                "model": "a"}]})) is None
    True
    """
    from conductor.local.servers import embedded_name
    from conductor.policy.spec import ChainSpec, FixedSpec, MenuSpec
    from conductor.prompts import role_ordinals

    roles = role_ordinals(pool.full())
    if "python" not in roles or "reasoner" not in roles or embedded_name(pool.workers[roles["reasoner"]].base_url) is None:
        return None
    reasoner = roles["reasoner"]
    return MenuSpec(entries=(FixedSpec(worker=reasoner), ChainSpec(worker=reasoner, reporter=roles["reporter"])))
