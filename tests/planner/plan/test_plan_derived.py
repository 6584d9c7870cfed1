"""planner.plan.derived: a rank's derated curve read by the allocation, the rank entries and the expected range;
the loss weight and the plan's identities, checked once for the builder, the reader and the writer."""

from __future__ import annotations

import dataclasses
import re

import pytest

from planner.errors import ConfigError
from planner.job import JobSpec
from planner.plan.build import build_plan
from planner.plan.derived import check_identities, loss_weight_of, rank_time_fit
from planner.plan.io import validate_plan
from planner.plan.types import Plan
from tests.planner.plan.test_plan import PROFILES, SLOTS, slot
from torchkit.step.fit import AffineTimeFit

UNCERTAIN = {k: dataclasses.replace(p, time_log_sigma=0.08) for k, p in PROFILES.items()}


def _busy(s, factor):
    return dataclasses.replace(s, speed_factor=factor)


def test_a_derated_rank_curve_is_the_profiles_divided_by_its_speed_factor():
    fit = AffineTimeFit(intercept_s=0.02, s_per_sample=0.001)
    assert rank_time_fit(fit, 1.0) is fit
    half = rank_time_fit(fit, 0.5)
    assert (half.intercept_s, half.s_per_sample) == (0.04, 0.002)
    assert half.predict_s(10) == pytest.approx(fit.predict_s(10) / 0.5)
    with pytest.raises(ConfigError, match="speed_factor must be in"):
        rank_time_fit(fit, 0.0)


def test_a_plan_with_a_busy_gpu_prints_its_point_inside_its_own_range():
    """The shared-node case: three identical cards, one at 90% speed (``cluster_configs/shared-node.yaml``).
    Before the fix the range was computed at full speed for every card: 1.00 (0.97-0.97 expected)."""
    slots = [slot("lab", 0, "k-a100", 28, 48), slot("lab", 1, "k-a100", 28, 48),
             _busy(slot("lab", 2, "k-a100", 14, 48), 0.9)]
    plan = build_plan(JobSpec(model="m"), slots, UNCERTAIN)
    low, high = plan.balance_efficiency_range
    assert low <= plan.balance_efficiency <= high
    assert low < high  # an uncertain estimate gives a range, not a point
    exact = build_plan(JobSpec(model="m"), slots, PROFILES)  # no model error: the range is the point itself
    assert exact.balance_efficiency_range == pytest.approx((exact.balance_efficiency,) * 2)


@pytest.mark.parametrize("factor", [0.9, 0.5, 0.25])
def test_the_allocation_the_rank_entries_and_the_range_read_the_same_derated_curve(factor):
    slots = (*SLOTS[:4], _busy(SLOTS[4], factor))
    plan = build_plan(JobSpec(model="m", global_batch=600), slots, UNCERTAIN)
    busy = plan.ranks[-1]
    assert busy.speed_factor == factor
    profile_time = UNCERTAIN[busy.profile].step_time_s(busy.batch)
    assert busy.predicted_step_time_s == pytest.approx(profile_time / factor, rel=1e-12)
    assert plan.predicted_step_time_s == pytest.approx(max(r.predicted_step_time_s for r in plan.ranks), rel=1e-12)
    low, high = plan.balance_efficiency_range
    assert low <= plan.balance_efficiency <= high
    validate_plan(plan.to_json())


def test_the_loss_weight_is_batch_times_world_size_over_step_batch_in_every_entry():
    plan = build_plan(JobSpec(model="m"), SLOTS, PROFILES)
    assert [r.loss_weight for r in plan.ranks] == [loss_weight_of(r.batch, 5, plan.step_batch) for r in plan.ranks]
    assert sum(r.loss_weight for r in plan.ranks) == pytest.approx(5)


def _edited(plan: Plan, **rank0) -> Plan:
    return plan.replace(ranks=(dataclasses.replace(plan.ranks[0], **rank0), *plan.ranks[1:]))


IDENTITY_BREAKS = {
    "point above its range": (lambda p: p.replace(balance_efficiency_range=(0.5, 0.6), balance_efficiency=0.7),
                               "outside its own expected range"),
    "rank time off its curve": (lambda p: _edited(p, predicted_step_time_s=p.ranks[0].predicted_step_time_s * 1.1),
                                "ranks[0].predicted_step_time_s"),
    "rank time at full speed on a busy card": (lambda p: _edited(p, speed_factor=0.5), "speed_factor 0.5 gives"),
    "loss weight": (lambda p: _edited(p, loss_weight=p.ranks[0].loss_weight + 0.01), "ranks[0].loss_weight"),
    "global batch": (lambda p: p.replace(global_batch=p.global_batch + 1), "global_batch != step_batch × accumulate"),
    "rank numbering": (lambda p: _edited(p, rank=3), "ranks[0].rank is 3, expected 0"),
    "local rank": (lambda p: _edited(p, local_rank=1), "ranks[0].local_rank is 1, expected 0"),
}


@pytest.mark.parametrize("case", sorted(IDENTITY_BREAKS))
def test_a_broken_identity_is_refused_by_construction_reading_and_writing(case, tmp_path):
    edit, message = IDENTITY_BREAKS[case]
    message = re.escape(message)
    broken = edit(build_plan(JobSpec(model="m"), SLOTS, UNCERTAIN))
    with pytest.raises(ConfigError, match=message):
        check_identities(broken)
    with pytest.raises(ConfigError, match=message):
        validate_plan(broken.to_json())
    with pytest.raises(ConfigError, match=message):
        Plan.from_json(broken.to_json())
    from planner.plan.io import write_plan

    with pytest.raises(ConfigError, match=message):
        write_plan(broken, tmp_path / "plan.json")
    assert not (tmp_path / "plan.json").exists()


def test_a_plan_re_balanced_in_the_job_keeps_its_measured_rank_times():
    """``measured`` plans state the times their job measured (``planner.runtime.rebalance_feedback``)."""
    plan = build_plan(JobSpec(model="m"), SLOTS, PROFILES)
    ran = _edited(plan, predicted_step_time_s=plan.ranks[0].predicted_step_time_s * 1.3).with_extra(measured={})
    check_identities(ran)




def test_the_shared_node_plan_prints_its_point_inside_its_own_range(tmp_path):
    """``cluster_configs/shared-node.yaml`` end to end: a card at 90% speed (10% busy) planned beside two idle
    ones of its type. Before the fix the range was the split's efficiency at full speed on every card: 0.9994
    printed with (0.9661-0.9661) expected."""
    from tests.planner.cli_helpers import CONFIGS, TINY_MODEL, assert_ok, parse_json_stdout, run_cli

    result = run_cli("plan", "--no-ray", "--cluster", CONFIGS / "shared-node.yaml", "--no-cache", *TINY_MODEL,
                     "--max-utilization", "1.0", "--json", cwd=tmp_path)
    assert_ok(result)
    plan = parse_json_stdout(result)
    assert sorted(r["speed_factor"] for r in plan["ranks"])[0] < 1  # a busy card is among the ranks
    low, high = plan["balance_efficiency_range"]
    assert low - 1e-12 <= plan["balance_efficiency"] <= high + 1e-12  # one GPU type: a shared σ moves no split
    validate_plan(plan)
