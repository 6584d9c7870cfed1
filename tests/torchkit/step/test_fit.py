"""torchkit.step.fit: memory and step-time fits, point cleaning, and the largest batch within a budget."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchkit.step.fit import (
    OUTLIER_RELATIVE_TOLERANCE,
    AffineMemoryFit,
    LogLogMemoryFit,
    clean_increasing,
    fit_memory,
    fit_time,
    max_batch_within,
)

GIB = 2**30

batch_sets = st.lists(st.integers(min_value=1, max_value=4096), min_size=2, max_size=8, unique=True)


# ---------------------------------------------------------------------------------------------- clean_increasing


def test_clean_increasing_sorts_by_batch_and_keeps_increasing_points():
    kept, dropped = clean_increasing([(4, 40.0), (1, 10.0), (2, 20.0)])
    assert kept == [(1, 10.0), (2, 20.0), (4, 40.0)]
    assert dropped == []


def test_clean_increasing_drops_a_point_lower_than_a_smaller_batch_with_its_reason():
    kept, dropped = clean_increasing([(1, 10.0), (2, 30.0), (4, 25.0), (8, 50.0)])
    assert kept == [(1, 10.0), (2, 30.0), (8, 50.0)]
    assert len(dropped) == 1
    assert (dropped[0].batch, dropped[0].value) == (4, 25.0)
    assert dropped[0].reason == "not increasing: 25 at batch 4 <= 30 at batch 2"


def test_clean_increasing_drops_an_equal_value_as_not_increasing():
    kept, dropped = clean_increasing([(1, 10.0), (2, 10.0)])
    assert kept == [(1, 10.0)]
    assert dropped[0].batch == 2
    assert dropped[0].reason.startswith("not increasing")


def test_clean_increasing_keeps_the_largest_value_of_a_duplicate_batch():
    kept, dropped = clean_increasing([(2, 30.0), (1, 10.0), (2, 20.0)])
    assert kept == [(1, 10.0), (2, 30.0)]
    assert [(d.batch, d.value, d.reason) for d in dropped] == [(2, 20.0, "duplicate batch")]


@pytest.mark.parametrize(
    "point", [(0, 10.0), (-1, 10.0), (3, 0.0), (3, -5.0), (3, math.nan), (3, math.inf)], ids=str
)
def test_clean_increasing_drops_points_that_are_not_positive_and_finite(point):
    kept, dropped = clean_increasing([(1, 1.0), point])
    assert kept == [(1, 1.0)]
    assert len(dropped) == 1
    assert dropped[0].batch == point[0]
    assert dropped[0].reason == "not a positive finite point"


values = st.one_of(st.floats(min_value=-10, max_value=1e6), st.sampled_from([math.nan, math.inf]))


@given(st.lists(st.tuples(st.integers(-3, 50), values), max_size=30))
@settings(max_examples=150, deadline=None)
def test_clean_increasing_accounts_for_every_point_and_keeps_a_strictly_increasing_curve(points):
    kept, dropped = clean_increasing(points)
    assert len(kept) + len(dropped) == len(points)
    assert all(b > 0 and v > 0 and math.isfinite(v) for b, v in kept)
    for (b0, v0), (b1, v1) in zip(kept, kept[1:], strict=False):
        assert b1 > b0
        assert v1 > v0


# ---------------------------------------------------------------------------------------------- memory fits


@given(
    intercept=st.integers(min_value=0, max_value=80 * GIB),
    per_sample=st.integers(min_value=1, max_value=GIB),
    batches=batch_sets,
)
@settings(max_examples=150, deadline=None)
def test_affine_memory_fit_recovers_exactly_affine_points(intercept, per_sample, batches):
    points = [(b, float(intercept + per_sample * b)) for b in batches]
    result = fit_memory(points)
    fit = result.fit
    assert isinstance(fit, AffineMemoryFit)
    # exact up to float rounding at the scale of the values (least squares on values up to ~1e12)
    scale = intercept + per_sample * max(batches)
    assert fit.bytes_per_sample == pytest.approx(per_sample, rel=1e-6, abs=1e-9 * scale)
    assert fit.intercept_bytes == pytest.approx(intercept, abs=1e-9 * scale)
    for b in (0, *batches, 2 * max(batches)):
        assert fit.predict_bytes(b) == pytest.approx(intercept + per_sample * b, abs=1e-9 * scale)
    assert result.dropped == ()
    assert result.outliers == ()
    assert result.used_points == tuple(sorted(points))


@given(
    exponent=st.floats(min_value=0.3, max_value=2.0),
    bytes_at_one=st.floats(min_value=1e6, max_value=1e10),
    batches=batch_sets,
)
@settings(max_examples=100, deadline=None)
def test_loglog_memory_fit_recovers_an_exact_power_law(exponent, bytes_at_one, batches):
    points = [(b, bytes_at_one * b**exponent) for b in batches]
    fit = fit_memory(points, kind="loglog").fit
    assert isinstance(fit, LogLogMemoryFit)
    assert fit.log_slope == pytest.approx(exponent, rel=1e-6, abs=1e-9)
    assert fit.log_intercept == pytest.approx(math.log(bytes_at_one), rel=1e-6, abs=1e-6)


def test_single_point_affine_fit_is_proportional():
    fit = fit_memory([(4, 400.0)]).fit
    assert fit == AffineMemoryFit(intercept_bytes=0.0, bytes_per_sample=100.0)


def test_single_point_loglog_fit_is_linear_through_the_point():
    fit = fit_memory([(4, 400.0)], kind="loglog").fit
    assert fit.log_slope == 1.0
    assert fit.predict_bytes(4) == pytest.approx(400.0)
    assert fit.predict_bytes(8) == pytest.approx(800.0)


def test_memory_fit_reports_dropped_points_and_fits_the_rest():
    result = fit_memory([(1, 100.0), (2, 200.0), (3, 150.0), (4, 400.0)])
    assert [d.batch for d in result.dropped] == [3]
    assert result.fit.bytes_per_sample == pytest.approx(100.0)
    assert result.fit.intercept_bytes == pytest.approx(0.0, abs=1e-9)


def test_memory_fit_reports_a_point_far_off_the_line_as_an_outlier_but_uses_it():
    points = [(1, 100.0), (2, 200.0), (3, 300.0), (4, 400.0), (5, 500.0), (6, 1000.0)]
    result = fit_memory(points)
    assert 6 in [o.batch for o in result.outliers]
    assert (6, 1000.0) in result.used_points
    outlier = next(o for o in result.outliers if o.batch == 6)
    assert "off the fit" in outlier.reason
    # every reported outlier really is further than the tolerance from the fit
    for o in result.outliers:
        assert abs(result.fit.predict_bytes(o.batch) - o.value) > OUTLIER_RELATIVE_TOLERANCE * o.value


def test_memory_fit_without_a_usable_point_raises():
    with pytest.raises(ValueError, match="no usable memory point"):
        fit_memory([(0, 10.0), (2, -1.0)])


def test_memory_fit_rejects_an_unknown_kind():
    with pytest.raises(ValueError, match="unknown memory fit kind 'cubic'"):
        fit_memory([(1, 10.0), (2, 20.0)], kind="cubic")  # type: ignore[arg-type]


def test_affine_largest_batch_within_is_inf_or_zero_when_memory_does_not_grow():
    flat = AffineMemoryFit(intercept_bytes=100.0, bytes_per_sample=0.0)
    assert flat.largest_batch_within(100.0) == math.inf
    assert flat.largest_batch_within(99.0) == 0.0


def test_loglog_largest_batch_within_inverts_the_curve():
    fit = LogLogMemoryFit(log_slope=1.0, log_intercept=math.log(100.0))
    assert fit.largest_batch_within(1000.0) == pytest.approx(10.0)
    assert fit.largest_batch_within(0.0) == 0.0


# ---------------------------------------------------------------------------------------------- time fits


@given(
    intercept=st.floats(min_value=0.0, max_value=1.0),
    per_sample=st.floats(min_value=1e-6, max_value=0.1),
    batches=batch_sets,
)
@settings(max_examples=150, deadline=None)
def test_time_fit_recovers_exactly_affine_points(intercept, per_sample, batches):
    points = [(b, intercept + per_sample * b) for b in batches]
    fit = fit_time(points).fit
    scale = intercept + per_sample * max(batches)
    assert fit.s_per_sample == pytest.approx(per_sample, rel=1e-6)
    assert fit.intercept_s == pytest.approx(intercept, abs=1e-6 * scale)
    assert fit.intercept_s >= 0


def test_time_fit_with_a_falling_slope_is_a_flat_mean():
    fit = fit_time([(1, 0.30), (2, 0.20), (4, 0.10)]).fit
    assert fit.intercept_s == pytest.approx(0.2)
    assert fit.s_per_sample == 0.0


def test_time_fit_with_a_negative_intercept_is_proportional_through_the_origin():
    points = [(1, 0.05), (2, 0.2), (3, 0.35)]  # line 0.15·b - 0.1
    fit = fit_time(points).fit
    expected = (1 * 0.05 + 2 * 0.2 + 3 * 0.35) / (1 + 4 + 9)
    assert fit.intercept_s == 0.0
    assert fit.s_per_sample == pytest.approx(expected)


def test_time_fit_of_one_repeated_batch_is_proportional_to_the_mean():
    fit = fit_time([(8, 0.1), (8, 0.3)]).fit
    assert fit.intercept_s == 0.0
    assert fit.s_per_sample == pytest.approx(0.2 / 8)


def test_time_fit_drops_non_positive_and_non_finite_times_and_keeps_noisy_ones():
    result = fit_time([(1, 0.1), (2, 0.0), (3, math.nan), (4, 0.4), (5, 0.38)])
    assert sorted(d.batch for d in result.dropped) == [2, 3]
    assert all(d.reason == "not a positive finite time" for d in result.dropped)
    # batch 5 is faster than batch 4: timings are noisy, so a falling point is kept
    assert [b for b, _ in result.used_points] == [1, 4, 5]


def test_time_fit_without_a_usable_point_raises():
    with pytest.raises(ValueError, match="no usable step-time point"):
        fit_time([(1, 0.0), (0, 1.0)])


# ---------------------------------------------------------------------------------------------- max_batch_within


affine_fits = st.builds(
    lambda m0, m1: AffineMemoryFit(intercept_bytes=m0, bytes_per_sample=m1),
    st.floats(min_value=0.0, max_value=40.0 * GIB),
    st.floats(min_value=1e3, max_value=2.0 * GIB),
)
loglog_fits = st.builds(
    lambda p0, p1: LogLogMemoryFit(log_slope=p0, log_intercept=p1),
    st.floats(min_value=0.5, max_value=1.5),
    st.floats(min_value=math.log(1e6), max_value=math.log(4.0 * GIB)),
)


@given(
    fit=st.one_of(affine_fits, loglog_fits),
    budget=st.floats(min_value=0.0, max_value=200.0 * GIB),
    multiple_of=st.integers(min_value=1, max_value=64),
    upper=st.one_of(st.none(), st.integers(min_value=0, max_value=65536)),
)
@settings(max_examples=300, deadline=None)
def test_max_batch_within_fits_and_the_next_multiple_does_not(fit, budget, multiple_of, upper):
    if upper is None and fit.largest_batch_within(budget) > 1e6:
        upper = 1_000_000  # a real caller bounds the batch (planner: MAX_PLANNED_BATCH)
    batch = max_batch_within(fit, budget, multiple_of=multiple_of, upper=upper)
    assert batch >= 0
    assert batch % multiple_of == 0
    if upper is not None:
        assert batch <= upper
    if batch > 0:
        assert fit.predict_bytes(batch) <= budget
    following = batch + multiple_of
    assert (upper is not None and following > upper) or fit.predict_bytes(following) > budget


def test_max_batch_within_at_an_exact_boundary_takes_the_boundary():
    fit = AffineMemoryFit(intercept_bytes=1000.0, bytes_per_sample=100.0)
    assert max_batch_within(fit, 1000.0 + 100.0 * 37) == 37
    assert max_batch_within(fit, 1000.0 + 100.0 * 37 - 1) == 36
    assert max_batch_within(fit, 1000.0 + 100.0 * 37, multiple_of=8) == 32


def test_max_batch_within_is_zero_when_not_even_the_intercept_fits():
    fit = AffineMemoryFit(intercept_bytes=1000.0, bytes_per_sample=100.0)
    assert max_batch_within(fit, 999.0) == 0
    assert max_batch_within(fit, 1000.0 + 100.0 * 7, multiple_of=8) == 0


def test_max_batch_within_respects_the_upper_bound():
    fit = AffineMemoryFit(intercept_bytes=0.0, bytes_per_sample=1.0)
    assert max_batch_within(fit, 1e6, upper=100) == 100
    assert max_batch_within(fit, 1e6, multiple_of=16, upper=100) == 96


def test_max_batch_within_flat_memory_needs_an_upper_bound():
    flat = AffineMemoryFit(intercept_bytes=10.0, bytes_per_sample=0.0)
    with pytest.raises(ValueError, match="give an upper bound"):
        max_batch_within(flat, 100.0)
    assert max_batch_within(flat, 100.0, upper=50) == 50
    assert max_batch_within(flat, 5.0, upper=50) == 0


@pytest.mark.parametrize("multiple_of", [0, -8])
def test_max_batch_within_rejects_a_multiple_below_one(multiple_of):
    fit = AffineMemoryFit(intercept_bytes=0.0, bytes_per_sample=1.0)
    with pytest.raises(ValueError, match=f"multiple_of must be >= 1, got {multiple_of}"):
        max_batch_within(fit, 100.0, multiple_of=multiple_of)
