"""The re-balancer's rules as pure functions (planner.runtime.rebalance_model, rebalance_report, simulate):
bounded moves, the neutral shape from one batch, noise-aware thresholds, no lock-in, the verdict that rolls a
switch back, the watch that sees speeds change, and a report that never says NaN."""

from __future__ import annotations

import random

import pytest

from planner.errors import ConfigError
from planner.runtime.rebalance_model import (
    RankLimits,
    RebalancePolicy,
    StepMeasure,
    bounded_split,
    decide,
    move_bounds,
    speeds_changed,
    switch_verdict,
    thresholds,
)
from planner.runtime.rebalance_report import Switch, build_report
from planner.runtime.simulate import SimulatedSpeed, parse_speed_change
from torchkit.step.fit import AffineTimeFit

POLICY = RebalancePolicy()


def limits(slopes, caps=(64, 64, 64), intercepts=(0.0, 0.0, 0.0)):
    return [
        RankLimits(cap=c, prior=AffineTimeFit(intercept_s=t0, s_per_sample=s))
        for c, s, t0 in zip(caps, slopes, intercepts, strict=True)
    ]


def steps_at(split, per_sample, *, first=3, count=3, noise=0.0, seed=0):
    rng = random.Random(seed)
    return [
        StepMeasure(
            step=first + i,
            batches=tuple(split),
            compute_s=tuple(
                b * s * (1 + rng.uniform(-noise, noise)) for b, s in zip(split, per_sample, strict=True)
            ),
        )
        for i in range(count)
    ]


def test_one_switch_moves_no_rank_beyond_half_or_double_its_batch():
    # the plan is 8× wrong: the optimum (48, 12, 4)-ish is far; one switch may only go half-way there
    start = (8, 24, 24)
    decision = decide(
        steps_at(start, (0.001, 0.004, 0.008)),
        limits((0.001,) * 3),
        current=start,
        multiple_of=4,
        min_batch=4,
        policy=POLICY,
    )
    assert decision is not None and sum(decision.batches) == sum(start)
    for old, new in zip(start, decision.batches, strict=True):
        assert old / 2 <= new <= old * 2, decision.batches
    assert decision.batches[0] == 16  # as far as it may go, towards the fast rank


def test_move_bounds_respect_min_batch_caps_and_the_multiple():
    low, high = move_bounds((8, 24, 40), (64, 30, 64), multiple_of=4, min_batch=8, factor=2.0)
    assert low == [8, 12, 20] and high == [16, 28, 64]


def test_bounded_split_is_the_min_max_split_within_the_bounds():
    fits = [AffineTimeFit(intercept_s=0.0, s_per_sample=s) for s in (0.001, 0.002, 0.004)]
    assert bounded_split(fits, 56, [4, 4, 4], [64, 64, 64], 4) == (32, 16, 8)
    assert bounded_split(fits, 56, [4, 20, 4], [64, 64, 64], 4) == (28, 20, 8)  # rank 1 held at 20
    assert bounded_split(fits, 56, [30, 30, 4], [64, 64, 64], 4) is None  # the lows alone exceed the batch


def test_one_measured_batch_gives_a_move_in_proportion_to_throughput_not_the_plans_shape():
    # the estimate says 95% fixed cost (a move would gain nothing); the ranks really are proportional
    prior = limits((0.00005,) * 3, intercepts=(0.1, 0.1, 0.1))
    start = (20, 20, 16)
    decision = decide(
        steps_at(start, (0.001, 0.002, 0.004)),
        prior,
        current=start,
        multiple_of=4,
        min_batch=4,
        policy=POLICY,
    )
    assert decision is not None and decision.reason == "refit"
    assert decision.fits[0].intercept_s == 0.0  # neutral shape
    assert decision.batches == (32, 16, 8)


def test_noise_raises_the_thresholds_so_identical_ranks_do_not_switch():
    # identical ranks on a noisy machine: ±15% per step; their medians differ by chance
    noisy = [
        StepMeasure(step=3 + i, batches=(20, 20, 16), compute_s=t)
        for i, t in enumerate([(0.020, 0.024, 0.016), (0.026, 0.019, 0.017), (0.021, 0.022, 0.019)])
    ]
    limit = thresholds(noisy, POLICY)
    assert limit.noise > 0.05 and limit.idle > 0.15
    assert (
        decide(noisy, limits((0.001,) * 3), current=(20, 20, 16), multiple_of=4, min_batch=4, policy=POLICY)
        is None
    )
    # the same 20% imbalance measured without noise is corrected
    clean = steps_at((20, 20, 16), (0.001, 0.00125, 0.001))
    assert thresholds(clean, POLICY).idle == POLICY.imbalance_threshold
    assert (
        decide(clean, limits((0.001,) * 3), current=(20, 20, 16), multiple_of=4, min_batch=4, policy=POLICY)
        is not None
    )


