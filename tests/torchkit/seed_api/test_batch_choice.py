"""torchkit.seed_api.batch_choice: the seed's decision rules (every row of shared/reference/ultralytics-behaviour.md §1.4), ours, and where it differs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from torchkit.seed_api.batch_choice import choose_batch, probe_list
from torchkit.units import GIB

PROBES = [1, 2, 4, 8, 16]
PROBES_LARGE = [1, 2, 4, 8, 16, 32, 64]
T4_ISSUE_4679 = [0.654, 0.757, 1.223, 2.208, 4.154]  # ultralytics#4679 probe figures, GiB
FLAT_YOLOV5_9287 = [2.816, 2.852, 2.842, 2.772, 2.741]  # yolov5#9287 probe figures, GiB
NO_USABLE = r"AutoBatch: no usable batch size found while profiling batch=\[1, 2, 4, 8, 16\]\. See the errors"


def affine_gib(batch: int) -> float:
    """Made-up curve of §1.4's ceiling rows: fits give 22 at 60 % of 14.5 G; 8 uses 23 % of 14.75 G."""
    return 0.46 + 0.366 * batch


def choose(batches, mems_gib, total_gib, available_gib, **options):
    return choose_batch(
        batches,
        [None if m is None else m * GIB for m in mems_gib],
        total_bytes=int(total_gib * GIB),
        available_bytes=int(available_gib * GIB),
        **options,
    )


# ----------------------------------------------------------------------------------------------------------
# seed-linear: every row of shared/reference/ultralytics-behaviour.md §1.4 "Verified behaviour" (ultralytics 8.4.190)
# Where the table does not give an input (driver-free memory, the made-up curves), the chosen value is stated.
# ----------------------------------------------------------------------------------------------------------


def test_seed_linear_t4_issue_4679_figures_give_35_at_59_percent():
    # t=14.75, driver-free 14.5 G with nothing reserved (the table's assumption)
    choice = choose(PROBES, T4_ISSUE_4679, 14.75, 14.5, fit="seed-linear")
    assert (choice.batch, round(choice.predicted_fraction_of_total * 100)) == (35, 59)
    assert choice.limited_by == "budget"


def test_seed_linear_24_gib_seven_probes_gives_235():
    # the table gives only "[0.285 ... 4.1]": #1451's five figures, 32 -> 2.2 G (assumed), 64 -> 4.1 G, on
    # #1451's 23.99 G card with all of it available
    mems = [0.285, 0.445, 0.470, 0.719, 1.197, 2.2, 4.1]
    assert choose(PROBES_LARGE, mems, 23.99, 23.99, fit="seed-linear").batch == 235


def test_seed_linear_flat_curve_keeps_probes_1_and_2_slope_0036_gives_53():
    # t=7.92, r=2.53; driver-free 5.32 G assumed (any available memory in [7.82, 7.87) G gives 53)
    choice = choose(PROBES, FLAT_YOLOV5_9287, 7.92, 2.53 + 5.32, fit="seed-linear")
    assert [b for b, _ in choice.used_points] == [1, 2]
    assert choice.memory_fit.bytes_per_sample / GIB == pytest.approx(0.036)
    assert choice.batch == 53


def test_seed_linear_oom_at_16_with_fit_22_drops_to_8_at_23_percent():
    choice = choose(PROBES, [*map(affine_gib, [1, 2, 4, 8]), None], 14.75, 14.5, fit="seed-linear")
    unclamped = (0.6 * 14.5 - choice.memory_fit.intercept_bytes / GIB) / (
        choice.memory_fit.bytes_per_sample / GIB
    )
    assert int(unclamped) == 22
    assert (choice.batch, round(choice.predicted_fraction_of_total * 100)) == (8, 23)
    assert (choice.oom_ceiling, choice.limited_by) == (16, "oom-ceiling")


