"""planner.obtain.verify and ``obtain_profile(verify=True)``: a cached profile held against a fresh estimate
of the same job and GPU type; one outside the estimator's range is refused with both figures and made again."""

from __future__ import annotations

import math

import pytest

from planner.job import Method
from planner.obtain import ProfileOrigin, obtain_profile, planned_key, profile_key_inputs
from planner.obtain.verify import (
    COVERAGE_SIGMAS,
    MEASURED_MEMORY_FACTOR,
    REDERIVED_TOLERANCE,
    compare_with_estimate,
)
from planner.profiles.cache import ProfileCache
from planner.profiles.measured import MEASURED_METHOD, measured_key_inputs, measured_profile_key
from planner.profiles.profile import DeviceProfile
from tests.planner.obtain.test_lookup import IDENTITY, JOB, request

#: the estimator's log-sigma on a T4 (an uncalibrated architecture) at the time of writing; the test builds
#: its own profiles with it, so the figure only sets the scale
T4_LOG_SIGMA = 0.24


def profile(method: str, *, time_scale: float = 1.0, memory_scale: float = 1.0) -> DeviceProfile:
    return DeviceProfile.from_points(
        gpu="T4",
        method=method,
        amp="fp16",
        memory_points=[(8, int(memory_scale * 2**30)), (16, int(memory_scale * 2**31))],
        time_points=[(8, time_scale * 0.08), (16, time_scale * 0.16)],
        time_log_sigma=T4_LOG_SIGMA if method == "estimate" else 0.0,
    )


def test_an_estimate_repeated_agrees_and_one_off_by_more_than_float_noise_does_not():
    fresh = profile("estimate")
    assert compare_with_estimate(profile("estimate"), fresh).agrees
    assert compare_with_estimate(profile("estimate", time_scale=1 + REDERIVED_TOLERANCE / 2), fresh).agrees
    off = compare_with_estimate(profile("estimate", time_scale=1.1), fresh)
    assert not off.agrees and off.time_factor == pytest.approx(1.1)


def test_a_measured_profile_is_held_to_the_estimators_stated_range():
    fresh = profile("estimate")
    allowed = math.exp(COVERAGE_SIGMAS * T4_LOG_SIGMA)  # 1.62 on a T4
    within = compare_with_estimate(profile("measure", time_scale=allowed * 0.95), fresh)
    assert within.agrees and within.allowed_time_factor == pytest.approx(allowed)
    assert not compare_with_estimate(profile("measure", time_scale=allowed * 1.05), fresh).agrees
    assert not compare_with_estimate(profile(MEASURED_METHOD, time_scale=1 / 5), fresh).agrees  # 5× too fast
    assert compare_with_estimate(profile("measure", memory_scale=MEASURED_MEMORY_FACTOR * 0.9), fresh).agrees
    assert not compare_with_estimate(profile("measure", memory_scale=5.0), fresh).agrees


def test_the_comparison_states_both_figures_at_the_largest_probed_batch():
    text = compare_with_estimate(profile("estimate", time_scale=5.0), profile("estimate")).describe()
    assert "step time at batch 16 800 ms cached vs 160 ms estimated now (×5.00, allowed ×1.02)" in text
    assert "memory at batch 16 2048 MiB cached vs 2048 MiB" in text


class EstimateMaker:
    """A ``make`` that estimates (answers ``profile('estimate')``) and records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[Method] = []

    def __call__(self, req) -> DeviceProfile:
        self.asked.append(Method(req.method))
        return profile("estimate")


@pytest.fixture
def cache(tmp_path) -> ProfileCache:
    return ProfileCache(tmp_path / "profiles")


def _file_estimate(cache: ProfileCache, entry: DeviceProfile) -> str:
    inputs = profile_key_inputs(request(Method.ESTIMATE), Method.ESTIMATE, IDENTITY)
    key = planned_key(request(Method.ESTIMATE), IDENTITY)
    cache.put(key, entry, inputs=inputs)
    return key


def test_a_forged_estimate_5x_slow_is_refused_with_both_figures_and_replaced(cache):
    key = _file_estimate(cache, profile("estimate", time_scale=5.0))
    trusted = obtain_profile(request(Method.ESTIMATE), EstimateMaker(), cache=cache, identity=IDENTITY)
    assert trusted.origin is ProfileOrigin.CACHED and trusted.profile.step_time_s(16) == pytest.approx(0.8)

    make = EstimateMaker()
    result = obtain_profile(request(Method.ESTIMATE), make, cache=cache, identity=IDENTITY, verify=True)
    assert result.origin is ProfileOrigin.MADE and make.asked == [
        Method.ESTIMATE
    ]  # one estimate: check and answer
    assert result.profile.step_time_s(16) == pytest.approx(0.16)
    [problem] = cache.problems
    assert str(cache.path_for(key)) in problem and "800 ms cached vs 160 ms estimated now" in problem
    assert cache.get(key).step_time_s(16) == pytest.approx(0.16)  # rewritten


def test_an_agreeing_entry_is_used_and_the_check_is_noted(cache):
    _file_estimate(cache, profile("estimate"))
    result = obtain_profile(
        request(Method.ESTIMATE), EstimateMaker(), cache=cache, identity=IDENTITY, verify=True
    )
    assert result.origin is ProfileOrigin.CACHED and not cache.problems
    [note] = result.notes
    assert note.startswith("T4: the cached estimate profile (") and "agrees with a fresh estimate" in note


def test_a_forged_job_measurement_is_refused_and_the_planned_profile_made(cache):
    job = JOB
    cache.put(
        measured_profile_key(job, "T4", "fp16", fingerprint=IDENTITY[0]),
        profile(MEASURED_METHOD, time_scale=1 / 5),
        inputs=measured_key_inputs(job, "T4", "fp16", fingerprint=IDENTITY[0]),
    )
    make = EstimateMaker()
    result = obtain_profile(request(Method.AUTO), make, cache=cache, identity=IDENTITY, verify=True)
    assert result.origin is ProfileOrigin.MADE and result.profile.method == "estimate"
    assert make.asked == [Method.ESTIMATE]
    [problem] = cache.problems
    assert "(job profile of T4) disagrees" in problem and "measured in a running job" in problem


def test_a_measure_entry_refused_is_measured_again(cache):
    req = request(Method.MEASURE, 0)
    cache.put(
        planned_key(req, IDENTITY),
        profile("measure", time_scale=5.0),
        inputs=profile_key_inputs(req, Method.MEASURE, IDENTITY),
    )

    def make(asked):
        return profile("estimate") if Method(asked.method) is Method.ESTIMATE else profile("measure")

    result = obtain_profile(req, make, cache=cache, identity=IDENTITY, verify=True)
    assert result.origin is ProfileOrigin.MADE and result.profile.method == "measure"
    assert cache.get(planned_key(req, IDENTITY)).step_time_s(16) == pytest.approx(0.16)
