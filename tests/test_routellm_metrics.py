"""RouteLLM's router metrics (conductor/stats/routellm.py): the curve's ends are the two models, a router that
knows the answers beats a random one, and a constant router is a random one."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from conductor.stats.routellm import apgr, cpt, random_apgr, route_curve

pairs = st.lists(st.tuples(st.booleans(), st.booleans(), st.floats(0, 1)), min_size=2, max_size=60)


@settings(max_examples=60, deadline=None)
@given(pairs)
def test_curve_ends_are_the_weak_and_the_strong_model(rows) -> None:
    strong, weak, scores = zip(*rows)
    c = route_curve(scores, strong, weak, [1.0] * len(rows), [0.0] * len(rows))
    assert c.accuracy[0] == sum(weak) / len(rows) and c.accuracy[-1] == sum(strong) / len(rows)
    assert c.dollars[0] == 0.0 and c.dollars[-1] == 1.0 and list(c.dollars) == sorted(c.dollars)


@settings(max_examples=60, deadline=None)
@given(pairs)
def test_a_router_that_knows_where_the_strong_model_helps_is_at_least_as_good_as_chance(rows) -> None:
    strong, weak, _ = zip(*rows)
    if sum(strong) <= sum(weak):
        return                                  # PGR is defined for a strong model that is better
    knows = [float(s) - float(w) for s, w in zip(strong, weak)]
    a = apgr(route_curve(knows, strong, weak))
    assert a >= random_apgr(strong, weak, repeats=50) - 1e-9
    assert cpt(route_curve(knows, strong, weak), 1.0) is not None


def test_a_constant_router_is_a_random_one_and_scores_about_one_half() -> None:
    strong = [True, True, False, True, True] * 40
    weak = [False, True, False, True, False] * 40
    constant = [apgr(route_curve([0.5] * 200, strong, weak, seed=s)) for s in range(30)]
    assert abs(sum(constant) / len(constant) - 0.5) < 0.03
    assert abs(random_apgr(strong, weak) - 0.5) < 0.03
