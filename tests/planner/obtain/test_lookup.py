"""planner.obtain.lookup: key → cache.get → make → cache.put, once, for the driver, ``profile`` and the job."""

from __future__ import annotations

import pytest

from planner.job import JobSpec, Method
from planner.obtain import ProfileOrigin, ProfileRequest, obtain_profile, planned_key, profile_key_inputs
from planner.profiles.cache import ProfileCache
from planner.profiles.key import key_of_inputs
from planner.profiles.measured import MEASURED_METHOD, measured_key_inputs, measured_profile_key
from planner.profiles.profile import DeviceProfile
from torchkit.hardware.catalog import load_catalog

IDENTITY = ("fingerprint", "2.13.0")
JOB = JobSpec(model="resnet18", amp="fp16")


def profile(method: str) -> DeviceProfile:
    return DeviceProfile.from_points(
        gpu="T4",
        method=method,
        amp="fp16",
        memory_points=[(8, 2**30), (16, 2**31)],
        time_points=[(8, 0.08), (16, 0.16)],
    )


def request(method: Method, device_index: int | None = None) -> ProfileRequest:
    return ProfileRequest(job=JOB, gpu=load_catalog().get("T4"), method=method, device_index=device_index)


class Maker:
    """A ``make`` that counts its calls and answers with a profile of ``method``."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.calls = 0

    def __call__(self, request: ProfileRequest) -> DeviceProfile:
        self.calls += 1
        return profile(self.method)


@pytest.fixture
def cache(tmp_path) -> ProfileCache:
    return ProfileCache(tmp_path / "profiles")


def test_a_made_profile_is_cached_and_the_next_request_reads_it(cache):
    make = Maker("estimate")
    first = obtain_profile(request(Method.ESTIMATE), make, cache=cache, identity=IDENTITY)
    second = obtain_profile(request(Method.ESTIMATE), make, cache=cache, identity=IDENTITY)
    assert (first.origin, second.origin, make.calls) == (ProfileOrigin.MADE, ProfileOrigin.CACHED, 1)
    assert first.key == second.key == planned_key(request(Method.ESTIMATE), IDENTITY)
    assert second.profile == first.profile and cache.path_for(first.key).is_file()


def test_auto_without_a_device_names_the_estimate_that_estimate_names(cache):
    assert planned_key(request(Method.AUTO), IDENTITY) == planned_key(request(Method.ESTIMATE), IDENTITY)
    assert planned_key(request(Method.AUTO, 0), IDENTITY) == planned_key(request(Method.MEASURE, 0), IDENTITY)


def test_auto_that_could_not_measure_files_the_estimate_under_the_estimates_key(cache):
    make = Maker("estimate")  # the probe found no usable CUDA device and estimated
    result = obtain_profile(request(Method.AUTO, 0), make, cache=cache, identity=IDENTITY)
    estimate_key = key_of_inputs(profile_key_inputs(request(Method.AUTO, 0), Method.ESTIMATE, IDENTITY))
    assert result.origin is ProfileOrigin.MADE and result.key == estimate_key
    assert not cache.path_for(planned_key(request(Method.AUTO, 0), IDENTITY)).exists()
    # an estimate asked for is then found there
    again = obtain_profile(request(Method.ESTIMATE), make, cache=cache, identity=IDENTITY)
    assert again.origin is ProfileOrigin.CACHED and make.calls == 1


def test_auto_prefers_a_profile_measured_in_a_running_job_and_says_so(cache):
    job = JOB
    cache.put(
        measured_profile_key(job, "T4", "fp16", fingerprint=IDENTITY[0]),
        profile(MEASURED_METHOD),
        inputs=measured_key_inputs(job, "T4", "fp16", fingerprint=IDENTITY[0]),
    )
    make = Maker("estimate")
    result = obtain_profile(request(Method.AUTO), make, cache=cache, identity=IDENTITY)
    assert result.origin is ProfileOrigin.MEASURED_IN_JOB and make.calls == 0
    assert result.profile.method == MEASURED_METHOD
    assert result.key == planned_key(request(Method.AUTO), IDENTITY)
    (note,) = result.notes
    assert note.startswith("T4: step time measured in a running job") and "`method` auto prefers it" in note
    # another model under the same name (a different fingerprint) does not get this job's measurement
    other = obtain_profile(request(Method.AUTO), make, cache=cache, identity=("another-model", IDENTITY[1]))
    assert other.origin is ProfileOrigin.MADE
    # asked for an estimate explicitly, the job's measurement is not used
    assert (
        obtain_profile(request(Method.ESTIMATE), make, cache=cache, identity=IDENTITY).origin
        is ProfileOrigin.MADE
    )


def test_without_a_cache_every_request_is_made_and_a_failed_make_gives_none():
    make = Maker("estimate")
    for _ in range(2):
        assert (
            obtain_profile(request(Method.ESTIMATE), make, cache=None, identity=IDENTITY).origin
            is ProfileOrigin.MADE
        )
    assert make.calls == 2
    assert obtain_profile(request(Method.ESTIMATE), lambda r: None, cache=None, identity=IDENTITY) is None
