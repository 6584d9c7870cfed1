"""What is asked of the profiling layer (``ProfileRequest``) and what it answers (``Profiled``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from planner.job import JobSpec, Method
from planner.profiles.profile import DeviceProfile
from torchkit.hardware.catalog import GpuSpec


@dataclass(frozen=True, kw_only=True)
class ProfileRequest:
    """One profile to obtain: a job's training step on one GPU type."""

    job: JobSpec
    gpu: GpuSpec
    """the catalog type profiled"""
    method: Method
    """as asked (``planner.obtain.method``): ``AUTO`` is resolved where the GPU is"""
    device_index: int | None = None
    """the CUDA device (PCI order) to measure on, on the node that makes the profile; None: nothing to measure
    on (a simulated node, a catalog type)"""
    node: str | None = None
    """the node that holds ``device_index`` (where the profile must be made when it is measured); None: here,
    or any node for an estimate"""


class ProfileOrigin(Enum):
    """Where a profile came from: read from the profile cache, made now (measured or estimated, and cached), or
    the step times a running job measured (``planner.profiles.measured``), which ``auto`` prefers."""

    CACHED = "cached"
    MADE = "made"
    MEASURED_IN_JOB = "measured_in_job"


@dataclass(frozen=True, kw_only=True)
class Profiled:
    """The answer to a ``ProfileRequest``: the profile, where it came from, the cache key a plan names it by,
    and what the plan should say about its origin (e.g. measured in a running job)."""

    profile: DeviceProfile
    origin: ProfileOrigin
    key: str
    notes: tuple[str, ...] = field(default=())
