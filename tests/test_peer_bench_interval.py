"""The peer bench's interval for the speed ratio (bench/peers/trl_grpo.py)."""

from __future__ import annotations

import math

import pytest

from bench.peers.trl_grpo import ratio_interval


def test_the_ratio_interval_is_students_t_over_log_ratios() -> None:
    # logs 0.1, 0.3, 0.2: mean 0.2, sd 0.1, 2 degrees of freedom (t = 4.303)
    centre, low, high = ratio_interval([math.exp(0.1), math.exp(0.3), math.exp(0.2)])
    half = 4.303 * 0.1 / math.sqrt(3)
    assert centre == pytest.approx(math.exp(0.2))
    assert (low, high) == pytest.approx((math.exp(0.2 - half), math.exp(0.2 + half)))


def test_many_seeds_narrow_it_and_equal_ratios_leave_no_width() -> None:
    assert ratio_interval([1.7, 1.7, 1.7]) == pytest.approx((1.7, 1.7, 1.7))
    spread = [1.4, 1.9, 1.6, 1.8]
    few, many = ratio_interval(spread), ratio_interval(spread * 5)
    assert few[0] == pytest.approx(many[0])
    assert few[1] < many[1] < many[0] < many[2] < few[2]
    # 19 degrees of freedom come from the expansion: t(0.975, 19) = 2.093
    logs = [math.log(r) for r in spread * 5]
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
    assert math.log(many[2]) - mean == pytest.approx(2.093 * sd / math.sqrt(20), rel=1e-3)
