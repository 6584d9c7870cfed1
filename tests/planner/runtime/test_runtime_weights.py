"""planner.runtime.weights: the per-rank loss weight b_i·W/B and its checks (pure Python)."""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.errors import ConfigError
from planner.runtime.weights import loss_weight, loss_weights, sum_loss_scale


def test_loss_weight_is_batch_times_world_size_over_step_batch():
    assert loss_weight(5, 3, 16) == pytest.approx(15 / 16)
    assert loss_weight(3, 3, 16) == pytest.approx(9 / 16)
    assert loss_weight(8, 3, 16) == pytest.approx(24 / 16)


def test_equal_batches_give_weight_one():
    assert loss_weights([4, 4, 4, 4]) == (1.0, 1.0, 1.0, 1.0)


def test_single_rank_holding_the_whole_step_has_weight_one():
    assert loss_weight(16, 1, 16) == 1.0


def test_numpy_integers_are_accepted():
    assert loss_weight(np.int64(5), np.int32(3), np.int64(16)) == pytest.approx(15 / 16)


@given(st.lists(st.integers(min_value=1, max_value=10_000), min_size=1, max_size=64))
def test_weights_sum_to_world_size_and_make_each_sample_count_one_over_step_batch(batches):
    weights = loss_weights(batches)
    world_size, step_batch = len(batches), sum(batches)
    assert sum(weights) == pytest.approx(world_size, rel=1e-12)
    # a sample on rank i enters DDP's average with weight w_i / (W · b_i); it must be 1/B for every rank
    for weight, batch in zip(weights, batches, strict=True):
        assert weight / (world_size * batch) == pytest.approx(1 / step_batch, rel=1e-12)


@given(st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=8))
def test_weighted_average_of_rank_means_is_the_global_mean_exactly(batches):
    # exact rational arithmetic: DDP's (1/W) Σ w_i · mean_i equals the mean over all samples
    values = [[Fraction(7 * i + s, 3) for s in range(b)] for i, b in enumerate(batches)]
    weights = [Fraction(b * len(batches), sum(batches)) for b in batches]
    assert weights == [Fraction(w).limit_denominator(10**9) for w in loss_weights(batches)]
    ddp_average = sum(w * sum(v) / len(v) for w, v in zip(weights, values, strict=True)) / len(batches)
    everything = [x for v in values for x in v]
    assert ddp_average == sum(everything) / len(everything)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 3, 16), "rank_batch must be a positive integer, got 0"),
        ((-2, 3, 16), "rank_batch must be a positive integer, got -2"),
        ((5, 0, 16), "world_size must be a positive integer, got 0"),
        ((5, 3, 0), "step_batch must be a positive integer, got 0"),
        ((5.0, 3, 16), r"rank_batch must be a positive integer, got 5\.0"),
        ((True, 3, 16), "rank_batch must be a positive integer, got True"),
        ((17, 3, 16), r"rank_batch=17 does not fit in step_batch=16 with 2 other rank\(s\).*rank_batch ≤ 14"),
        ((15, 3, 16), r"rank_batch=15 does not fit in step_batch=16"),
        ((1, 4, 3), "step_batch=3 is smaller than world_size=4"),
    ],
)
def test_invalid_inputs_raise_config_error_naming_the_argument(args, message):
    with pytest.raises(ConfigError, match=message):
        loss_weight(*args)


def test_rank_batch_equal_to_step_batch_minus_other_ranks_is_allowed():
    assert loss_weight(14, 3, 16) == pytest.approx(42 / 16)


def test_loss_weights_rejects_empty_and_non_positive_batches():
    with pytest.raises(ConfigError, match="batches is empty"):
        loss_weights([])
    with pytest.raises(ConfigError, match=r"batches\[1\] must be a positive integer, got 0"):
        loss_weights([5, 0, 8])


def test_sum_loss_scale_is_world_size_over_global_count():
    assert sum_loss_scale(3, 16) == pytest.approx(3 / 16)
    assert sum_loss_scale(4, 1000) == pytest.approx(0.004)
    with pytest.raises(ConfigError, match="global_count must be a positive integer, got 0"):
        sum_loss_scale(3, 0)


def test_importing_planner_runtime_and_its_torch_free_helpers_does_not_import_torch():
    code = (
        "import sys\n"
        "import planner.runtime\n"
        "from planner.runtime import loss_weight, load_rank_plan, RankPlan\n"
        "assert loss_weight(5, 3, 16) == 0.9375\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_planner_runtime_exports_resolve_and_unknown_names_raise():
    import planner.runtime as runtime

    for name in runtime.__all__:
        assert getattr(runtime, name) is not None
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        runtime.nope  # noqa: B018


# ------------------------------------------------------------------ the loss rule (LossReduction, LossRule)


def test_only_a_mean_over_the_rank_s_samples_takes_the_weight():
    from planner.runtime.weights import LossReduction, LossRule

    mean = LossRule(reduction=LossReduction.MEAN, why="torch's default")
    assert mean.factor(5, 3, 16) == loss_weight(5, 3, 16)
    for reduction in (LossReduction.SUM, LossReduction.GLOBAL_MEAN):
        assert LossRule(reduction=reduction, why="normalised already").factor(5, 3, 16) == 1.0


@given(st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=8))
def test_each_rule_applied_to_its_own_reduction_gives_every_sample_the_same_weight(batches):
    # the gradient weight of one sample on rank i after DDP's 1/W average: factor_i × (1/b_i for a mean, 1 for a
    # sum, 1/T·W for a global mean) / W; the same for every rank exactly when the rule fits the reduction
    from planner.runtime.weights import LossReduction, LossRule

    world_size, step_batch = len(batches), sum(batches)
    per_sample = {
        LossReduction.MEAN: lambda b: Fraction(1, b),
        LossReduction.SUM: lambda b: Fraction(1),
        LossReduction.GLOBAL_MEAN: lambda b: Fraction(world_size, step_batch),
    }
    for reduction, own in per_sample.items():
        rule = LossRule(reduction=reduction, why="test")
        weights = {
            Fraction(rule.factor(b, world_size, step_batch)).limit_denominator(10**9) * own(b) / world_size
            for b in batches
        }
        assert len(weights) == 1
    if len(set(batches)) > 1:  # the other rule on a mean: samples of small ranks count more
        wrong = LossRule(reduction=LossReduction.SUM, why="test")
        assert len({Fraction(wrong.factor(b, world_size, step_batch)) * Fraction(1, b) for b in batches}) > 1


def test_reduction_names_parse_and_a_wrong_one_lists_the_choices():
    from planner.runtime.weights import LossReduction

    assert LossReduction.parse("global-mean") is LossReduction.GLOBAL_MEAN
    assert f"{LossReduction.GLOBAL_MEAN}" == str(LossReduction.GLOBAL_MEAN) == "global-mean"
    assert LossReduction.parse(LossReduction.SUM) is LossReduction.SUM
    with pytest.raises(
        ConfigError, match=r"loss_reduction='avg' is not a loss reduction \(choose 'mean', 'sum', "
    ):
        LossReduction.parse("avg")


def test_the_rule_line_says_what_was_applied_and_why():
    from planner.runtime.weights import LossReduction, LossRule

    line = LossRule(
        reduction=LossReduction.GLOBAL_MEAN, why="the Trainer sums the count over all ranks"
    ).line()
    assert line == (
        "loss rule global-mean (decided): no per-rank weight; divided by a count over all ranks: "
        "the Trainer sums the count over all ranks"
    )
    assert "(declared)" in LossRule(reduction=LossReduction.MEAN, why="x", declared=True).line()
