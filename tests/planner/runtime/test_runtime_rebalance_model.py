"""planner.runtime.rebalance_model: the refit with the plan's curve as prior, memory caps from measured
peaks, and the decision (the planner's own solver, same step batch and constraints)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.allocate.allocation import allocate
from planner.errors import ConfigError
from planner.runtime.rebalance_model import (
    RankLimits,
    RebalancePolicy,
    StepMeasure,
    decide,
    fit_rank_time,
    idle_fractions,
    memory_cap,
)
from torchkit.step.fit import AffineTimeFit

PRIOR = AffineTimeFit(intercept_s=0.01, s_per_sample=0.001)


def test_one_measured_batch_scales_the_plans_curve_to_the_measurement():
    fit = fit_rank_time([(40, 0.1, 5)], PRIOR, prior_weight=1.0)
    alpha = 0.1 / PRIOR.predict_s(40)
    assert fit.intercept_s == pytest.approx(alpha * 0.01)
    assert fit.s_per_sample == pytest.approx(alpha * 0.001)
    assert fit.predict_s(40) == pytest.approx(0.1)


def test_points_at_several_batches_decide_the_slope_and_the_prior_only_steadies_it():
    truth = AffineTimeFit(intercept_s=0.05, s_per_sample=0.004)  # 4× the plan's slope, 5× its fixed cost
    points = [(b, truth.predict_s(b), 20) for b in (10, 20, 40)]
    fit = fit_rank_time(points, PRIOR, prior_weight=1.0)
    assert fit.s_per_sample == pytest.approx(0.004, rel=0.05)
    assert fit.intercept_s == pytest.approx(0.05, rel=0.1)
    exact = fit_rank_time(points, PRIOR, prior_weight=0.0)
    assert exact.s_per_sample == pytest.approx(0.004) and exact.intercept_s == pytest.approx(0.05)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 500), st.floats(1e-4, 10.0), st.integers(1, 9)), min_size=1, max_size=6
    ),
    st.floats(0.0, 5.0),
)
def test_the_refit_is_never_negative_and_finite(points, weight):
    fit = fit_rank_time(points, PRIOR, prior_weight=weight)
    assert fit.intercept_s >= 0 and fit.s_per_sample >= 0
    assert all(fit.predict_s(b) < 1e6 for b, _, _ in points)


def test_memory_cap_extrapolates_the_measured_peak_and_never_exceeds_the_budget_or_the_plan_cap():
    limits = RankLimits(cap=100, prior=PRIOR, memory_budget_bytes=1000, bytes_per_sample=10.0)
    assert memory_cap(limits, [], 1) == 100  # nothing measured (CPU): the plan's cap
    assert memory_cap(limits, [(20, 600)], 4) == 60  # 600 + 10·(b − 20) ≤ 1000 → b ≤ 60
    assert memory_cap(limits, [(20, 600), (20, 700), (10, 900)], 1) == 50  # the largest batch's worst peak
    assert memory_cap(limits, [(20, 100)], 1) == 100  # more room than the plan: still the plan's cap
    assert memory_cap(limits, [(20, 1200)], 1) == 0  # already over the budget: nothing is safe to grow to


def limits(caps, slopes):
    return [
        RankLimits(cap=c, prior=AffineTimeFit(intercept_s=0.0, s_per_sample=s))
        for c, s in zip(caps, slopes, strict=True)
    ]


def measures(split, true_slopes, steps=3):
    return [
        StepMeasure(
            step=i + 3, batches=split, compute_s=tuple(b * s for b, s in zip(split, true_slopes, strict=True))
        )
        for i in range(steps)
    ]


def test_a_two_times_wrong_plan_is_corrected_to_the_solvers_optimum_for_the_measured_speeds():
    true = (0.001, 0.002, 0.004)
    plan = (0.001, 0.001, 0.002)  # every ratio 2× off
    start = tuple(int(b) for b in allocate([64] * 3, [0] * 3, plan, global_batch=56, multiple_of=4).batches)
    decision = decide(
        measures(start, true),
        limits([64] * 3, plan),
        current=start,
        multiple_of=4,
        min_batch=4,
        policy=RebalancePolicy(),
    )
    optimum = tuple(int(b) for b in allocate([64] * 3, [0] * 3, true, global_batch=56, multiple_of=4).batches)
    assert decision is not None
    assert decision.batches == optimum == (32, 16, 8)
    assert sum(decision.batches) == sum(start)
    assert decision.predicted_step_s < decision.current_step_s


def test_caps_bound_the_new_split():
    true = (0.001, 0.002, 0.004)
    start = (20, 20, 16)
    decision = decide(
        measures(start, true),
        limits([24, 64, 64], true),
        current=start,
        multiple_of=4,
        min_batch=4,
        policy=RebalancePolicy(),
    )
    assert decision is not None and decision.batches[0] <= 24 and sum(decision.batches) == 56


def test_a_balanced_split_or_a_gain_below_the_threshold_is_kept():
    true = (0.001, 0.002, 0.004)
    assert (
        decide(
            measures((32, 16, 8), true),
            limits([64] * 3, true),
            current=(32, 16, 8),
            multiple_of=4,
            min_batch=4,
            policy=RebalancePolicy(),
        )
        is None
    )
    slightly = (0.001, 0.002, 0.0041)  # 2.5% slower on rank 2: the best move gains less than the 2% floor
    assert (
        decide(
            measures((32, 16, 8), slightly),
            limits([64] * 3, true),
            current=(32, 16, 8),
            multiple_of=1,
            min_batch=1,
            policy=RebalancePolicy(),
        )
        is None
    )


def test_a_measured_peak_over_the_budget_forces_the_rank_down():
    lim = [
        RankLimits(
            cap=64,
            prior=AffineTimeFit(intercept_s=0.0, s_per_sample=0.001),
            memory_budget_bytes=1000,
            bytes_per_sample=50.0,
        )
        for _ in range(3)
    ]
    split = (24, 16, 16)  # balanced enough in time, but rank 0 peaked above its budget
    steps = [
        StepMeasure(
            step=5, batches=split, compute_s=tuple(b * 0.001 for b in split), peak_bytes=(1100, 500, 500)
        )
    ]
    decision = decide(steps, lim, current=split, multiple_of=1, min_batch=1, policy=RebalancePolicy())
    assert decision is not None and decision.batches[0] <= 22  # 1100 − 50·2 = 1000


def test_idle_fractions_are_the_share_of_the_step_each_rank_waits():
    assert idle_fractions([1.0, 0.5, 2.0]) == pytest.approx((0.5, 0.75, 0.0))


def test_policy_rejects_nonsense_with_the_field_name():
    with pytest.raises(ConfigError, match="probe_steps"):
        RebalancePolicy(probe_steps=0)
    with pytest.raises(ConfigError, match="imbalance_threshold"):
        RebalancePolicy(imbalance_threshold=1.5)


def test_a_plan_of_the_wrong_shape_is_corrected_by_the_second_decision():
    # the estimate thinks rank 2 is dominated by a fixed cost; the device really is proportional and slow
    prior = [
        AffineTimeFit(intercept_s=0.0, s_per_sample=0.003),
        AffineTimeFit(intercept_s=0.0, s_per_sample=0.006),
        AffineTimeFit(intercept_s=0.08, s_per_sample=0.0005),
    ]
    lim = [RankLimits(cap=64, prior=p) for p in prior]
    true = (0.003, 0.006, 0.012)
    start = (24, 16, 16)
    policy = RebalancePolicy()
    first = decide(measures(start, true), lim, current=start, multiple_of=4, min_batch=4, policy=policy)
    assert first is not None
    history = measures(start, true) + measures(first.batches, true)
    second = decide(history, lim, current=first.batches, multiple_of=4, min_batch=4, policy=policy)
    final = second.batches if second is not None else first.batches
    assert final == (32, 16, 8)


def test_a_burst_of_load_in_the_first_steps_does_not_leave_the_split_stuck():
    true = (0.003, 0.006, 0.012)
    lim = limits([64] * 3, true)
    policy = RebalancePolicy()
    # a burst of load made rank 2 look 20% slower at (32, 16, 8); the first decision moved it down
    burst = [StepMeasure(step=s, batches=(32, 16, 8), compute_s=(0.096, 0.096, 0.115)) for s in (3, 4, 5)]
    moved = (36, 16, 4)
    later = measures(moved, true)
    decision = decide(burst + later, lim, current=moved, multiple_of=4, min_batch=4, policy=policy)
    assert decision is not None and decision.batches == (32, 16, 8)


def test_a_split_measured_balanced_is_kept_whatever_the_curves_say():
    wrong_prior = limits([64] * 3, (0.003, 0.003, 0.003))
    balanced = measures((32, 16, 8), (0.003, 0.006, 0.012))
    assert (
        decide(
            balanced, wrong_prior, current=(32, 16, 8), multiple_of=4, min_batch=4, policy=RebalancePolicy()
        )
        is None
    )
