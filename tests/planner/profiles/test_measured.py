"""planner.profiles.measured: the key of a profile measured in a job, and what planning accepts from it."""

from __future__ import annotations

from planner.job import JobSpec
from planner.profiles.cache import ProfileCache
from planner.profiles.measured import (
    MEASURED_METHOD,
    find_measured,
    measured_key_inputs,
    measured_profile_key,
)
from planner.profiles.profile import DeviceProfile


def profile(method: str) -> DeviceProfile:
    return DeviceProfile.from_points(
        gpu="T4",
        method=method,
        amp="fp16",
        memory_points=[(8, 1000), (16, 1800)],
        time_points=[(8, 0.08), (16, 0.16)],
    )


def test_the_key_ignores_planning_options_but_not_what_makes_a_step_faster():
    base = JobSpec(model="resnet18", imgsz=64, global_batch=64)
    other_plan = JobSpec(
        model="resnet18", imgsz=64, global_batch=256, fraction=0.9, mode="uniform", multiple_of=8
    )
    key = measured_profile_key(base, "T4", "fp16", fingerprint="f0")
    assert measured_profile_key(other_plan, "T4", "fp16", fingerprint="f0") == key
    assert measured_profile_key(JobSpec(model="resnet18", imgsz=128), "T4", "fp16", fingerprint="f0") != key
    assert (
        measured_profile_key(
            JobSpec(model="resnet18", imgsz=64, optimizer="adamw"), "T4", "fp16", fingerprint="f0"
        )
        != key
    )
    assert measured_profile_key(base, "A10", "fp16", fingerprint="f0") != key
    assert measured_profile_key(base, "T4", "bf16", fingerprint="f0") != key
    # the same name and input with another model behind it (its forward or settings edited) is another step
    assert measured_profile_key(base, "T4", "fp16", fingerprint="f1") != key


def test_only_a_profile_made_in_a_job_is_taken(tmp_path):
    cache = ProfileCache(tmp_path)
    job = JobSpec(model="resnet18")
    key = measured_profile_key(job, "T4", "fp16", fingerprint="f0")
    assert find_measured(cache, job, "T4", "fp16", fingerprint="f0") is None
    inputs = measured_key_inputs(job, "T4", "fp16", fingerprint="f0")
    cache.put(key, profile("estimate"), inputs=inputs)  # an estimate filed under a measured key: not trusted
    assert find_measured(cache, job, "T4", "fp16", fingerprint="f0") is None
    cache.put(key, profile(MEASURED_METHOD), inputs=inputs)
    found = find_measured(cache, job, "T4", "fp16", fingerprint="f0")
    assert found is not None and found.method == "job"
    assert find_measured(None, job, "T4", "fp16", fingerprint="f0") is None
