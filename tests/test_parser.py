"""The parser: a realistic corpus, render/parse round trips, and fuzzed garbage that must never raise."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conductor.parser import ParseError, find_lists, parse_workflow
from conductor.workflow import ALL, Step, Workflow

CORPUS = yaml.safe_load((Path(__file__).parent / "data" / "conductor_outputs.yaml").read_text(encoding="utf-8"))["cases"]


def test_corpus_is_large_and_varied():
    cats = [c["category"] for c in CORPUS]
    assert len(CORPUS) >= 40
    assert {"good", "sloppy", "bad"} <= set(cats)
    assert cats.count("bad") >= 15 and cats.count("sloppy") >= 15


@pytest.mark.parametrize("case", CORPUS, ids=[c["name"] for c in CORPUS])
def test_corpus(case):
    result = parse_workflow(case["text"], n_workers=case.get("n_workers"), allow_empty=case.get("allow_empty", False))
    expect = case["expect"]
    if "error" in expect:
        assert isinstance(result, ParseError), f"expected an error about {expect['error']}, parsed {result}"
        assert result.field == expect["error"], result.message
        assert result.reason and "\n" not in result.message
    else:
        assert isinstance(result, Workflow), getattr(result, "message", result)
        assert result.to_json() == {"steps": expect["steps"]}


# ---------------------------------------------------------------- properties

subtask_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=80
).filter(lambda s: s.strip() == s and s.strip() != "")
tricky_subtask = st.one_of(
    subtask_text,
    st.sampled_from(['say "hi" [now]', "it's = [0]", "model_id = [1]", "a\nb\n[c]", "“quoted” ‘x’", "back\\slash",
                     "access_list = [['all']]", "tab\there", "</think> done", "```code```", "nul\x00 esc\x1b del\x7f",
                     "line\u2028sep\u2029para\x85nel"]),
)


@st.composite
def workflows(draw, max_workers=7, fine=True):
    n = draw(st.integers(1, 5))
    steps = []
    for i in range(n):
        if fine and i > 0 and draw(st.booleans()):
            access = tuple(sorted(draw(st.sets(st.integers(0, i - 1), min_size=1, max_size=i))))
        else:
            access = draw(st.sampled_from([ALL, ()]))
        steps.append(Step(draw(st.integers(0, max_workers - 1)), draw(tricky_subtask), access))
    return Workflow(tuple(steps))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(workflows(), st.sampled_from(["", "Plan: use two models.\n", "<think>hmm [</think>\n", "```python\n"]))
def test_render_then_parse_round_trips(wf, prefix):
    parsed = parse_workflow(prefix + wf.render(), n_workers=7)
    assert isinstance(parsed, Workflow), parsed
    assert parsed == wf


@settings(max_examples=300)
@given(st.text(max_size=400))
def test_garbage_never_raises(text):
    result = parse_workflow(text)
    assert isinstance(result, (Workflow, ParseError))


@settings(max_examples=300)
@given(st.lists(st.sampled_from(["model_id", "subtasks", "access_list", "=", ":", "[", "]", "[[", "]]", '"', "'",
                                 "all", "0", "1", ",", "\\", "\n", " ", "“", "<think>", "</think>", "```"]), max_size=60))
def test_adversarial_tokens_never_raise(tokens):
    result = parse_workflow("".join(tokens))
    assert isinstance(result, (Workflow, ParseError))
    if isinstance(result, Workflow):
        result.validate()  # whatever parses is valid


@given(st.text(max_size=200))
def test_non_text_inputs_are_errors(text):
    assert isinstance(parse_workflow(text.encode()), ParseError)


def test_find_lists_skips_labels_quoted_inside_an_earlier_list():
    spans = find_lists('model_id = [0]\nsubtasks = ["note: access_list = [1]"]\naccess_list = [[]]')
    assert spans == {"model_id": "[0]", "subtasks": '["note: access_list = [1]"]', "access_list": "[[]]"}


def test_binary_mode_refuses_indices():
    text = 'model_id = [0, 1]\nsubtasks = ["a", "b"]\naccess_list = [[], [0]]'
    assert isinstance(parse_workflow(text), Workflow)
    err = parse_workflow(text, access_mode="binary")
    assert isinstance(err, ParseError) and err.field == "access_list"


def test_parse_error_is_falsy_and_names_the_list():
    err = parse_workflow("model_id = [0]\nsubtasks = ['x']\naccess_list = [['sometimes']]")
    assert not err and err.field == "access_list" and "entry 0" in err.reason


@pytest.mark.parametrize("text, status", [
    ("no lists at all", "parse_error"),
    ("model_id = [0, 1\nsubtasks = ['a']\naccess_list = [[]]", "parse_error"),
    ("model_id = [0]\nsubtasks = [Solve it]\naccess_list = [[]]", "parse_error"),
    ("model_id = [7]\nsubtasks = ['a']\naccess_list = [[]]", "invalid"),
    ("model_id = [0, 1]\nsubtasks = ['a']\naccess_list = [[], []]", "invalid"),
    ("model_id = [0]\nsubtasks = ['a']\naccess_list = [[0]]", "invalid"),
])
def test_status_separates_unreadable_from_rule_breaking(text, status):
    err = parse_workflow(text, n_workers=3)
    assert isinstance(err, ParseError) and err.status == status, err
