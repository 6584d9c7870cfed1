"""Profiles measured inside a running job (``planner.runtime.rebalance``), and how planning finds them.

A re-balanced job writes, per GPU type, a profile whose step-time points are the compute times its ranks
measured (method ``"job"``) into the profile cache under :func:`measured_profile_key`. The key holds what
decides how fast one training step runs: the job's model, input and optimizer, the AMP mode and the GPU
type, the torch version, and the workload's fingerprint (``planner.obtain.job_fingerprint``: a model whose code or
settings changed is another step, whose plan must not be answered with the old model's times); not the planning options (fraction, mode, global batch, multiple-of), so a re-plan with another
global batch still finds it. ``batchplan plan --method auto`` looks there before estimating
(:func:`find_measured`) and says so in the plan's warnings. Pure: no torch.
"""

from __future__ import annotations

from typing import Any

from planner.job import JobSpec
from planner.profiles.key import key_of_inputs
from planner.profiles.profile import DeviceProfile

__all__ = [
    "MEASURED_METHOD",
    "MEASURED_SCHEME",
    "find_measured",
    "measured_key_inputs",
    "measured_profile_key",
    "software_version",
    "step_fields",
]

#: ``DeviceProfile.method`` of a profile measured inside a running job
MEASURED_METHOD = "job"
#: the job fields that decide how fast one training step runs (JobSpec names)
STEP_FIELDS = ("model", "imgsz", "input_shape", "seq_len", "optimizer")


#: the first part of a measured-in-job key, which tells it from a planning key (``planner.profiles.key``)
MEASURED_SCHEME = "measured-in-job"


def software_version() -> str:
    """The torch this process would train with (its installed version, read without importing torch): a
    profile measured under one torch answers only plans made under the same."""
    import importlib.metadata

    try:
        return "torch " + importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "torch unknown"


def measured_key_inputs(job: JobSpec, gpu: str, amp: str, *, fingerprint: str) -> dict[str, str]:
    """The named parts of :func:`measured_profile_key`, in the order it hashes them (the profile cache records
    them so that an entry's key can be recomputed from what it claims to describe). ``fingerprint``: the
    job's workload fingerprint (``planner.obtain.job_fingerprint(job)[0]``); ``software`` is this
    process's torch: the job that measured and the planner that reads must run the same."""
    values = [MEASURED_SCHEME, fingerprint, *step_fields(job), amp, gpu, software_version()]
    names = ["scheme", "fingerprint", *STEP_FIELDS, "amp", "gpu", "software"]
    return {name: str(value) for name, value in zip(names, values, strict=True)}


def step_fields(job: JobSpec) -> list[Any]:
    """The job's fields that decide how fast one training step runs, as a key writes them (a shape as a list)."""
    values = [getattr(job, name) for name in STEP_FIELDS]
    return [list(v) if isinstance(v, tuple) else v for v in values]


def measured_profile_key(job: JobSpec, gpu: str, amp: str, *, fingerprint: str) -> str:
    """Cache key of the in-job measured profile of (the job's model, input and optimizer; ``amp``; ``gpu``)."""
    return key_of_inputs(measured_key_inputs(job, gpu, amp, fingerprint=fingerprint))


def find_measured(cache: Any, job: JobSpec, gpu: str, amp: str, *, fingerprint: str) -> DeviceProfile | None:
    """The measured-in-job profile of this job on ``gpu`` in ``cache`` (a ``ProfileCache``), or None."""
    if cache is None:
        return None
    profile = cache.get(measured_profile_key(job, gpu, amp, fingerprint=fingerprint))
    if profile is None or profile.method != MEASURED_METHOD:
        return None
    return profile