def test_seed_linear_oom_at_8_and_16_gives_5():
    # made-up curve 1.5 + 1.4·b G: the fit over 1, 2, 4 gives 5, below the ceiling at 8
    choice = choose(PROBES, [2.9, 4.3, 7.1, None, None], 14.75, 14.5, fit="seed-linear")
    assert (choice.batch, choice.oom_ceiling, choice.limited_by) == (5, 8, "budget")


def test_seed_linear_failed_batch_1_is_ignored_gives_22():
    choice = choose(PROBES, [None, *map(affine_gib, [2, 4, 8, 16])], 14.75, 14.5, fit="seed-linear")
    assert (choice.batch, choice.oom_ceiling) == (22, None)


def test_seed_linear_all_probes_failed_raises_the_seeds_runtime_error():
    with pytest.raises(RuntimeError, match=NO_USABLE):
        choose(PROBES, [None] * 5, 14.75, 14.5, fit="seed-linear")


def test_seed_linear_single_point_minimum_norm_fit_gives_17_then_ceiling_1():
    # one valid point (1, 0.5 G): numpy's minimum-norm line [0.25, 0.25]; 7.6 G available -> 17 -> ceiling -> 1
    choice = choose(PROBES, [0.5, None, None, None, None], 8.0, 7.6, fit="seed-linear")
    slope, intercept = choice.memory_fit.bytes_per_sample / GIB, choice.memory_fit.intercept_bytes / GIB
    assert (slope, intercept) == pytest.approx((0.25, 0.25))
    assert int((7.6 * 0.6 - intercept) / slope) == 17
    assert (choice.batch, choice.limited_by) == (1, "oom-ceiling")


def test_seed_linear_tiny_model_on_80_gib_clamps_to_1024_at_13_percent():
    mems = [0.2 + 0.01 * b for b in PROBES_LARGE]  # made up: fit gives 4750
    choice = choose(PROBES_LARGE, mems, 80, 79.5, fit="seed-linear")
    assert (choice.batch, round(choice.predicted_fraction_of_total * 100)) == (1024, 13)
    assert choice.limited_by == "max-batch"


def test_seed_linear_fraction_09_dataset_10_probes_to_8_and_clamps_to_10():
    batches = probe_list(int(14.75 * GIB), dataset_size=10)
    assert batches == [1, 2, 4, 8]
    choice = choose(batches, T4_ISSUE_4679[:4], 14.75, 14.5, fit="seed-linear", fraction=0.9, dataset_size=10)
    assert (choice.batch, choice.limited_by) == (10, "dataset-size")


def test_seed_linear_probe_above_total_is_dropped_but_is_no_ceiling():
    mems = [0.3, 0.5, 0.9, 1.7, 7.9]  # 7.9 >= 7.79 total
    choice = choose(PROBES, mems, 7.79, 7.5, fit="seed-linear")
    assert [d.batch for d in choice.dropped] == [16]
    assert choice.oom_ceiling is None and choice.batch == 21  # above 16: no ceiling applied
    failed = choose(PROBES, [*mems[:4], None], 7.79, 7.5, fit="seed-linear")
    assert failed.batch == 8  # the same probe as a failure would have been a ceiling


def test_seed_linear_keep_rule_compares_with_the_previous_raw_result():
    # 4 -> 2.0 is below 2 -> 3.0 (dropped); 8 -> 2.5 is above the raw 2.0 before it, so it is kept
    choice = choose([1, 2, 4, 8], [1.0, 3.0, 2.0, 2.5], 14.75, 14.5, fit="seed-linear")
    assert [b for b, _ in choice.used_points] == [1, 2, 8]


def test_probe_list_depends_on_16_gib_and_dataset_size():
    assert probe_list(15 * GIB) == PROBES
    assert probe_list(16 * GIB) == PROBES_LARGE
    assert probe_list(80 * GIB, dataset_size=20) == [1, 2, 4, 8, 16]


# ----------------------------------------------------------------------------------------------------------
# seed-loglog: ultralytics 8.3.51 (shared/reference/ultralytics-behaviour.md §1.5; the seed article)
# ----------------------------------------------------------------------------------------------------------


