"""conductor/policy/menu.py: a conductor that picks a workflow shape by one constrained token. A real (tiny) model
samples under the real constraint, the real pipeline parses, executes (the vote tool included) and grades the
expanded workflows on simulated workers, and the GRPO trainer's encoder reads back the sampled tokens."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

from conductor.data.questions import Question
from conductor.execution.executor import Executor
from conductor.policy import menu as menu_module
from conductor.policy.menu import MENU_PREFILL, MenuBackend, WorkflowMenu
from conductor.policy.spec import StrategyError, parse_conductor_spec
from conductor.workers.pool import load_pool

ROOT = Path(__file__).resolve().parent.parent
POOL = load_pool(ROOT / "data" / "pools" / "simulated-robust-understudy.yaml")
SPECS = "fixed:0,fixed:2,sc:0:3,sc:2:3,moa:0+1+2:3"


def test_doctests() -> None:
    assert doctest.testmod(menu_module, raise_on_error=False).failed == 0


def test_menu_entries_are_the_strategies_workflows_over_the_pool_with_the_vote_tool() -> None:
    from conductor.policy.strategies import make_strategy

    m = WorkflowMenu.parse(SPECS, POOL)
    assert m.specs() == SPECS.split(",")
    assert [w.name for w in m.pool.workers] == [w.name for w in POOL.workers] + ["majority-vote"]
    for e in m.entries:
        assert e.workflow == make_strategy(parse_conductor_spec(e.spec), m.pool).workflow
    assert [len(e.workflow) for e in m.entries] == [1, 1, 4, 4, 4]
    assert WorkflowMenu.parse("fixed:0,fixed:1", POOL).pool == POOL          # nothing votes: the pool as is


@pytest.mark.parametrize("specs, needle", [
    (",".join(f"fixed:{i % 5}" for i in range(11)), "11 entries"),
    ("fixed:0,random:3", "menu entry 2 'random:3'"),
    ("fixed:0,fixed:9", "worker 9 is not in the pool"),
    ("fixed:0,embedded", "menu entry 2 'embedded'"),
])
def test_bad_menus_are_refused_with_the_entry_named(specs: str, needle: str) -> None:
    with pytest.raises(StrategyError, match=needle.replace("(", r"\(").replace("+", r"\+")):
        WorkflowMenu.parse(specs, POOL)


def _backend(tmp_path: Path, m: WorkflowMenu) -> MenuBackend:
    pytest.importorskip("transformers")
    from conductor.policy.prefill import IndexConstraint, PrefilledBackend
    from conductor.policy.transformers_backend import TransformersBackend
    from grpo_fixtures import tiny_checkpoint

    inner = TransformersBackend.load(tiny_checkpoint(tmp_path / "tiny"), device="cpu", batch_size=4)
    tok = inner.tokenizer
    return MenuBackend(PrefilledBackend(inner, MENU_PREFILL, IndexConstraint(tok, len(m), tok.eos_token_id)), m)


def test_sampled_index_becomes_the_entry_workflow_and_the_tokens_stay_the_sampled_ones(tmp_path: Path) -> None:
    from conductor.generation import GenerationParams
    from conductor.parser import parse_workflow

    m = WorkflowMenu.parse(SPECS, POOL)
    backend = _backend(tmp_path, m)
    tok = backend.inner.inner.tokenizer
    out = backend.generate(["Which shape for: what is 2+2?"], 16, GenerationParams(temperature=1.0, max_tokens=5, seed=0))
    prefix = tok(MENU_PREFILL, add_special_tokens=False)["input_ids"]
    seen = set()
    for g in out[0]:
        ids = list(g.token_ids or [])
        assert ids[:len(prefix)] == prefix
        index = int(tok.decode(ids[len(prefix):len(prefix) + 1]))         # the one free token
        assert tok.decode(ids[len(prefix) + 1:len(prefix) + 2]) == "]"
        assert g.text == m.entries[index].workflow.render()               # what runs is that entry
        assert parse_workflow(g.text, n_workers=len(m.pool.workers)) == m.entries[index].workflow
        seen.add(index)
    assert len(seen) >= 2            # an untrained model samples several shapes (16 draws over 5 entries)


def test_menu_rollout_runs_the_shapes_and_the_trainer_reads_the_sampled_tokens(tmp_path: Path) -> None:
    """Through the shard loop: a voting shape calls its worker three times and the vote tool, the row's
    completion is the workflow that ran, its token ids the sampled choice, and GRPO's encoder uses those ids."""
    from conductor.learning.grpo import GRPOConfig
    from conductor.learning.grpo.batching import encode
    from conductor.learning.grpo.samples import build_samples
    from conductor.run.pipeline import RunSpec
    from conductor.run.shards import run_shard

    m = WorkflowMenu.parse(SPECS, POOL)
    backend = _backend(tmp_path, m)
    qs = [Question(id=f"m{i}", dataset="gsm8k_test", domain="math", prompt=f"Menu {i}: what is {i} + 3?",
                   gold=str(i + 3)) for i in range(3)]
    spec = RunSpec(run_id="menu-test", kind="rollout", pool=m.pool, samples=6, seed=1, fewshot="none", max_tokens=3)
    rows = run_shard(qs, spec, backend, Executor())
    assert len(rows) == 18 and all(r.rounds[0].parse_status == "ok" for r in rows)
    shares = m.shares(rows)
    assert set(shares) == {"math"} and abs(sum(shares["math"].values()) - 1) < 1e-9 and "other" not in shares["math"]
    for r in rows:
        chosen = m.chosen(r.rounds[0].steps)
        workers = [c.worker for c in r.calls if c.depth == 0]
        if chosen is not None and chosen.startswith("sc:"):
            assert workers[-1] == "majority-vote" and len(set(workers[:3])) == 1 and len(workers) == 4
        assert r.rounds[0].completion == m.entries[m.specs().index(chosen)].workflow.render()
    tok = backend.inner.inner.tokenizer
    samples, _ = build_samples(rows, 1.0, 1e-6, 0)
    assert samples
    for s in samples:
        enc = encode(tok, s, GRPOConfig.cpu())
        assert enc.completion_ids == list(s.completion_token_ids or [])
        assert tok.decode(enc.completion_ids).startswith(MENU_PREFILL)     # the choice, not the expanded text
