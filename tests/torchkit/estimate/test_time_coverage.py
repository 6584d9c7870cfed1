"""The step-time model's stated uncertainty is calibrated for coverage (calibration/crossval.py and
bench/calibrate_time.py): about 95% of cross-validated errors within 2σ, an unseen architecture as wide as
its neighbours' errors when each was unseen."""

from __future__ import annotations

import json

import pytest

from torchkit.estimate.calibration.crossval import coverage_scale, within
from torchkit.estimate.time_model import DEFAULT_TIME_MODEL_PATH, load_time_model
from torchkit.hardware.catalog import load_catalog


def test_within_counts_errors_inside_k_sigma_of_their_own_sigma() -> None:
    assert within([0.1, -0.3, 0.05], [0.1, 0.1, 0.01]) == pytest.approx(1 / 3)
    assert within([], []) == 1.0


def test_coverage_scale_widens_sigma_until_the_target_share_is_covered() -> None:
    errors = [0.01 * i for i in range(1, 21)]  # 0.01 .. 0.20
    sigmas = [0.05] * 20
    scale = coverage_scale(errors, sigmas, target=0.95)
    assert within(errors, [scale * s for s in sigmas]) >= 0.95
    assert within(errors, [0.99 * scale * s for s in sigmas]) < 0.95  # the smallest such factor
    assert scale == pytest.approx(0.19 / 0.10)
    assert coverage_scale([0.01, -0.02], [0.05, 0.05]) == 1.0  # never narrows an RMS


def test_the_shipped_calibration_covers_its_cross_validated_errors() -> None:
    doc = json.loads(DEFAULT_TIME_MODEL_PATH.read_text())
    assert doc["fit"]["leave_one_out_within_2_sigma"] >= 0.95
    assert doc["fit"]["held_out_within_2_sigma"] >= 0.90
    model = load_time_model()
    assert model.unseen_log_sigma >= max(model.arch_log_sigma.values())
    hopper = model.uncertainty_for(load_catalog().get("H100-SXM5-80GB"))
    assert not hopper.calibrated_arch and hopper.log_sigma == model.unseen_log_sigma
