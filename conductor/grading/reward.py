"""The paper's reward: 0 unparseable workflow, 0.5 well-formed but wrong, 1 correct.

Infrastructure failures (a worker call that failed, a grader that could not run)
get ``None``: they say nothing about the conductor, so GRPO must skip them rather
than learn from a 0. Values are configurable through ``RewardScheme``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from conductor.data.questions import Question
from conductor.trajectory import Trajectory


@dataclass(frozen=True)
class RewardScheme:
    unparseable: float = 0.0
    wrong: float = 0.5
    correct: float = 1.0
    first_round_scale: float = 0.25     # recursion fine-tuning: discount on the initial round


PAPER = RewardScheme()


def reward(well_formed: bool, correct: bool | None, infra_failed: bool = False,
           scheme: RewardScheme = PAPER) -> float | None:
    """Reward of one trajectory.

    >>> reward(False, None), reward(True, False), reward(True, True), reward(True, None, infra_failed=True)
    (0.0, 0.5, 1.0, None)
    >>> reward(True, True, scheme=RewardScheme(wrong=0.0, correct=2.0))
    2.0
    """
    if infra_failed:
        return None
    if not well_formed:
        return scheme.unparseable
    if correct is None:
        return None
    return scheme.correct if correct else scheme.wrong


def recursion_round_rewards(round_rewards: Sequence[float | None],
                            scheme: RewardScheme = PAPER) -> list[float | None]:
    """Per-round rewards for recursion fine-tuning: the initial (non-recursive) round is
    scaled by ``first_round_scale`` (paper: 0.25); later rounds keep theirs.

    >>> recursion_round_rewards([1.0, 0.5])
    [0.25, 0.5]
    >>> recursion_round_rewards([None, 1.0])
    [None, 1.0]
    >>> recursion_round_rewards([])
    []
    """
    out: list[float | None] = list(round_rewards)
    if out and out[0] is not None:
        out[0] = out[0] * scheme.first_round_scale
    return out


def score_trajectory(traj: Trajectory, question: Question, scheme: RewardScheme = PAPER,
                     kind: str | None = None) -> Trajectory:
    """Extract and grade ``traj.final_answer``; set ``extracted_answer``, ``correct``, ``reward``
    (and ``round_rewards`` when recursion rounds carry their own answers). Returns ``traj``.

    Well-formed means the root round parsed (``parse_status == "ok"``); a recursion round that
    answered with three empty lists and kept the previous answer is fine.
    """
    from conductor.grading import grade

    well_formed = traj.parse_status == "ok"
    if traj.gold is None and question.gold is not None:
        traj.gold = question.gold
    if traj.infra_failed:
        traj.correct, traj.reward = None, None
        return traj
    if not well_formed:
        traj.extracted_answer, traj.correct = None, False
        traj.reward = reward(False, False, scheme=scheme)
        return traj
    if question.gold in (None, "") and not question.tests:
        # nothing to grade against (bulk answering a user's file): keep the answer, no reward, not a failure
        from conductor.extract.answer import DEFAULT_RULES, extract

        traj.extracted_answer = extract(traj.final_answer, DEFAULT_RULES.get(question.domain, DEFAULT_RULES["free"]))
        traj.correct, traj.reward = None, None
        return traj
    result = grade(question, traj.final_answer or "", kind)
    traj.extracted_answer = result.extracted if question.domain != "code" else (result.extracted or "")[:2000]
    if result.error is not None:
        traj.correct, traj.reward = None, None
        traj.infra_failed, traj.infra_cause = True, f"grading: {result.error}"
        return traj
    traj.correct = result.correct
    traj.reward = reward(True, result.correct, scheme=scheme)
    if len(traj.rounds) > 1:
        per_round: list[float | None] = []
        previous: str | None = None
        for rnd in traj.rounds:
            if rnd.parse_status != "ok":
                per_round.append(scheme.unparseable)
                continue
            answer = rnd.final_answer if rnd.final_answer is not None else previous
            previous = answer
            r = grade(question, answer or "", kind)
            per_round.append(None if r.error else reward(True, r.correct, scheme=scheme))
        traj.round_rewards = recursion_round_rewards(per_round, scheme)  # type: ignore[assignment]
    return traj


def score_trajectories(trajs: Sequence[Trajectory], questions: Sequence[Question] | dict[str, Question],
                       scheme: RewardScheme = PAPER, max_workers: int | None = None) -> list[Trajectory]:
    """``score_trajectory`` over a batch on threads: sandboxed code runs proceed in parallel
    (bounded by the sandbox semaphore), math-verify checks share its worker pool."""
    from concurrent.futures import ThreadPoolExecutor

    by_id = questions if isinstance(questions, dict) else {q.id: q for q in questions}
    missing = [t.question_id for t in trajs if t.question_id not in by_id]
    if missing:
        raise KeyError(f"no question for trajectory question_id {missing[0]!r}")
    with ThreadPoolExecutor(max_workers=max_workers or 8) as ex:
        return list(ex.map(lambda t: score_trajectory(t, by_id[t.question_id], scheme), trajs))
