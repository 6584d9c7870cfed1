"""The step-time model's stated uncertainty is calibrated for coverage (calibration/crossval.py and
bench/calibrate_time.py): about 95% of cross-validated errors within 2σ, an unseen architecture as wide as
its neighbours' errors when each was unseen."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
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
    catalog = load_catalog()
    hopper = model.uncertainty_for(catalog.get("H100-SXM5-80GB"))
    eager_archs = [a for a, n in model.arch_eager_rows.items() if n]
    assert hopper.calibrated_arch and model.arch_eager_rows["hopper"] == 0
    # seen only per GPU of an MLPerf run: at least as wide as any architecture calibrated on eager rows
    assert hopper.log_sigma >= max(model.arch_log_sigma[a] for a in eager_archs)
    assert hopper.log_sigma == pytest.approx(doc["gpus"]["H100-SXM5-80GB"]["log_sigma"])
    unseen = model.uncertainty_for(dataclasses.replace(catalog.get("T4"), name="X", compute_capability="6.1"))
    assert not unseen.calibrated_arch and unseen.log_sigma == model.unseen_log_sigma


def test_stated_sigmas_follow_their_scenarios_and_cover_95_percent() -> None:
    """Each scenario's σ is its cross-validated RMS (the worst architecture where rows share a bias), a type
    without rows adds the type term in quadrature, and one factor makes 95% of all errors lie within 2σ."""
    from torchkit.estimate.calibration.crossval import CrossValidation
    from torchkit.estimate.calibration.fit import Observation
    from torchkit.estimate.calibration.uncertainty import stated_sigmas

    def obs(i: str, arch: str, stack: str = "pytorch-eager") -> Observation:
        return Observation(
            id=i,
            table=None,
            gpu=None,
            arch=arch,
            batch=1,
            channels_last=False,  # type: ignore[arg-type]
            samples_per_s=1.0,
            stack=stack,
        )

    fit_obs = [
        obs("v1", "volta"),
        obs("v2", "volta"),
        obs("a1", "ampere-ga100"),
        obs("a2", "ampere-ga100"),
        obs("m1", "ampere-ga100", "mlperf-mxnet"),
        obs("h1", "hopper", "mlperf-mxnet"),
    ]
    cv = CrossValidation(
        loo={"v1": 0.1, "v2": -0.1, "a1": 0.2, "a2": -0.2, "m1": 0.5},
        type={"a1": 0.3, "a2": -0.3},
        transfer={"a1": 0.4, "a2": 0.4},
        unseen={"v1": 0.3, "v2": 0.3, "a1": -0.6, "a2": -0.6},
    )
    s = stated_sigmas(cv, fit_obs)
    assert s.raw == pytest.approx(
        {"arch:volta": 0.1, "arch:ampere-ga100": 0.2, "transfer": 0.4, "type": 0.3, "unseen": 0.6}
    )
    assert s.coverage_factor == 1.0  # every error is within 2σ of its scenario's RMS already
    assert s.for_gpu("volta", gpu_eager_rows=True, gpu_rows=True, arch_rows=True) == pytest.approx(0.1)
    assert s.for_gpu("volta", gpu_eager_rows=False, gpu_rows=True, arch_rows=True) == pytest.approx(
        np.hypot(0.1, 0.3)
    )
    assert s.for_gpu("hopper", gpu_eager_rows=False, gpu_rows=True, arch_rows=True) == pytest.approx(0.4)
    assert s.for_gpu("hopper", gpu_eager_rows=False, gpu_rows=False, arch_rows=True) == pytest.approx(0.5)
    assert s.for_gpu("pascal", gpu_eager_rows=False, gpu_rows=False, arch_rows=False) == pytest.approx(0.6)
    # nine small errors and one 3σ outlier: their RMS covers 90%, so every σ widens until 95% are covered
    ten = [obs(f"v{i}", "volta") for i in range(10)]
    heavy = CrossValidation(
        loo={o.id: (0.5 if o.id == "v0" else 0.01) for o in ten}, type={}, transfer={}, unseen={}
    )
    s = stated_sigmas(heavy, ten)
    assert s.coverage_factor > 1.0
    assert 2 * s.arch_eager["volta"] + 1e-12 >= 0.5
