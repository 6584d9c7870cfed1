"""planner.plan.derived: a rank's derated curve read by the allocation, the rank entries and the expected range;
the loss weight and the plan's identities, checked once for the builder, the reader and the writer."""

from __future__ import annotations

import dataclasses
import json
import re
from types import SimpleNamespace

import pytest

from planner.codec import decode_fields, encode
from planner.errors import ConfigError
from planner.job import JobSpec
from planner.plan.build import build_plan
from planner.plan.derived import check_identities, loss_weight_of, rank_time_fit
from planner.plan.io import validate_plan
from planner.plan.sections import MeasuredSection
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
    slots = [
        slot("lab", 0, "k-a100", 28, 48),
        slot("lab", 1, "k-a100", 28, 48),
        _busy(slot("lab", 2, "k-a100", 14, 48), 0.9),
    ]
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
    assert plan.predicted_step_time_s == pytest.approx(
        max(r.predicted_step_time_s for r in plan.ranks), rel=1e-12
    )
    low, high = plan.balance_efficiency_range
    assert low <= plan.balance_efficiency <= high
    validate_plan(encode(plan))


def test_the_loss_weight_is_batch_times_world_size_over_step_batch_in_every_entry():
    plan = build_plan(JobSpec(model="m"), SLOTS, PROFILES)
    assert [r.loss_weight for r in plan.ranks] == [
        loss_weight_of(r.batch, 5, plan.step_batch) for r in plan.ranks
    ]
    assert sum(r.loss_weight for r in plan.ranks) == pytest.approx(5)


def _rank0(**changes):
    return lambda doc: doc["ranks"][0].update(
        {k: v(doc["ranks"][0][k]) if callable(v) else v for k, v in changes.items()}
    )


IDENTITY_BREAKS = {
    "point above its range": (
        lambda d: d.update(balance_efficiency_range=[0.5, 0.6], balance_efficiency=0.7),
        "outside its own expected range",
    ),
    "rank time off its curve": (
        _rank0(predicted_step_time_s=lambda t: t * 1.1),
        "ranks[0].predicted_step_time_s",
    ),
    "rank time at full speed on a busy card": (_rank0(speed_factor=0.5), "speed_factor 0.5 gives"),
    "loss weight": (_rank0(loss_weight=lambda w: w + 0.01), "ranks[0].loss_weight"),
    "global batch": (
        lambda d: d.update(global_batch=d["global_batch"] + 1),
        "global_batch != step_batch × accumulate",
    ),
    "rank numbering": (_rank0(rank=3), "ranks[0].rank is 3, expected 0"),
    "local rank": (_rank0(local_rank=1), "ranks[0].local_rank is 1, expected 0"),
}


@pytest.mark.parametrize("case", sorted(IDENTITY_BREAKS))
def test_a_broken_identity_is_refused_by_construction_reading_and_writing(case, tmp_path):
    edit, message = IDENTITY_BREAKS[case]
    message = re.escape(message)
    plan = build_plan(JobSpec(model="m"), SLOTS, UNCERTAIN)
    document = encode(plan)
    edit(document)
    with pytest.raises(ConfigError, match=message):  # reading constructs the plan, which checks it
        validate_plan(document)
    with pytest.raises(ConfigError, match=message):
        check_identities(SimpleNamespace(**{**plan.__dict__, **validate_plan_fields(document)}))
    from planner.plan.io import write_plan

    with pytest.raises(ConfigError, match=message):
        write_plan(document, tmp_path / "plan.json")
    assert not (tmp_path / "plan.json").exists()


def validate_plan_fields(document: dict) -> dict:
    """The typed fields of a plan document, the plan itself not constructed (so not checked)."""
    return decode_fields(Plan, json.dumps(document), where="plan", fix="", without=())


def test_a_typed_plan_cannot_be_made_with_a_broken_identity():
    plan = build_plan(JobSpec(model="m"), SLOTS, PROFILES)
    with pytest.raises(ConfigError, match=re.escape("global_batch != step_batch × accumulate")):
        plan.replace(global_batch=plan.global_batch + 1)


def test_a_plan_re_balanced_in_the_job_keeps_its_measured_rank_times():
    """``measured`` plans state the times their job measured (``planner.runtime.rebalance_feedback``)."""
    plan = build_plan(JobSpec(model="m"), SLOTS, PROFILES)
    ranks = (
        dataclasses.replace(plan.ranks[0], predicted_step_time_s=plan.ranks[0].predicted_step_time_s * 1.3),
        *plan.ranks[1:],
    )
    with pytest.raises(ConfigError, match=re.escape("ranks[0].predicted_step_time_s")):
        plan.replace(ranks=ranks)
    measured = MeasuredSection(
        source="test",
        created="2026-01-01T00:00:00+00:00",
        steps=1,
        measured_steps=1,
        switches=(),
        steps_to_balance=0,
        batches_first=(),
        batches_last=(),
        max_idle_first=None,
        max_idle_last=None,
        step_time_first_s=None,
        step_time_last_s=None,
        rollbacks=0,
        watch_overhead=None,
        compute_s_last=None,
        sync_wait_s_last=None,
        simulated=None,
        sync=None,
        marks={},
        ranks=(),
        step_times=(),
    )
    assert plan.replace(ranks=ranks, measured=measured).ranks == ranks


def test_the_shared_node_plan_prints_its_point_inside_its_own_range(tmp_path):
    """``cluster_configs/shared-node.yaml`` end to end: a card at 90% speed (10% busy) planned beside two idle
    ones of its type. Before the fix the range was the split's efficiency at full speed on every card: 0.9994
    printed with (0.9661-0.9661) expected."""
    from tests.planner.cli_helpers import CONFIGS, TINY_MODEL, assert_ok, parse_json_stdout, run_cli

    result = run_cli(
        "plan",
        "--no-ray",
        "--cluster",
        CONFIGS / "shared-node.yaml",
        "--no-cache",
        *TINY_MODEL,
        "--max-utilization",
        "1.0",
        "--json",
        cwd=tmp_path,
    )
    assert_ok(result)
    plan = parse_json_stdout(result)
    assert sorted(r["speed_factor"] for r in plan["ranks"])[0] < 1  # a busy card is among the ranks
    low, high = plan["balance_efficiency_range"]
    assert (
        low - 1e-12 <= plan["balance_efficiency"] <= high + 1e-12
    )  # one GPU type: a shared σ moves no split
    validate_plan(plan)
