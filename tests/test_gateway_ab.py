"""The interleaved A/B of bench/serve.py (conductor/testing/gateway_ab.py): every target gets every prompt in each
round, in a rotating order, and a gateway's overhead is the median over rounds of the round-median difference."""

from __future__ import annotations

from conductor.testing.emulator import Emulator
from conductor.testing.gateway_ab import Target, interleaved, median_ms, round_median_overhead
from tests.fixtures_emulator import FAKE_KEYS


def test_round_median_overhead_is_the_median_of_round_median_differences() -> None:
    direct = Target("direct", "", "m", rounds=[[0.010, 0.012, 0.011], [0.020], []])
    gateway = Target("gw", "", "m", rounds=[[0.015, 0.016, 0.014], [0.021], [0.5]])
    med, p10, p90 = round_median_overhead(gateway, direct)     # the empty round is left out
    assert round(med, 6) == 2.5 and round(p10, 6) == 1.0 and round(p90, 6) == 4.0
    assert str(round_median_overhead(Target("a", "", "m"), direct)[0]) == "nan" and str(median_ms([])) == "nan"


def test_interleaved_sends_every_prompt_to_every_target_each_round() -> None:
    emu = Emulator().start()
    try:
        url = emu.base_url + "/v1/chat/completions"
        key = {"Authorization": f"Bearer {next(iter(FAKE_KEYS.values()))}"}
        a, b = Target("a", url, "m-a", headers=key), Target("b", url, "m-b", headers=key)
        measured: list[int] = []
        interleaved([a, b], ["p1", "p2", "p3"], rounds=3, per_round=4, warmup=2,
                    measure=lambda: measured.append(emu.stats().get("openai", 0)))
        assert a.errors == b.errors == 0 and measured
        assert [len(r) for r in a.rounds] == [4, 4, 4] == [len(r) for r in b.rounds]
        assert emu.stats().get("openai", 0) - measured[0] == 24
    finally:
        emu.stop()
