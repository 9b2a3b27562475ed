"""The ONNX Runtime speed bench's timing rounds (nystrom_lab.bench.onnx_speed), with fake engines and clock."""

from __future__ import annotations

import pytest

from nystrom_lab.bench import onnx_speed


def test_a_case_s_round_budget_counts_only_its_own_calls():
    """onnx_speed's rounds: a slow case (1 s a call) stops after its first round, while a fast one (0.1 s)
    keeps going until its own calls pass the budget (0.5 s: three rounds), whatever the slow one spent."""
    now = [0.0]
    cost = {(4096, 1): 1.0, (512, 1): 0.1}

    def engine(case):
        now[0] += cost[case]

    cases = list(cost)
    times = {c: {"eager": [], "ort": []} for c in cases}
    onnx_speed.time_rounds({"eager": engine, "ort": engine}, cases, times, rounds=5, budget_s=0.5,
                           clock=lambda: now[0])  # fmt: skip
    assert [len(times[c]["eager"]) for c in cases] == [1, 3]
    assert times[(512, 1)]["ort"] == pytest.approx([0.1, 0.1, 0.1])


def test_engines_take_turns_in_reversed_order_every_other_round():
    calls = []
    engines = {name: (lambda case, name=name: calls.append(name)) for name in ("eager", "ort", "ort_masked_only")}
    times = {(8, 1): {name: [] for name in engines}}
    onnx_speed.time_rounds(engines, [(8, 1)], times, rounds=2, budget_s=60.0)
    assert calls == ["eager", "ort", "ort_masked_only", "ort_masked_only", "ort", "eager"]
    assert [len(t) for t in times[(8, 1)].values()] == [2, 2, 2]


def test_every_timed_call_follows_an_untimed_rest():
    """The rest before each call (other engines' spinning threads stop) is slept, never timed."""
    now = [0.0]
    rests = []

    def sleep(s):
        rests.append(s)
        now[0] += s

    def engine(case):
        now[0] += 0.25

    times = {(8, 1): {"eager": [], "ort": []}}
    onnx_speed.time_rounds({"eager": engine, "ort": engine}, [(8, 1)], times, rounds=3, budget_s=60.0,
                           settle_s=0.2, clock=lambda: now[0], sleep=sleep)  # fmt: skip
    assert rests == [0.2] * 6
    assert times[(8, 1)]["eager"] == pytest.approx([0.25] * 3) and times[(8, 1)]["ort"] == pytest.approx([0.25] * 3)
