"""The one way to obtain a profile: key inputs → key → cache.get → make → cache.put.

The driver (over its probes), ``batchplan profile`` and ``autobatch_ddp`` (in the job) all call
``obtain_profile``; they differ only in ``make``, how a profile is made when the cache has none (in a probe on
the GPU's node, or in this process). With ``auto`` a profile that a running job measured comes first
(``planner.profiles.measured``). The key is looked up under the method ``planned_method`` expects; a profile
made by another method (``auto`` where CUDA could not measure) is filed under its own method's key.

A node whose torch is a build without CUDA is planned as the estimate it will be (the driver's
``_profile_requests``: its probe reads torch's build), so its second plan hits the cache. Known limitation:
``auto`` on a node whose torch has CUDA but cannot use the GPU (a driver too old, a broken install) is still
looked up under the measured key, misses, and estimates again on every run (a second or so for most
models); the estimate is cached under its own key, where ``estimate`` finds it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from planner.job import Method
from planner.obtain.method import planned_method
from planner.obtain.request import Profiled, ProfileOrigin, ProfileRequest
from planner.obtain.verify import compare_with_estimate
from planner.profiles.cache import ProfileCache
from planner.profiles.key import job_key_inputs, key_of_inputs
from planner.profiles.measured import find_measured
from planner.profiles.profile import DeviceProfile

log = logging.getLogger(__name__)

#: ``(workload fingerprint, torch version)``: ``planner.obtain.make.job_fingerprint``
JobIdentity = tuple[str, str]


def profile_key_inputs(request: ProfileRequest, method: Method, identity: JobIdentity) -> dict[str, str]:
    """The named parts of the key of the request's profile made by ``method``, under this process's estimator
    and step-time calibration (``torchkit.estimate.identity.estimate_identity``)."""
    from torchkit.estimate.identity import estimate_identity

    fingerprint, torch_version = identity
    return job_key_inputs(
        request.job,
        request.gpu,
        method=Method(method).value,
        fingerprint=fingerprint,
        torch_version=torch_version,
        time_model=estimate_identity(),
    )


def planned_key(request: ProfileRequest, identity: JobIdentity) -> str:
    """The key the request's profile is looked up under (its ``planned_method``'s)."""
    return key_of_inputs(
        profile_key_inputs(request, planned_method(request.method, request.device_index), identity)
    )


def _measured_in_job(
    request: ProfileRequest, cache: ProfileCache, key: str, fingerprint: str
) -> Profiled | None:
    """With ``auto``: the profile a re-balanced job measured for this GPU type, named by the planned ``key``."""
    job, gpu = request.job, request.gpu
    measured = find_measured(cache, job, gpu.name, job.amp_for(gpu), fingerprint=fingerprint)
    if measured is None:
        return None
    planned = planned_method(request.method, request.device_index).value
    note = (
        f"{gpu.name}: step time measured in a running job (profile method 'job', from the profile cache); "
        f"`method` auto prefers it over the {planned} profile"
    )
    return Profiled(profile=measured, origin=ProfileOrigin.MEASURED_IN_JOB, key=key, notes=(note,))


def obtain_profile(
    request: ProfileRequest,
    make: Callable[[ProfileRequest], DeviceProfile | None],
    *,
    cache: ProfileCache | None,
    identity: JobIdentity,
    verify: bool = False,
) -> Profiled | None:
    """The request's profile: measured in a running job (with ``auto``), cached, or made by ``make`` and cached.

    Args:
        make: makes the profile where it must be made; None when it could not be (the caller said why).
        cache: the profile cache; None reads and writes none.
        identity: ``job_fingerprint(request.job)``, computed once per job by the caller.
        verify: hold every profile read from the cache against a fresh estimate made by ``make``
            (``planner.obtain.verify``); one outside its range is refused (in ``cache.problems``, with both
            figures) and the profile made again.

    Returns:
        The profile with its origin, key and notes; None when ``make`` gave none. ``notes`` name settings in
        backticks (``planner.errors.render_fields``).
    """
    planned = planned_method(request.method, request.device_index)
    inputs = profile_key_inputs(request, planned, identity)
    key = key_of_inputs(inputs)
    checker = _Verifier(request, make, cache) if verify and cache is not None else None
    if cache is not None:
        measured = (
            _measured_in_job(request, cache, key, identity[0])
            if Method(request.method) is Method.AUTO
            else None
        )
        if measured is not None and (
            checker is None or checker.trusts(measured.profile, "measured in a running job")
        ):
            return checker.noted(measured) if checker else measured
        cached = cache.get(key)
        if cached is not None and (checker is None or checker.trusts(cached, cache.path_for(key))):
            found = Profiled(profile=cached, origin=ProfileOrigin.CACHED, key=key)
            return checker.noted(found) if checker else found
    fresh = checker.fresh if checker is not None and planned is Method.ESTIMATE else None
    profile = fresh or make(request)
    if profile is None:
        return None
    if profile.method != planned.value:  # auto where CUDA could not measure: filed under the estimate's key
        inputs = profile_key_inputs(request, Method(profile.method), identity)
        key = key_of_inputs(inputs)
    if cache is not None:
        cache.put(key, profile, inputs=inputs)
    return Profiled(profile=profile, origin=ProfileOrigin.MADE, key=key)


class _Verifier:
    """``obtain_profile``'s check of cached profiles against one fresh estimate, made when first needed."""

    def __init__(
        self,
        request: ProfileRequest,
        make: Callable[[ProfileRequest], DeviceProfile | None],
        cache: ProfileCache,
    ) -> None:
        self._estimate_request = replace(request, method=Method.ESTIMATE, device_index=None, node=None)
        self._make = make
        self._cache = cache
        self._made = False
        self.fresh: DeviceProfile | None = None
        self._checked: list[str] = []

    def _fresh_estimate(self) -> DeviceProfile | None:
        if not self._made:
            self._made = True
            self.fresh = self._make(self._estimate_request)
        return self.fresh

    def trusts(self, cached: DeviceProfile, where: object) -> bool:
        """Whether ``cached`` (read from ``where``) agrees with the fresh estimate; a refusal is reported."""
        fresh = self._fresh_estimate()
        gpu = self._estimate_request.gpu.name
        if fresh is None:  # no probe could estimate: the entry stands unchecked, and the plan says so
            self._checked.append(
                f"{gpu}: the cached {cached.method} profile ({where}) could not be checked "
                "against a fresh estimate (none could be made); used unchecked"
            )
            return True
        comparison = compare_with_estimate(cached, fresh)
        if comparison.agrees:
            self._checked.append(
                f"{gpu}: the cached {cached.method} profile ({where}) agrees with a fresh "
                f"estimate: {comparison.describe()}"
            )
            return True
        message = (
            f"profile cache entry {where} ({cached.method} profile of {gpu}) disagrees with a fresh estimate "
            f"of the same job beyond the estimator's range: {comparison.describe()}; ignoring it and "
            "profiling again"
        )
        log.warning(message)
        self._cache.problems.append(message)
        return False

    def noted(self, found: Profiled) -> Profiled:
        """``found`` with what the checks said."""
        return replace(found, notes=(*found.notes, *self._checked))
