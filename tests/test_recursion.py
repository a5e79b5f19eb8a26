"""Recursion rounds: keep-the-answer, a new round over the previous one, depth and call budgets, the call tree."""

from __future__ import annotations

from conductor.execution.executor import Executor
from conductor.execution.recursion import run_batch
from conductor.generation import Generation
from conductor.testing.emulator import Emulator
from tests.fixtures_emulator import emu, emulator, lists, make_traj, three_provider_pool  # noqa: F401

ROOT_WF = lists([0, 1, 2], ["Solve.", "Solve independently.", "Pick the better answer."], [[], [], ["all"]])
EMPTY = "The answer is right.\nmodel_id = []\nsubtasks = []\naccess_list = []"


class ScriptedConductor:
    """Plays the conductor's recursion turns from a script; records the prompts it was given."""

    def __init__(self, *replies: str, fail: bool = False):
        self.replies = list(replies)
        self.prompts: list[str] = []
        self.fail = fail

    async def __call__(self, prompt: str) -> Generation:
        self.prompts.append(prompt)
        if self.fail:
            raise ConnectionError("policy server went away")
        return Generation(text=self.replies.pop(0), token_ids=[7, 8], logprobs=[-0.1, -0.2], finish_reason="stop")


def _run(emu: Emulator, conductor, **kw):
    [t] = run_batch([make_traj(ROOT_WF)], three_provider_pool(emu).full(), Executor(), conductor=conductor, **kw)
    return t


def test_three_empty_lists_keep_the_answer(emu: Emulator) -> None:
    c = ScriptedConductor(EMPTY)
    t = _run(emu, c, max_depth=3)
    assert [r.depth for r in t.rounds] == [0, 1]
    assert t.rounds[1].kept_previous and t.rounds[1].final_answer == t.rounds[0].final_answer == t.final_answer
    assert t.rounds[1].completion_logprobs == [-0.1, -0.2]
    assert "CONDUCTOR PROMPT" in c.prompts[0] and t.rounds[0].final_answer in c.prompts[0]
    assert ROOT_WF.splitlines()[1] in c.prompts[0]          # the previous workflow is shown
    conductor_calls = [x for x in t.calls if x.provider == "conductor"]
    assert [(x.call_id, x.parent_call_id, x.depth) for x in conductor_calls] == [("1.conductor", "0.2", 1)]


def test_new_round_sees_the_previous_round_and_replaces_the_answer(emu: Emulator) -> None:
    c = ScriptedConductor(lists([1], ["Verify the previous answer."], [["all"]]), EMPTY)
    t = _run(emu, c, max_depth=2)
    assert [r.depth for r in t.rounds] == [0, 1, 2] and t.rounds[2].kept_previous
    r1 = [x for x in t.calls if x.depth == 1 and x.worker_index >= 0]
    assert [(x.call_id, x.parent_call_id) for x in r1] == [("1.0", "1.conductor")]
    assert t.final_answer == r1[0].response != t.rounds[0].final_answer
    body = emu.requests()[-1]["body"]                      # the depth-1 step went to the anthropic worker
    seen = body["messages"][0]["content"]
    assert "Previous round" in seen and t.rounds[0].final_answer in seen
    # the call tree can be rebuilt: every parent exists
    ids = {x.call_id for x in t.calls}
    assert all(x.parent_call_id is None or x.parent_call_id in ids for x in t.calls)


def test_call_budget_stays_below_twice_the_first_round(emu: Emulator) -> None:
    two = lists([0, 1], ["Check.", "Check again."], [["all"], ["all"]])
    three = lists([0, 1, 2], ["a", "b", "c"], [[], [], ["all"]])
    c = ScriptedConductor(two, three)
    t = _run(emu, c, max_depth=5, call_factor=2.0)
    worker_calls = [x for x in t.calls if x.worker_index >= 0]
    assert len(worker_calls) == 5 < 2 * 3                  # 3 + 2, then no room for another round
    assert "at most 2 steps" in c.prompts[0]
    assert len(c.prompts) == 1 and len(t.rounds) == 2


def test_too_long_recursion_workflow_is_the_conductors_error(emu: Emulator) -> None:
    c = ScriptedConductor(lists([0, 1, 2], ["a", "b", "c"], [[], [], []]))
    t = _run(emu, c, max_depth=1)
    assert t.rounds[1].parse_status == "invalid" and t.final_answer == t.rounds[0].final_answer
    assert not t.infra_failed and len([x for x in t.calls if x.worker_index >= 0]) == 3


def test_depth_cap_and_no_conductor(emu: Emulator) -> None:
    one = lists([0], ["Polish."], [["all"]])
    t = _run(emu, ScriptedConductor(one, one, one), max_depth=1, call_factor=10)
    assert [r.depth for r in t.rounds] == [0, 1]
    t = _run(emu, None, max_depth=3)
    assert len(t.rounds) == 1 and len(t.calls) == 3


def test_conductor_failure_is_infra(emu: Emulator) -> None:
    t = _run(emu, ScriptedConductor(fail=True), max_depth=1)
    assert t.infra_failed and t.infra_cause.startswith("conductor:") and t.final_answer is None
    assert t.calls[-1].error_kind == "server"
