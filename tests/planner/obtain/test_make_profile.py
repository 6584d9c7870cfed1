"""Estimated profiles carry the calibrated time model: its uncertainty, its source, the layout option."""

from __future__ import annotations

import json
import math

import pytest

from planner.codec import convert, encode
from planner.errors import ConfigError
from planner.job import JobSpec
from planner.obtain.make import make_profile
from torchkit.estimate.time_model import DEFAULT_TIME_MODEL_PATH, TIME_MODEL_ENV, load_time_model

TINY = {"model": "tests.planner.tiny_models:convnet", "input_shape": (3, 32, 32), "amp": "fp16"}


@pytest.fixture(scope="module")
def cache() -> dict:
    return {}  # fake passes shared by the tests (they do not depend on the GPU or the time model)


def test_an_estimate_on_a_calibrated_gpu_carries_its_architectures_uncertainty(catalog, cache) -> None:
    profile = make_profile(JobSpec(**TINY), catalog.get("V100-SXM2-16GB"), estimates_cache=cache)
    model = load_time_model()
    assert (
        profile.time_log_sigma == pytest.approx(model.arch_log_sigma["volta"]) and profile.time_log_sigma > 0
    )
    assert "volta" in profile.time_model and "time_model.json" in profile.time_model
    assert not any("step-time calibration" in n for n in profile.notes)


def test_a_gpu_type_without_measured_rows_gets_a_note_and_the_larger_uncertainty(catalog, cache) -> None:
    # issue #32: Ada has rows (MLPerf, compiled), the RTX 4090 none of its own: its architecture's σ and the
    # unseen-type term in quadrature
    profile = make_profile(JobSpec(**TINY), catalog.get("RTX-4090"), estimates_cache=cache)
    model = load_time_model()
    assert profile.time_log_sigma == pytest.approx(
        math.hypot(model.arch_log_sigma["ada"], model.type_log_sigma)
    )
    assert profile.time_log_sigma > model.arch_log_sigma["volta"]
    (note,) = [n for n in profile.notes if "step-time calibration" in n]
    assert note.startswith("RTX-4090: no measured training throughput of this GPU type")
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


def test_a_launch_bound_model_is_probed_near_its_memory_cap_too(catalog, cache) -> None:
    """A tiny MLP's steps at the default probes (32/128/512) all cost the eager-dispatch floor; without a
    probe near the cap the fit was flat and a plan at batch 65536 was priced at that floor."""
    from planner.profiles.profile import MAX_PLANNED_BATCH
    from torchkit.estimate import DEFAULT_PROBE_BATCHES

    job = JobSpec(model="tests.planner.tiny_models:mlp", input_shape=(64,), amp="fp16")
    for gpu_name in ("A100-SXM4-80GB", "T4"):
        profile = make_profile(job, catalog.get(gpu_name), estimates_cache=cache)
        batches = [b for b, _ in profile.time_points]
        assert batches == [*DEFAULT_PROBE_BATCHES, MAX_PLANNED_BATCH], (
            gpu_name
        )  # the cap is the planning bound
        cap_batch, cap_time = profile.time_points[-1]
        assert profile.step_time_s(cap_batch) == pytest.approx(cap_time, rel=0.05)
        assert cap_time > 1.5 * profile.time_points[0][1]  # the floor does not price the cap
        assert profile.time_fit.s_per_sample > 0
    slow, fast = (make_profile(job, catalog.get(g), estimates_cache=cache) for g in ("T4", "A100-SXM4-80GB"))
    assert slow.step_time_s(MAX_PLANNED_BATCH) > 2 * fast.step_time_s(MAX_PLANNED_BATCH)


def test_a_gpu_bound_model_keeps_the_default_probes(catalog, cache) -> None:
    from torchkit.estimate import DEFAULT_PROBE_BATCHES

    profile = make_profile(JobSpec(**TINY), catalog.get("T4"), estimates_cache=cache)
    assert [b for b, _ in profile.time_points] == list(DEFAULT_PROBE_BATCHES)


def test_a_new_estimator_revision_names_new_estimates_but_not_measurements(catalog, monkeypatch) -> None:
    import torchkit.estimate.identity as identity
    from planner.obtain import Method, ProfileRequest, profile_key_inputs

    request = ProfileRequest(job=JobSpec(**TINY), gpu=catalog.get("T4"), method=Method.AUTO)
    before = {m: profile_key_inputs(request, Method(m), ("f", "2.13")) for m in ("estimate", "measure")}
    monkeypatch.setattr(identity, "ESTIMATE_REVISION", "next")
    after = {m: profile_key_inputs(request, Method(m), ("f", "2.13")) for m in ("estimate", "measure")}
    assert after["estimate"] != before["estimate"] and after["estimate"]["time_model"].endswith(
        "estimator-next"
    )
    assert after["measure"] == before["measure"]


def test_an_estimate_carries_the_backward_share_of_its_passes_and_the_plan_overlaps_with_it(
    catalog, cache
) -> None:
    from planner.plan.comm import DEFAULT_BACKWARD_SHARE, backward_share_of
    from planner.profiles.profile import DeviceProfile

    profile = make_profile(JobSpec(**TINY), catalog.get("V100-SXM2-16GB"), estimates_cache=cache)
    assert profile.backward_share is not None and 0.3 < profile.backward_share < 0.9
    assert profile.backward_share != pytest.approx(DEFAULT_BACKWARD_SHARE, abs=1e-3)
    again = convert(DeviceProfile, json.loads(json.dumps(encode(profile))), where="profile")
    assert again.backward_share == profile.backward_share
    other = make_profile(JobSpec(**TINY), catalog.get("T4"), estimates_cache=cache)
    share, source = backward_share_of([profile, other, profile])
    assert share == pytest.approx((profile.backward_share + other.backward_share) / 2)
    assert source.startswith("estimated: the backward pass's kernels' share") and "T4 " in source
    unknown = convert(
        DeviceProfile, {k: v for k, v in encode(profile).items() if k != "backward_share"}, where="profile"
    )
    assert unknown.backward_share is None  # a profile written before the share (a cached one) loads
    assert backward_share_of([unknown]) == (DEFAULT_BACKWARD_SHARE, "assumed: backward ≈ 2× forward FLOPs")
    with pytest.raises(ConfigError, match="backward_share"):
        convert(DeviceProfile, {**encode(profile), "backward_share": 1.5}, where="profile")


def test_a_measured_profiles_backward_share_is_named_measured_in_the_plan(catalog, cache) -> None:
    from planner.plan.comm import backward_share_of
    from planner.profiles.profile import DeviceProfile

    estimated = make_profile(JobSpec(**TINY), catalog.get("T4"), estimates_cache=cache)
    measured = convert(
        DeviceProfile,
        {
            **encode(estimated),
            "gpu": "A100-SXM4-80GB",
            "method": "measure",
            "backward_share": 0.7,
            "time_model": "measured",
        },
        where="profile",
    )
    share, source = backward_share_of([measured])
    assert (
        share == 0.7
        and source.startswith("measured: the backward pass's share")
        and "timed on A100" in source
    )
    share, source = backward_share_of([measured, estimated])
    assert share == pytest.approx((0.7 + estimated.backward_share) / 2)
    assert (
        source.startswith("measured and estimated:") and "T4 " in source and "A100-SXM4-80GB 0.70" in source
    )
