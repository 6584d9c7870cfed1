"""The balance efficiency a plan can expect when the step-time model is off (planner/allocate/uncertainty.py)."""

from __future__ import annotations

import math

import pytest

from planner.allocate.uncertainty import balance_efficiency_range, step_time_range_s


def _eff(t1, cap, batches, factor):
    times = [t * b * f for t, b, f in zip(t1, batches, factor, strict=True)]
    throughput = sum(batches) / max(times)
    bound = sum(c / (t * c * f) for t, c, f in zip(t1, cap, factor, strict=True))
    return min(1.0, throughput / bound)


def test_without_uncertainty_the_range_is_the_point() -> None:
    lo, hi = balance_efficiency_range(
        [0, 0], [0.01, 0.02], [100, 100], [100, 50], [True, True], [0, 0], ["a", "b"]
    )
    assert lo == hi == pytest.approx(_eff([0.01, 0.02], [100, 100], [100, 50], [1, 1]))


def test_each_gpu_type_is_off_by_its_sigma_in_either_direction() -> None:
    t1, cap, batches = [0.01, 0.02], [100, 100], [100, 50]  # balanced: both ranks take 1.0 s
    s = 0.2
    lo, hi = balance_efficiency_range([0, 0], t1, cap, batches, [True, True], [s, s], ["a", "b"])
    corners = [_eff(t1, cap, batches, [math.exp(x * s), math.exp(y * s)]) for x in (-1, 1) for y in (-1, 1)]
    assert lo == pytest.approx(min(corners)) and hi == pytest.approx(max(corners))
    assert lo < _eff(t1, cap, batches, [1, 1]) <= hi


def test_ranks_of_one_type_share_their_error_and_measured_types_have_none() -> None:
    t1, cap, batches = [0.01, 0.01, 0.02], [100, 100, 100], [100, 100, 50]
    lo, hi = balance_efficiency_range(
        [0, 0, 0], t1, cap, batches, [True] * 3, [0.3, 0.3, 0.0], ["a", "a", "m"]
    )
    corners = [_eff(t1, cap, batches, [math.exp(x * 0.3)] * 2 + [1.0]) for x in (-1, 1)]
    nominal = _eff(t1, cap, batches, [1.0] * 3)  # the predicted point is always inside the range
    assert lo == pytest.approx(min([*corners, nominal])) and hi == pytest.approx(max([*corners, nominal]))


def test_excluded_ranks_do_not_count() -> None:
    lo, hi = balance_efficiency_range(
        [0, 0], [0.01, 5.0], [100, 0], [100, 0], [True, False], [0.1, 0.5], ["a", "b"]
    )
    assert lo == hi == pytest.approx(1.0)


def test_many_types_use_the_one_off_corners() -> None:
    n = 14  # more than MAX_ENUMERATED_TYPES
    t1 = [0.01 * (1 + i / n) for i in range(n)]
    batches = [round(100 / (1 + i / n)) for i in range(n)]
    lo, hi = balance_efficiency_range(
        [0] * n, t1, [200] * n, batches, [True] * n, [0.1] * n, [str(i) for i in range(n)]
    )
    assert 0 < lo < hi <= 1.0


def test_the_optimizer_step_range_is_every_type_fast_to_every_type_slow_plus_the_sync_range() -> None:
    # ranks at 0.10 s (sigma 0.2) and 0.09 s (sigma 0.5): fast, the slowest is 0.10·e^-0.2; slow, 0.09·e^0.5
    low, high = step_time_range_s([0.10, 0.09], [0.2, 0.5], accumulate=3, sync_range_s=(0.01, 0.05))
    assert low == pytest.approx(3 * 0.10 * math.exp(-0.2) + 0.01)
    assert high == pytest.approx(3 * 0.09 * math.exp(0.5) + 0.05)
    assert step_time_range_s([0.2], [0.0]) == (0.2, 0.2)