def test_seed_loglog_rounds_the_log_log_solution():
    choice = choose(PROBES, T4_ISSUE_4679, 14.75, 14.5, fit="seed-loglog")
    p = np.polyfit(np.log(PROBES), np.log(T4_ISSUE_4679), 1)
    assert choice.batch == int(round(math.exp((math.log(14.5 * 0.6) - p[1]) / p[0]))) == 56


def test_seed_loglog_failed_batch_1_forces_batch_1():
    # results.index(None) finds the failure below the first success: the bug PR #26224 fixed
    choice = choose(PROBES, [None, *map(affine_gib, [2, 4, 8, 16])], 14.75, 14.5, fit="seed-loglog")
    assert (choice.batch, choice.oom_ceiling) == (1, 1)


def test_seed_loglog_outside_1_1024_falls_back_to_default():
    choice = choose(PROBES, FLAT_YOLOV5_9287, 7.92, 7.85, fit="seed-loglog")
    assert (choice.batch, choice.limited_by) == (16, "default")
    assert choice.warnings[0].endswith("outside safe range, using default batch-size 16.")


def test_seed_loglog_with_no_point_silently_used_16():
    # the 8.3.51 behaviour PR #25739 replaced by a RuntimeError
    choice = choose(PROBES, [None] * 5, 14.75, 14.5, fit="seed-loglog", default_batch=16)
    assert choice.batch == 16
    assert choice.warnings == (
        "error detected: expected non-empty vector for x,  using default batch-size 16.",
    )


def test_seed_rules_refuse_options_the_seed_never_had():
    with pytest.raises(ValueError, match="multiple_of"):
        choose(PROBES, T4_ISSUE_4679, 14.75, 14.5, fit="seed-linear", multiple_of=8)
    with pytest.raises(ValueError, match="dataset_size"):
        choose(PROBES, T4_ISSUE_4679, 14.75, 14.5, fit="seed-loglog", dataset_size=10)


# ----------------------------------------------------------------------------------------------------------
# ours: the same rows, and where (and why) the answer differs
# ----------------------------------------------------------------------------------------------------------


def test_ours_matches_seed_linear_where_the_curve_is_clean():
    for batches, mems, total, available, expected in [
        (PROBES, T4_ISSUE_4679, 14.75, 14.5, 35),
        (PROBES_LARGE, [0.285, 0.445, 0.470, 0.719, 1.197, 2.2, 4.1], 23.99, 23.99, 235),
        (PROBES, [2.9, 4.3, 7.1, None, None], 14.75, 14.5, 5),
        (PROBES, [None, *map(affine_gib, [2, 4, 8, 16])], 14.75, 14.5, 22),
    ]:
        assert choose(batches, mems, total, available).batch == expected


def test_ours_reports_points_off_the_affine_fit_as_outliers():
    choice = choose(PROBES, T4_ISSUE_4679, 14.75, 14.5)
    assert [o.batch for o in choice.outliers] == [1]  # 0.654 G at batch 1: 14 % above the line
    assert choice.outliers[0].reason.startswith("14% off the fit")


def test_ours_flat_curve_stops_at_the_largest_batch_that_ran_not_53():
    # yolov5#9287: the seed extrapolates probes 1-2 to 53 on an 8 GB card; the user trained 16 fine
    choice = choose(PROBES, FLAT_YOLOV5_9287, 7.92, 7.85)
    assert (choice.batch, choice.limited_by) == (16, "largest-probe")
    assert "memory did not grow at batch [4, 8, 16]" in choice.warnings[0]
    assert "the fit said 53" in choice.warnings[0]