def test_a_small_ranks_jitter_does_not_hold_back_a_split_far_from_balanced():
    # ranks 0 and 1 take 0.6 ms ± 50% (a loaded host's jitter), rank 2 110 ms: the noise that matters is on the
    # step's scale (the thresholds are shares of the step); on the small ranks' own it stood still 20 steps
    small = ((0.0006, 0.0009, 0.0004), (0.0012, 0.0006, 0.0005), (0.0004, 0.0006, 0.0009))
    steps = [
        StepMeasure(step=3 + i, batches=(1, 1, 46), compute_s=(a, b, c))
        for i, ((a, b, _), c) in enumerate(zip(small, (0.110, 0.112, 0.109), strict=True))
    ]
    assert thresholds(steps, POLICY).noise < 0.02
    decision = decide(
        steps, limits((0.001,) * 3), current=(1, 1, 46), multiple_of=1, min_batch=1, policy=POLICY
    )
    assert decision is not None and decision.batches == (2, 2, 44)  # bounded: 2× at most


def test_an_imbalance_the_refit_calls_unfixable_still_gets_a_bounded_step():
    # rank 2 measured the same time at batches 8 and 16 (a burst of load at 8): the affine refit says it is
    # all fixed cost, so moving samples off it "gains nothing"; the split measured now is far from balanced
    earlier = [
        StepMeasure(step=3 + i, batches=(32, 16, 8), compute_s=(0.032, 0.032, 0.050)) for i in range(3)
    ]
    now = [StepMeasure(step=6 + i, batches=(24, 16, 16), compute_s=(0.024, 0.032, 0.050)) for i in range(3)]
    decision = decide(
        earlier + now, limits((0.001,) * 3), current=(24, 16, 16), multiple_of=4, min_batch=4, policy=POLICY
    )
    assert decision is not None and decision.reason == "bounded step"
    assert decision.batches[2] < 16 and all(8 <= b <= 48 for b in decision.batches)


def test_a_rolled_back_split_is_not_proposed_again():
    start = (20, 20, 16)
    measured = steps_at(start, (0.001, 0.002, 0.004))
    first = decide(measured, limits((0.001,) * 3), current=start, multiple_of=4, min_batch=4, policy=POLICY)
    again = decide(
        measured,
        limits((0.001,) * 3),
        current=start,
        multiple_of=4,
        min_batch=4,
        policy=POLICY,
        rejected={first.batches},
    )
    assert again is None or again.batches != first.batches


def test_the_verdict_keeps_a_faster_split_and_rolls_back_one_that_is_not():
    before = steps_at((20, 20, 16), (0.001, 0.002, 0.004))  # 64 ms
    faster = steps_at((32, 16, 8), (0.001, 0.002, 0.004), first=6)  # 32 ms
    slower = steps_at(
        (36, 16, 4), (0.001, 0.002, 0.010), first=6
    )  # the new split hit a slow path: 40 ms > 36
    clearly_slower = steps_at((36, 16, 4), (0.001, 0.002, 0.012), first=6)  # 48 ms: 1.5× the 32 ms before
    assert switch_verdict(before, faster, POLICY) == ("keep", pytest.approx(0.064), pytest.approx(0.032))
    assert (
        switch_verdict(faster, clearly_slower, POLICY)[0] == "rollback"
    )  # at once: the transient stays short
    # mildly slower after 3 steps (a burst of load can do that): measured as long again, then undone
    assert switch_verdict(faster, slower, POLICY)[0] == "more"
    longer = slower + steps_at((36, 16, 4), (0.001, 0.002, 0.010), first=9)
    assert switch_verdict(faster, longer, POLICY)[0] == "rollback"
    assert switch_verdict(before, before + before, POLICY)[0] == "rollback"  # not faster is undone too


def test_a_switch_measured_slower_within_the_noise_is_measured_on_before_it_is_undone():
    # load 12: three steps of the better split [6, 14, 28] measured 1.39× slower than [3, 11, 34] and it was undone
    # at once; steps this noisy (±40%) are measured as long again first
    before = [
        StepMeasure(step=3 + i, batches=(3, 11, 34), compute_s=(0.0010, 0.0013, t))
        for i, t in enumerate((0.0031, 0.0030, 0.0032))
    ]
    noisy = [
        StepMeasure(step=6 + i, batches=(6, 14, 28), compute_s=(a, a, a))
        for i, a in enumerate((0.0043, 0.0026, 0.0061))
    ]
    verdict, before_s, after_s = switch_verdict(before, noisy, POLICY)
    assert after_s / before_s > POLICY.rollback_at_once and verdict == "more"
    steady = [
        StepMeasure(step=6 + i, batches=(6, 14, 28), compute_s=(a, a, a)) for i, a in enumerate((0.0043,) * 3)
    ]
    assert switch_verdict(before, steady, POLICY)[0] == "rollback"  # as slower without the noise: at once


