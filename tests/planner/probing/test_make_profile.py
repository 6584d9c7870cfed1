"""Estimated profiles carry the calibrated time model: its uncertainty, its source, the layout option."""

from __future__ import annotations

import json
import math

import pytest

from planner.job import JobSpec
from planner.probing.make_profile import make_profile
from torchkit.estimate.time_model import DEFAULT_TIME_MODEL_PATH, TIME_MODEL_ENV, load_time_model
from torchkit.hardware.catalog import load_catalog

TINY = {"model": "tests.planner.tiny_models:convnet", "input_shape": (3, 32, 32), "amp": "fp16"}


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


@pytest.fixture(scope="module")
def cache() -> dict:
    return {}  # fake passes shared by the tests (they do not depend on the GPU or the time model)


def test_an_estimate_on_a_calibrated_gpu_carries_its_architectures_uncertainty(catalog, cache) -> None:
    profile = make_profile(JobSpec(**TINY), catalog.get("V100-SXM2-16GB"), estimates_cache=cache)
    model = load_time_model()
    assert profile.time_log_sigma == pytest.approx(model.arch_log_sigma["volta"]) and profile.time_log_sigma > 0
    assert "volta" in profile.time_model and "time_model.json" in profile.time_model
    assert not any("step-time calibration" in n for n in profile.notes)


def test_a_gpu_type_without_measured_rows_gets_a_note_and_the_larger_uncertainty(catalog, cache) -> None:
    profile = make_profile(JobSpec(**TINY), catalog.get("H100-SXM5-80GB"), estimates_cache=cache)
    assert profile.time_log_sigma == pytest.approx(load_time_model().unseen_log_sigma)
    (note,) = [n for n in profile.notes if "step-time calibration" in n]
    assert note.startswith("H100-SXM5-80GB: no measured training throughput of this GPU type")
    assert f"±{math.exp(profile.time_log_sigma) - 1:.0%}" in note


def test_channels_last_makes_16_bit_convolutions_faster(catalog, cache) -> None:
    gpu = catalog.get("RTX-3090")
    nchw = make_profile(JobSpec(**TINY), gpu, estimates_cache=cache)
    nhwc = make_profile(JobSpec(**TINY, channels_last=True), gpu, estimates_cache=cache)
    assert nhwc.time_points[-1][1] < nchw.time_points[-1][1]
    assert nhwc.memory_points == nchw.memory_points


def test_the_step_time_follows_the_calibration_file(tmp_path, monkeypatch, catalog, cache) -> None:
    gpu = catalog.get("V100-SXM2-16GB")
    before = make_profile(JobSpec(**TINY), gpu, estimates_cache=cache)
    doc = json.loads(DEFAULT_TIME_MODEL_PATH.read_text())
    doc["arch"]["volta"]["constants"]["bandwidth_efficiency"]["value"] /= 2
    slower = tmp_path / "time_model.json"
    slower.write_text(json.dumps(doc))
    monkeypatch.setenv(TIME_MODEL_ENV, str(slower))
    after = make_profile(JobSpec(**TINY), gpu, estimates_cache=cache)
    assert after.time_points[-1][1] > before.time_points[-1][1]
    assert str(slower) in after.time_model
