from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conductor.workflow import ALL, Step, Workflow, WorkflowError


def wf(*steps):
    return Workflow(tuple(Step(*s) for s in steps))


def test_dependencies_follow_access():
    w = wf((0, "a", ()), (1, "b", ()), (2, "c", ALL), (0, "d", (1,)))
    assert w.dependencies() == [(), (), (0, 1), (1,)]
    assert w.access_mode == "fine"
    assert wf((0, "a", ()), (1, "b", ALL)).access_mode == "binary"


@pytest.mark.parametrize("w, field", [
    (wf(), "workflow"),
    (wf(*[(0, "a", ())] * 6), "model_id"),
    (wf((3, "a", ())), "model_id"),
    (wf((0, " ", ())), "subtasks"),
    (wf((0, "a", (0,))), "access_list"),
    (wf((0, "a", ()), (0, "b", (2,))), "access_list"),
    (wf((0, "a", ()), (0, "b", (0, 0))), "access_list"),
    (wf((True, "a", ())), "model_id"),
])
def test_validation_names_the_list(w, field):
    with pytest.raises(WorkflowError) as e:
        w.validate(n_workers=3)
    assert e.value.field == field


def test_empty_allowed_only_when_asked():
    assert wf().validate(allow_empty=True).is_empty
    with pytest.raises(WorkflowError):
        wf().validate()


def test_max_steps_configurable():
    w = wf(*[(0, "x", ALL)] * 7)
    assert w.validate(max_steps=7) is w


def test_from_lists_checks_lengths():
    with pytest.raises(WorkflowError, match="different lengths"):
        Workflow.from_lists([0, 1], ["a"], [(), ()])


@given(st.lists(st.tuples(st.integers(0, 4), st.text(min_size=1).filter(str.strip), st.sampled_from([ALL, ()])),
                min_size=1, max_size=5))
def test_json_round_trip(items):
    w = wf(*items)
    assert Workflow.from_json(w.to_json()) == w
