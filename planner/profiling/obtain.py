"""The one way to obtain a profile: key inputs → key → cache.get → make → cache.put.

The driver (over its probes), ``batchplan profile`` and ``autobatch_ddp`` (in the job) all call
``obtain_profile``; they differ only in ``make``, how a profile is made when the cache has none (in a probe on
the GPU's node, or in this process). With ``auto`` a profile that a running job measured comes first
(``planner.profiles.measured``). The key is looked up under the method ``planned_method`` expects; a profile
made by another method (``auto`` where CUDA could not measure) is filed under its own method's key.

Known limitation: ``auto`` on a real node whose torch cannot use CUDA looks up the measured key first, misses,
and the node's probe estimates again on every run (a second or so for most models); the estimate is cached
under its own key, where ``estimate`` finds it.
"""

from __future__ import annotations

from collections.abc import Callable

from planner.job import Method
from planner.profiles.cache import ProfileCache
from planner.profiles.key import job_key_inputs, key_of_inputs
from planner.profiles.measured import find_measured
from planner.profiles.profile import DeviceProfile
from planner.profiling.method import planned_method
from planner.profiling.request import Profiled, ProfileOrigin, ProfileRequest

#: ``(workload fingerprint, torch version)``: ``planner.profiling.make.job_fingerprint``
JobIdentity = tuple[str, str]


def profile_key_inputs(request: ProfileRequest, method: Method, identity: JobIdentity) -> dict[str, str]:
    """The named parts of the key of the request's profile made by ``method``, under this process's estimator
    and step-time calibration (``torchkit.estimate.identity.estimate_identity``)."""
    from torchkit.estimate.identity import estimate_identity

    fingerprint, torch_version = identity
    return job_key_inputs(request.job, request.gpu, method=Method(method).value, fingerprint=fingerprint,
                          torch_version=torch_version, time_model=estimate_identity())


def planned_key(request: ProfileRequest, identity: JobIdentity) -> str:
    """The key the request's profile is looked up under (its ``planned_method``'s)."""
    return key_of_inputs(profile_key_inputs(request, planned_method(request.method, request.device_index), identity))


def _measured_in_job(request: ProfileRequest, cache: ProfileCache, key: str, fingerprint: str) -> Profiled | None:
    """With ``auto``: the profile a re-balanced job measured for this GPU type, named by the planned ``key``."""
    job, gpu = request.job, request.gpu
    measured = find_measured(cache, job.to_json(), gpu.name, job.amp_for(gpu), fingerprint=fingerprint)
    if measured is None:
        return None
    planned = planned_method(request.method, request.device_index).value
    note = (f"{gpu.name}: step time measured in a running job (profile method 'job', from the profile cache); "
            f"`method` auto prefers it over the {planned} profile")
    return Profiled(profile=measured, origin=ProfileOrigin.MEASURED_IN_JOB, key=key, notes=(note,))


def obtain_profile(
    request: ProfileRequest,
    make: Callable[[ProfileRequest], DeviceProfile | None],
    *,
    cache: ProfileCache | None,
    identity: JobIdentity,
) -> Profiled | None:
    """The request's profile: measured in a running job (with ``auto``), cached, or made by ``make`` and cached.

    Args:
        make: makes the profile where it must be made; None when it could not be (the caller said why).
        cache: the profile cache; None reads and writes none.
        identity: ``job_fingerprint(request.job)``, computed once per job by the caller.

    Returns:
        The profile with its origin, key and notes; None when ``make`` gave none. ``notes`` name settings in
        backticks (``planner.errors.render_fields``).
    """
    planned = planned_method(request.method, request.device_index)
    inputs = profile_key_inputs(request, planned, identity)
    key = key_of_inputs(inputs)
    if cache is not None:
        measured = _measured_in_job(request, cache, key, identity[0]) if Method(request.method) is Method.AUTO else None
        if measured is not None:
            return measured
        cached = cache.get(key)
        if cached is not None:
            return Profiled(profile=cached, origin=ProfileOrigin.CACHED, key=key)
    profile = make(request)
    if profile is None:
        return None
    if profile.method != planned.value:  # auto where CUDA could not measure: filed under the estimate's key
        inputs = profile_key_inputs(request, Method(profile.method), identity)
        key = key_of_inputs(inputs)
    if cache is not None:
        cache.put(key, profile, inputs=inputs)
    return Profiled(profile=profile, origin=ProfileOrigin.MADE, key=key)
