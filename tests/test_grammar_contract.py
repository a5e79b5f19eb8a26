"""The grammar-parser contract: every text the workflow grammar accepts parses to the workflow it spells.

llguidance (the engine the transformers backend decodes with) decides acceptance over a byte-level vocabulary,
so any string can be put to it. Hypothesis writes workflows whose free fields (the plan line, every subtask)
hold control characters, quotes, backslashes, Unicode line separators and list syntax, spells each as the
grammar does, and checks both sides: the grammar accepts exactly what ``writable_plan``/``writable_subtask``
document, and what it accepts parses back to the same steps, character for character. A corpus pins the cases
seen in the wild (a NUL in a subtask, from a 1.5B decoding under the grammar on an H200).
"""

from __future__ import annotations

from functools import lru_cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conductor.decoding.grammar import WorkflowGrammar, writable_plan, writable_subtask
from conductor.parser import parse_workflow
from conductor.workflow import ALL, Step, Workflow
from tests.byte_vocab import ByteVocab

llguidance = pytest.importorskip("llguidance")


@lru_cache(maxsize=1)
def _vocabulary():
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(ByteVocab()))


@lru_cache(maxsize=64)
def _compiled(grammar: WorkflowGrammar) -> str:
    return llguidance.grammar_from("gbnf", grammar.gbnf())


def accepts(grammar: WorkflowGrammar, text: str) -> bool:
    """Whether ``text`` is a complete sentence of ``grammar`` (every byte consumed, then accepting)."""
    matcher = llguidance.LLMatcher(_vocabulary(), _compiled(grammar), log_level=0)
    ids = list(text.encode("utf-8"))
    return matcher.validate_tokens(ids) == len(ids) and matcher.consume_tokens(ids) and matcher.is_accepting()


def spell(plan: str | None, workers: list[int], subtasks: list[str], access: list[bool]) -> str:
    """The completion text the grammar describes, fields written raw between double quotes as a model does."""
    lists = (f"model_id = [{', '.join(map(str, workers))}]\n"
             f"subtasks = [{', '.join(f'{chr(34)}{s}{chr(34)}' for s in subtasks)}]\n"
             f"access_list = [{', '.join('[' + chr(34) + 'all' + chr(34) + ']' if a else '[]' for a in access)}]")
    return lists if plan is None else plan + "\n" + lists


# ---------------------------------------------------------------- corpus

CORPUS = [
    ("nul in a subtask (H200)", "Plan: ask one.", ["Solve\x00 it."], False),
    ("tab and line separators inside", None, ["a\tb\u2028c\u2029d\x85e"], False),
    ("other controls", None, ["bell\x07 vt\x0b ff\x0c esc\x1b del\x7f"], False),
    ("plan quoting the labels", "note: model_id = [9] subtasks = ['", ["'] x", "[0]"], True),
    ("plan with think tags", "<think> ok </think> \\ \" ' \u2028", ["</think> fine", "<think>"], True),
    ("quotes and brackets", "“q” ‘r’", ["it's [1] = ]", "‘a’ “b”"], True),
    ("non-BMP and combining", "\U0001f600 plan", ["e\u0301 \U0001d11e"], False),
    ("whitespace at an end", None, [" padded"], False),
]


@pytest.mark.parametrize("name, plan, subtasks, two_workers", CORPUS, ids=[c[0] for c in CORPUS])
def test_corpus(name, plan, subtasks, two_workers):
    grammar = WorkflowGrammar(2, 3, plan_chars=0 if plan is None else 80, subtask_chars=80)
    workers = [i % 2 if two_workers else 0 for i in range(len(subtasks))]
    access = [i > 0 for i in range(len(subtasks))]
    text = spell(plan, workers, subtasks, access)
    writable = all(writable_subtask(s, 80) for s in subtasks) and (plan is None or writable_plan(plan, 80))
    assert accepts(grammar, text) == writable, text
    parsed = parse_workflow(text, n_workers=2, max_steps=3)   # the parser reads even what the grammar forbids
    assert parsed == Workflow(tuple(Step(w, s.strip(), ALL if a else ()) for w, s, a in zip(workers, subtasks, access)))


