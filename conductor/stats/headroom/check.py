"""The headroom check itself: ``headroom_report(matrix)`` measures every point and paired test of the module
``conductor.stats.headroom`` describes, and returns the ``HeadroomReport``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from conductor.stats.headroom.bootstrap import bootstrap_intervals, paired
from conductor.stats.headroom.model import (
    DEFAULT_ALPHA,
    DEFAULT_FOLDS,
    DEFAULT_MARGIN,
    DEFAULT_N_BOOT,
    CrossFitRouter,
    OutcomeMatrix,
    Point,
    PolicyOutcome,
    RandomMixLine,
    best_mix_at_cost,
)
from conductor.stats.headroom.report import HeadroomReport
from conductor.stats.headroom.router import LEARNER, cross_fit_choices


def headroom_report(matrix: OutcomeMatrix, *, policy: PolicyOutcome | None = None, folds: int = DEFAULT_FOLDS,
                    n_boot: int = DEFAULT_N_BOOT, seed: int = 0, margin: float = DEFAULT_MARGIN,
                    alpha: float = DEFAULT_ALPHA, cost_weight: float = 0.0) -> HeadroomReport:
    """The headroom check of ``matrix`` (see the module docstring for every definition).

    Deterministic given ``seed`` and independent of the order of the matrix's rows. With a ``policy``, questions
    the policy did not answer are left out of everything (said in ``notes``).

    >>> nested = OutcomeMatrix([f"q{i}" for i in range(20)], ["big", "small"],
    ...                        [[True, i < 5] if i < 14 else [False, False] for i in range(20)],
    ...                        [[0.01, 0.001]] * 20)
    >>> r = headroom_report(nested, n_boot=500)
    >>> r.best_single, r.any_correct.accuracy == r.best.accuracy, r.verdict
    ('big', True, 'pool-bound')
    """
    if folds < 2:
        raise ValueError("headroom: folds must be at least 2")
    if not 0 < alpha < 1 or n_boot < 100:
        raise ValueError("headroom: alpha must be in (0, 1) and n_boot at least 100")
    notes = list(matrix.notes)
    m = _answered_by(matrix, policy, notes).sorted()
    n = m.n_questions
    if n < 2:
        raise ValueError(f"headroom: needs at least 2 questions (got {n})")
    y = m.correct.astype(float)
    c = m.cost_usd
    names = m.workers
    b, s = m.best_worker, m.cheapest_worker
    qids = m.question_ids

    k = min(folds, n)
    chosen, features = cross_fit_choices(m, k, seed, cost_weight)
    x_y = y[np.arange(n), chosen]
    x_c = c[np.arange(n), chosen]

    # the any-correct oracle: cheapest correct worker, else cheapest worker
    big = np.where(m.correct, c, np.inf)
    a_pick = np.where(m.any_correct, big.argmin(axis=1), c.argmin(axis=1))
    a_y = y[np.arange(n), a_pick]
    a_c = c[np.arange(n), a_pick]

    # the random-mix line (cheapest / best), and the best random mix of any workers at the cross-fit's dollars
    acc, dol = y.mean(axis=0), c.mean(axis=0)
    line = RandomMixLine(names[s], names[b], float(acc[s]), float(dol[s]), float(acc[b]), float(dol[b]))
    mi, mj, lam = best_mix_at_cost(acc.tolist(), dol.tolist(), float(x_c.mean()))
    mix_y = (1 - lam) * y[:, mi] + lam * y[:, mj]
    mix_label = names[mi] if mi == mj else f"{names[mi]} / {names[mj]}, {100 * lam:.0f}% to {names[mj]}"

    p_y, p_c = _policy_columns(policy, qids)

    # one set of resamples for every point's interval
    cols = [y[:, w] for w in range(m.n_workers)] + [mix_y, x_y, a_y] + ([p_y] if p_y is not None else [])
    lo, hi = bootstrap_intervals(np.stack(cols, axis=1), n_boot=n_boot, seed=seed)

    def point(label: str, j: int, values: np.ndarray, dollars: float) -> Point:
        return Point(label, float(values.mean()), float(lo[j]), float(hi[j]), float(dollars), n)

    w_points = tuple(point(names[w], w, y[:, w], dol[w]) for w in range(m.n_workers))
    j = m.n_workers
    mix_p = point(mix_label, j, mix_y, (1 - lam) * dol[mi] + lam * dol[mj])
    x_p = point("cross-fit oracle", j + 1, x_y, x_c.mean())
    a_p = point("any-correct oracle", j + 2, a_y, a_c.mean())
    pol_p = point(policy.label, j + 3, p_y, p_c.mean()) if policy is not None and p_y is not None else None  # type: ignore[union-attr]

    best_y = y[:, b]
    pair = lambda name, v, base, base_name, binary=True: paired(name, v, base_name, base, qids, n_boot, seed, binary)  # noqa: E731
    router = CrossFitRouter(learner=LEARNER, folds=k, seed=seed, cost_weight=cost_weight, features=features,
                            choices={names[w]: int((chosen == w).sum()) for w in range(m.n_workers)})
    return HeadroomReport(
        n_questions=n, workers=w_points, best_single=names[b], cheapest=names[s], random_mix=line,
        mix_at_cross_fit_cost=mix_p, cross_fit=x_p, any_correct=a_p,
        cross_fit_vs_best=pair("cross-fit oracle", x_y, best_y, names[b]),
        cross_fit_vs_mix=pair("cross-fit oracle", x_y, mix_y, "best random mix at equal cost", binary=False),
        any_correct_vs_best=pair("any-correct oracle", a_y, best_y, names[b]),
        router=router, margin=margin, alpha=alpha, n_boot=n_boot, seed=seed, policy=pol_p,
        policy_vs_best=pair(policy.label, p_y, best_y, names[b]) if policy is not None and p_y is not None else None,
        notes=tuple(notes))


def _answered_by(matrix: OutcomeMatrix, policy: PolicyOutcome | None, notes: list[str]) -> OutcomeMatrix:
    """The matrix on the questions the policy answered (all of them without a policy); says what it left out."""
    if policy is None:
        return matrix
    answered = [q for q in matrix.question_ids if q in policy.correct and policy.correct[q] is not None]
    if not answered:
        raise ValueError(f"headroom: the policy {policy.label!r} answered none of the matrix's questions")
    if len(answered) < matrix.n_questions:
        notes.append(f"left out {matrix.n_questions - len(answered)} questions the policy {policy.label} did not "
                     "answer")
        return matrix.subset(answered)
    return matrix


def _policy_columns(policy: PolicyOutcome | None, qids: Sequence[str]) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The policy's correctness and dollars per question, in ``qids`` order (None, None without a policy)."""
    if policy is None:
        return None, None
    p_y = np.array([float(bool(policy.correct[q])) for q in qids])
    cost = policy.cost_usd
    p_c = (np.array([float(cost.get(q, 0.0)) for q in qids]) if isinstance(cost, Mapping)
           else np.full(len(qids), float(cost)))
    return p_y, p_c
