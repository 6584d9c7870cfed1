"""Which way a profile is made: the one meaning of ``--method auto``.

- ``estimate``: fake tensors, for any catalog GPU, anywhere;
- ``measure``: real training steps on the CUDA device named; an error where this process cannot use it;
- ``auto``: measure where the process that holds the GPU can use it with CUDA; where no device is named (a
  simulated node, a catalog type) estimate; where a device is named but CUDA cannot use it (torch without
  CUDA, a broken driver) estimate *with a note* saying so.

``resolve_method`` decides, and it runs where the GPU is (in the node's probe, or in the process that owns
the device): only there can CUDA be asked. ``planned_method`` is what it will decide wherever CUDA works:
the method of the cache key a planner looks up before asking the probe.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from planner.errors import FieldError
from planner.job import Method

log = logging.getLogger(__name__)

__all__ = ["Method", "ResolvedMethod", "cuda_usable", "planned_method", "resolve_method"]


@dataclass(frozen=True, kw_only=True)
class ResolvedMethod:
    method: Method
    """``ESTIMATE`` or ``MEASURE``"""
    note: str | None = None
    """why ``auto`` estimated although a device was named (for the profile's notes)"""


def planned_method(requested: Method, device_index: int | None) -> Method:
    """``resolve_method``'s answer where CUDA can use ``device_index``: ``ESTIMATE`` or ``MEASURE``."""
    requested = Method(requested)
    if requested is Method.ESTIMATE or (requested is Method.AUTO and device_index is None):
        return Method.ESTIMATE
    return Method.MEASURE


def cuda_usable(device_index: int) -> bool:
    """Whether this process can run CUDA work on ``device_index`` (imports torch)."""
    try:
        import torch

        return bool(torch.cuda.is_available()) and device_index < torch.cuda.device_count()
    except Exception:  # a broken CUDA install must not stop a plan that can be estimated
        log.warning("CUDA is not usable here", exc_info=True)
        return False


def resolve_method(requested: Method, device_index: int | None, gpu_name: str) -> ResolvedMethod:
    """How this process makes the profile of ``gpu_name`` asked for with ``requested`` (see the module).

    Raises:
        FieldError: ``measure`` where CUDA cannot use ``device_index`` (or none is named).
    """
    planned = planned_method(requested, device_index)
    if planned is Method.ESTIMATE:
        return ResolvedMethod(method=Method.ESTIMATE)
    if device_index is not None and cuda_usable(device_index):
        return ResolvedMethod(method=Method.MEASURE)
    if Method(requested) is Method.MEASURE:
        raise FieldError(
            "method",
            f"`method` measure needs a CUDA GPU of type {gpu_name} (device {device_index}) where it is "
            "profiled, and none is usable there (use `method` estimate or auto)",
        )
    return ResolvedMethod(
        method=Method.ESTIMATE,
        note=f"{gpu_name}: no free GPU of this type to measure on (CUDA cannot use device "
        f"{device_index} here); estimated",
    )