def test_a_nul_in_a_subtask_is_masked_away():
    grammar = WorkflowGrammar(3, 2, plan_chars=0)
    matcher = llguidance.LLMatcher(_vocabulary(), _compiled(grammar), log_level=0)
    assert matcher.consume_tokens(list(b'model_id = [1]\nsubtasks = ["Solve'))
    bits = int.from_bytes(matcher.compute_bitmask(), "little")
    assert not bits & 1 and bits & (1 << ord("x")) and not bits & (1 << 0x1B)   # NUL, ESC refused; "x" allowed


# ---------------------------------------------------------------- property

SPECIAL = ("\x00", "\x01", "\x07", "\x08", "\t", "\n", "\x0b", "\x0c", "\r", "\x1b", "\x1f", "\x7f", "\x80", "\x85",
           "\x9f", "\xa0", "\u2028", "\u2029", "\u200b", "\ufeff", '"', "'", "\\", "\u201c", "\u201d", "\u2018",
           "\u2019", "[", "]", "=", ",", " ", "m", "é", "\U0001f600")
SNIPPETS = ("model_id = [", "subtasks = [", "access_list = [[]]", '["all"]', "</think>", "<think>", "```", "\\n",
            "'''", '"""', ":=", "\\x00", "[['all']]")
CONTROL = ("Cs", "Cc")
# Anything: most of it the grammar refuses, which the test checks too.
free_text = st.lists(st.one_of(st.sampled_from(SPECIAL + SNIPPETS), st.characters(blacklist_categories=CONTROL)),
                     max_size=14).map("".join)
# What the grammar should take, tricky all the same: a plan (no control but tab, not starting with "m"), a subtask
# (no control but tab, no '"' or backslash, no whitespace at either end) with tabs, separators and list syntax inside.
plan_text = st.lists(st.one_of(st.sampled_from([c for c in SPECIAL + SNIPPETS if c == "\t" or not any(
    ord(x) < 32 or 0x7F <= ord(x) <= 0x9F for x in c)]), st.characters(blacklist_categories=CONTROL)),
    min_size=1, max_size=10).map("".join).filter(lambda s: not s.startswith("m"))
_inner = [c for c in SPECIAL + SNIPPETS if c == "\t" or not any(
    ord(x) < 32 or 0x7F <= ord(x) <= 0x9F or x in '"\\' for x in c)]
_edge = st.characters(blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp"), blacklist_characters='"\\')
subtask_text = st.one_of(_edge, st.builds(lambda a, mid, b: a + mid + b, _edge, st.lists(
    st.one_of(st.sampled_from(_inner), _edge), max_size=10).map("".join), _edge))


@st.composite
def completions(draw):
    n_workers = draw(st.integers(1, 12))
    steps = draw(st.sampled_from([1, 2, 3, 2, 3, 2, 3, 4]))   # one in eight too long
    plan_chars, subtask_chars = draw(st.sampled_from([0, 24, 200])), draw(st.sampled_from([1, 16, 200]))
    grammar = WorkflowGrammar(n_workers, 3, plan_chars=plan_chars, subtask_chars=subtask_chars)
    plan = draw(st.sampled_from([plan_text] * 3 + [free_text]).flatmap(lambda s: s)) if plan_chars else None
    workers = [draw(st.integers(0, n_workers - 1)) for _ in range(steps)]
    if draw(st.sampled_from(range(10))) == 0:
        workers[-1] = n_workers + draw(st.integers(0, 1))            # outside the sub-pool
    subtasks = [draw(st.sampled_from([subtask_text] * 7 + [free_text]).flatmap(lambda s: s)) for _ in range(steps)]
    access = [False] + [draw(st.booleans()) for _ in range(steps - 1)]
    return grammar, plan, workers, subtasks, access


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(completions())
def test_grammar_accepts_exactly_what_parses_back(case):
    grammar, plan, workers, subtasks, access = case
    text = spell(plan, workers, subtasks, access)
    writable = (len(workers) <= grammar.max_steps and all(w < grammar.n_workers for w in workers)
                and all(writable_subtask(s, grammar.subtask_chars) for s in subtasks)
                and (plan is None or writable_plan(plan, grammar.plan_chars)))
    assert accepts(grammar, text) == writable, text
    if writable:
        parsed = parse_workflow(text, n_workers=grammar.n_workers, max_steps=grammar.max_steps, access_mode="binary")
        assert parsed == Workflow(tuple(Step(w, s, ALL if a else ()) for w, s, a in zip(workers, subtasks, access))), \
            (text, parsed)
