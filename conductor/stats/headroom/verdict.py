"""The headroom check's result and its verdict: the measured points and paired tests, the headrooms derived from
them, and the rule that reads pool-bound or router-bound off them, in words (``reason``, ``evidence``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from conductor.stats.headroom.model import (
    DEFAULT_ALPHA,
    DEFAULT_MARGIN,
    DEFAULT_N_BOOT,
    CrossFitRouter,
    PairedComparison,
    Point,
    RandomMixLine,
    Verdict,
)


@dataclass(frozen=True)
class HeadroomVerdict:
    """Where the pool's ceiling is and whether a router could reach for it; ``verdict`` and ``evidence`` are
    derived from the measured points and tests (one source of truth). ``HeadroomReport`` adds its outputs."""

    n_questions: int
    workers: tuple[Point, ...]
    best_single: str
    cheapest: str
    random_mix: RandomMixLine
    mix_at_cross_fit_cost: Point     # the best random mix of workers at the cross-fit oracle's dollars
    cross_fit: Point
    any_correct: Point
    cross_fit_vs_best: PairedComparison
    cross_fit_vs_mix: PairedComparison
    any_correct_vs_best: PairedComparison
    router: CrossFitRouter
    margin: float = DEFAULT_MARGIN
    alpha: float = DEFAULT_ALPHA
    n_boot: int = DEFAULT_N_BOOT
    seed: int = 0
    policy: Point | None = None
    policy_vs_best: PairedComparison | None = None
    notes: tuple[str, ...] = ()

    # -- derived views --
    @property
    def best(self) -> Point:
        return next(p for p in self.workers if p.label == self.best_single)

    @property
    def any_correct_headroom(self) -> float:
        """Accuracy the any-correct oracle adds over the best single worker (not reachable by routing)."""
        return self.any_correct.accuracy - self.best.accuracy

    @property
    def cross_fit_headroom(self) -> float:
        """Accuracy a router that sees only the question adds over the best single worker."""
        return self.cross_fit.accuracy - self.best.accuracy

    @property
    def unpredictable_headroom(self) -> float:
        """The part of the any-correct gain the cross-fit router could not predict from the question."""
        return self.any_correct.accuracy - self.cross_fit.accuracy

    @property
    def policy_captured(self) -> float | None:
        """(policy - best single) / (cross-fit - best single); NaN without cross-fit headroom, None without a policy.

        >>> _report_stub(best=0.5, cross_fit=0.7, policy=0.6).policy_captured
        0.5
        >>> _report_stub(best=0.5, cross_fit=0.5, policy=0.6).policy_captured
        nan
        """
        if self.policy is None:
            return None
        h = self.cross_fit_headroom
        return (self.policy.accuracy - self.best.accuracy) / h if h > 1e-12 else math.nan

    @property
    def verdict(self) -> Verdict:
        return "router-bound" if self._rule() == 3 else "pool-bound"

    def _rule(self) -> int:
        if self.any_correct_vs_best.ci_low <= self.margin:
            return 1
        if not (self.cross_fit_vs_best.significant(self.alpha) or self.cross_fit_vs_mix.significant(self.alpha)):
            return 2
        return 3

    @property
    def reason(self) -> str:
        """The verdict's rule, in words."""
        a, m = self.any_correct_vs_best, self.margin
        return {
            1: (f"even the any-correct oracle gains only {100 * a.diff:+.1f} points over the best single worker "
                f"{self.best_single} (95% CI lower bound {100 * a.ci_low:+.1f} <= margin {100 * m:.1f}): "
                "no router can win on this pool; change the pool"),
            2: ("the pool is complementary in hindsight, but a router that sees only the question is not "
                "significantly better than the best single worker, nor than the best random mix of workers at its cost "
                f"(alpha {self.alpha}): the complementarity is not predictable from the question"),
            3: ("a router that sees only the question beats "
                + ("the best single worker" if self.cross_fit_vs_best.significant(self.alpha)
                   else "the best random mix of workers at equal cost")
                + f" significantly (alpha {self.alpha}): a router could win; a policy that does not is the problem"),
        }[self._rule()]

    @property
    def verdict_line(self) -> str:
        return f"verdict: {self.verdict} -- {self.reason}"

    @property
    def evidence(self) -> list[str]:
        """Plain sentences with the numbers behind the verdict."""
        b, x, a, mix = self.best, self.cross_fit, self.any_correct, self.mix_at_cross_fit_cost
        out = [f"On {self.n_questions} questions, each worker alone: "
               + "; ".join(f"{p.label} {p.fmt()}" for p in self.workers) + "."]
        out.append(f"The best single worker is {b.label} ({100 * b.accuracy:.1f}%) and also the cheapest, so the random-mix "
                   "line is a single point." if self.cheapest == b.label else
                   f"The best single worker is {b.label} ({100 * b.accuracy:.1f}%); the cheapest is {self.cheapest} "
                   f"({100 * self.random_mix.cheap_accuracy:.1f}%, ${self.random_mix.cheap_dollars:.6f}/q).")
        ac = self.any_correct_vs_best
        out.append(f"The any-correct oracle (cheapest correct worker per question) reaches {a.fmt()}: "
                   f"{100 * ac.diff:+.1f} points vs {b.label}, 95% CI [{100 * ac.ci_low:+.1f}, {100 * ac.ci_high:+.1f}]"
                   + (f", McNemar b={ac.mcnemar_b} c={ac.mcnemar_c} p={ac.p_mcnemar:.3g}." if ac.p_mcnemar is not None
                      else "."))
        xb, xm = self.cross_fit_vs_best, self.cross_fit_vs_mix
        routed = ", ".join(f"{w} {n}" for w, n in self.router.choices.items() if n)
        out.append(f"The cross-fit router ({self.router.folds}-fold, {self.router.features} features) reaches {x.fmt()}: "
                   f"{100 * xb.diff:+.1f} points vs {b.label}, 95% CI [{100 * xb.ci_low:+.1f}, {100 * xb.ci_high:+.1f}], "
                   f"bootstrap p={xb.p_bootstrap:.3g}, McNemar b={xb.mcnemar_b} c={xb.mcnemar_c} p={xb.p_mcnemar:.3g}; "
                   f"it sent questions to {routed}.")
        out.append(f"At the cross-fit router's ${x.dollars:.6f}/q the best random mix of workers ({mix.label}) reaches "
                   f"{100 * mix.accuracy:.1f}%; the router scores {100 * xm.diff:+.1f} points vs it, 95% CI "
                   f"[{100 * xm.ci_low:+.1f}, {100 * xm.ci_high:+.1f}], bootstrap p={xm.p_bootstrap:.3g}.")
        out.append(f"Of the any-correct oracle's {100 * self.any_correct_headroom:.1f} points over {b.label}, the "
                   f"cross-fit router realises {100 * self.cross_fit_headroom:+.1f}; "
                   f"{100 * self.unpredictable_headroom:.1f} are not predictable from the question by this learner.")
        if self.policy is not None and self.policy_vs_best is not None:
            pb, cap = self.policy_vs_best, self.policy_captured
            captured = ("there is no cross-fit headroom to capture" if cap is None or math.isnan(cap)
                        else f"it captured {100 * cap:.0f}% of the cross-fit headroom")
            out.append(f"The policy {self.policy.label} reaches {self.policy.fmt()}: {100 * pb.diff:+.1f} points vs "
                       f"{b.label}, 95% CI [{100 * pb.ci_low:+.1f}, {100 * pb.ci_high:+.1f}], McNemar p={pb.p_mcnemar:.3g}; "
                       f"{captured}.")
        out.append(f"Verdict: {self.verdict}, because {self.reason}.")
        return out


def _report_stub(best: float, cross_fit: float, policy: float) -> HeadroomVerdict:
    """A report with only the accuracies the doctests read."""
    p = lambda label, a: Point(label, a, a, a, 0.0, 1)  # noqa: E731
    t = PairedComparison("x", "b", 1, 0.0, 0.0, 0.0, 1.0)
    return replace(HeadroomVerdict(1, (p("b", best),), "b", "b", RandomMixLine("b", "b", best, 0, best, 0),
                                  p("mix", best), p("x", cross_fit), p("a", 1.0), t, t, t,
                                  CrossFitRouter("", "none", 2, 0, 0.0)), policy=p("pol", policy))