def test_ours_oom_ceiling_uses_the_chord_instead_of_the_previous_probe():
    # fit says 22 but 16 ran out of memory: chord from (8, 3.388 G) to (16, 14.5 G) -> 11, not 8
    choice = choose(PROBES, [*map(affine_gib, [1, 2, 4, 8]), None], 14.75, 14.5)
    slope = (14.5 - affine_gib(8)) / 8
    assert choice.batch == 8 + math.floor((0.6 * 14.5 - affine_gib(8)) / slope) == 11
    assert (choice.oom_ceiling, choice.limited_by) == (16, "oom-ceiling")
    assert choice.predicted_bytes / GIB == pytest.approx(affine_gib(8) + 3 * slope, rel=1e-6)
    assert choice.warnings[0].startswith("batch 16 ran out of memory although the fit predicts 6.32G")


def test_ours_single_point_is_proportional_not_minimum_norm():
    choice = choose([1, 2], [0.5, None], 8.0, 7.6)
    assert choice.memory_fit.intercept_bytes == 0.0
    assert choice.memory_fit.bytes_per_sample / GIB == pytest.approx(0.5)
    assert choice.batch == 1  # the chord (1, 0.5 G) -> (2, 7.6 G) stays below 2


def test_ours_single_point_without_failure_extrapolates_proportionally():
    choice = choose([4], [2.0], 16.0, 15.0)
    assert choice.batch == int(0.6 * 15.0 / 0.5)  # 0.5 G per sample, no intercept


def test_ours_all_failed_raises_the_seeds_runtime_error():
    with pytest.raises(RuntimeError, match=NO_USABLE):
        choose(PROBES, [None] * 5, 14.75, 14.5)


def test_ours_probe_above_total_is_dropped_and_not_a_ceiling():
    choice = choose(PROBES, [0.3, 0.5, 0.9, 1.7, 7.9], 7.79, 7.5)
    assert choice.oom_ceiling is None and choice.batch == 21
    assert choice.dropped[0].reason == "peak 7.90G >= device total 7.79G"


def test_ours_clamps_to_1024_and_to_the_dataset():
    tiny = [0.2 + 0.01 * b for b in PROBES_LARGE]
    assert choose(PROBES_LARGE, tiny, 80, 79.5).batch == 1024
    assert choose(PROBES_LARGE, tiny, 80, 79.5, max_batch=8192).batch == 4750
    clamped = choose([1, 2, 4, 8], T4_ISSUE_4679[:4], 14.75, 14.5, fraction=0.9, dataset_size=10)
    assert (clamped.batch, clamped.limited_by) == (10, "dataset-size")


def test_ours_rounds_down_to_multiple_of():
    assert choose(PROBES, T4_ISSUE_4679, 14.75, 14.5, multiple_of=8).batch == 32
    with pytest.raises(RuntimeError, match="no batch that is a multiple of 8 fits"):
        choose(PROBES, [2.9, 4.3, 7.1, None, None], 14.75, 14.5, multiple_of=8)


def test_ours_smallest_batch_over_budget_is_used_with_a_warning():
    choice = choose([2, 4, 8], [5.0, 9.0, None], 14.75, 7.0)  # budget 4.2 G < 5.0 G at batch 2
    assert (choice.batch, choice.limited_by) == (2, "first-fit")
    assert "needs 5.00G, over the 4.20G budget" in choice.warnings[-1]


def test_ours_loglog_uses_the_log_log_curve_with_our_guard_rails():
    choice = choose(PROBES, T4_ISSUE_4679, 14.75, 14.5, fit="loglog")
    assert choice.memory_fit.kind == "loglog"
    assert choice.batch == 56  # the curve, not the rules, makes log-log pick 56 where affine picks 35


def test_choose_batch_checks_its_arguments():
    with pytest.raises(ValueError, match="strictly increasing"):
        choose([2, 1], [1.0, 2.0], 8, 8)
    with pytest.raises(ValueError, match="fraction"):
        choose([1], [1.0], 8, 8, fraction=1.5)
    with pytest.raises(ValueError, match="unknown fit"):
        choose([1], [1.0], 8, 8, fit="cubic")
    with pytest.raises(ValueError, match="2 probe batches but 1"):
        choose_batch([1, 2], [1.0], total_bytes=GIB, available_bytes=GIB)
