from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from conductor.parser import parse_workflow
from conductor.prompts import conductor_prompt, load_fewshot, recursion_prompt, select_fewshot, worker_messages
from conductor.workers.pool import load_pool
from conductor.workflow import ALL, Step, Workflow

ROOT = Path(__file__).resolve().parent.parent
PAPER = load_pool(ROOT / "data/pools/paper.yaml")


@given(st.integers(1, 7), st.integers(0, 10_000))
def test_prompt_renders_for_any_subpool(k, seed):
    sub = PAPER.sample(k, seed)
    text = conductor_prompt("What is 2+2?", sub)
    assert "USER QUESTION:\nWhat is 2+2?" in text and "AVAILABLE LANGUAGE MODELS:" in text
    listed = text.split("AVAILABLE LANGUAGE MODELS:\n")[1].split("\n\n")[0].split()
    assert listed == [t for i in range(k) for t in ("Model", str(i))]
    for w in PAPER.workers:  # names never leak into the prompt
        assert w.name not in text and w.model not in text


def test_fewshot_examples_parse_and_default_is_four_out_of_domain():
    ood = select_fewshot("ood")
    assert len(ood) == 4
    datasets = {e.dataset for e in ood}
    assert not datasets & {"gsm8k", "math500", "mmlu_stem", "aime24", "humaneval"}
    for e in list(load_fewshot("ood")) + list(load_fewshot("in_domain")):
        assert isinstance(parse_workflow(e.response), Workflow), e.question
    assert select_fewshot("none") == []
    assert all(e.domain == "math" for e in select_fewshot("in_domain", domain="math"))
    assert len(select_fewshot("mixed", domain="math")) == 4


def test_recursion_prompt_shows_previous_answer_and_the_keep_rule():
    text = recursion_prompt("The answer is 42.", max_steps=3)
    assert "The answer is 42." in text and "at most 3 steps" in text
    assert isinstance(parse_workflow(text, allow_empty=True), Workflow)  # its own example is three empty lists


def test_worker_messages_show_only_the_access_list():
    wf = Workflow((Step(0, "Solve A.", ()), Step(1, "Solve B.", ()), Step(2, "Check.", (1,)), Step(0, "Final.", ALL)))
    responses = {0: "resp-A", 1: "resp-B", 2: ""}
    first = worker_messages("Q?", wf, 0, responses)[0].content
    assert "<overall_task>\nQ?\n</overall_task>" in first and "resp-" not in first and first.endswith("Your assigned subtask: Solve A.")
    third = worker_messages("Q?", wf, 2, responses)[0].content
    assert "resp-B" in third and "resp-A" not in third and "<Agent 1 response>" in third
    last = worker_messages("Q?", wf, 3, responses, previous_round=[(4, "old", "old-resp")])[0].content
    assert "resp-A" in last and "resp-B" in last and "<Agent 2 response>" not in last  # empty response skipped
    assert "<Previous round Agent 4 response>\nold-resp" in last
    assert "old-resp" not in third  # previous round only for "all" steps
    msgs = worker_messages("Q?", wf, 0, responses, system_prompt="Be brief.", prefill="Let me solve this step by step.")
    assert [m.role for m in msgs] == ["system", "user", "assistant"]