def test_the_watch_sees_a_speed_change_and_not_the_noise():
    earlier = steps_at((32, 16, 8), (0.001, 0.002, 0.004), count=6, noise=0.02)
    same = steps_at((32, 16, 8), (0.001, 0.002, 0.004), first=20, count=5, noise=0.02, seed=1)
    changed = steps_at((32, 16, 8), (0.004, 0.002, 0.001), first=20, count=5, noise=0.02, seed=1)
    assert not speeds_changed(earlier, same, POLICY)
    assert speeds_changed(earlier, changed, POLICY)
    assert not speeds_changed(earlier[:2], changed, POLICY)  # too few steps to tell


def test_the_report_of_a_split_seen_before_is_not_nan():
    a, b = (24, 24, 8), (32, 16, 8)
    measures = [*steps_at(a, (0.001, 0.002, 0.004)), *steps_at(b, (0.001, 0.002, 0.006), first=6)]
    splits = [a] * 5 + [b] * 3 + [a] * 2  # switched back to a; its last run was never gathered
    switches = [
        Switch(decided_at_step=5, position=(0, 5), batches=b, predicted_step_s=0.03, previous_step_s=0.05),
        Switch(
            decided_at_step=8,
            position=(0, 8),
            batches=a,
            predicted_step_s=0.048,
            previous_step_s=0.048,
            kind="rollback",
        ),
    ]
    report = build_report(splits, measures, switches, warmup_steps=2)
    assert report.max_idle_last == pytest.approx(report.max_idle_first)
    assert report.rollbacks == 1
    line = report.line(samples_once=True)
    assert "nan" not in line.lower() and "rollbacks=1" in line and "sync_wait_s_last=n/a" in line


def test_policy_and_simulation_reject_nonsense_with_the_field_name():
    with pytest.raises(ConfigError, match="max_move_factor"):
        RebalancePolicy(max_move_factor=1.0)
    with pytest.raises(ConfigError, match="watch_cost_share"):
        RebalancePolicy(watch_cost_share=2.0)
    with pytest.raises(ConfigError, match="STEP:K0"):
        parse_speed_change("4,2,1", 3)
    with pytest.raises(ConfigError, match="3 ranks"):
        parse_speed_change("30:4,2", 3)


def test_the_simulation_shares_one_per_sample_time_and_changes_speed_when_told():
    declared = SimulatedSpeed(factors=(1, 2, 4), sample_s=0.002, changes=[parse_speed_change("30:4,2,1", 3)])
    assert [declared.extra_s(r, 10, 5) for r in range(3)] == pytest.approx([0.02, 0.04, 0.08])
    assert [declared.extra_s(r, 10, 30) for r in range(3)] == pytest.approx([0.08, 0.04, 0.02])
    assert declared.step_time_s((32, 16, 8), 1) == pytest.approx(0.064)
    measured = SimulatedSpeed(factors=(1, 2, 4))
    assert measured.measuring and measured.extra_s(2, 10, 1) == 0.0  # nothing sleeps before the agreement
    measured.agree(0.001)
    # every rank's compute is stretched to k·s·b with the one agreed s, its real compute part of it
    assert [measured.extra_s(r, 10, 3) for r in range(3)] == pytest.approx([0.01, 0.02, 0.04])
    assert [measured.extra_s(r, 10, 3, real_s=0.015) for r in range(3)] == pytest.approx([0.0, 0.005, 0.025])
    assert "agreed by all ranks" in measured.describe()


def test_a_gain_the_neutral_shape_under_promises_still_gets_its_bounded_step():
    # speeds 4,2,1 from (4, 16, 36): rank 0's few samples carry ~3 ms of fixed cost, so "proportional" says
    # batch 8 costs 70 ms and the gain (6%) is below the noise threshold; the measured imbalance (55% idle) is
    # far beyond it: the bounded step is taken, and the verdict would undo it if it were wrong
    rank2 = (0.0745, 0.0780, 0.0731, 0.0749, 0.0779, 0.0732)
    steps = [
        StepMeasure(step=3 + i, batches=(4, 16, 36), compute_s=(0.0352, 0.0660, t))
        for i, t in enumerate(rank2)
    ]
    limit = thresholds(steps, POLICY)
    assert limit.gain > 0.06
    decision = decide(
        steps, limits((0.001,) * 3), current=(4, 16, 36), multiple_of=4, min_batch=4, policy=POLICY
    )
    assert decision is not None and decision.reason == "bounded step" and decision.batches == (8, 16, 32)
