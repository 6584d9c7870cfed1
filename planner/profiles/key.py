"""The one name of a profile: a short content key of everything that determines it. The driver, the profile
cache and ``autobatch_ddp`` all name profiles with ``job_profile_key``, so a profile made by one is found by
the others. Pure Python."""

from __future__ import annotations

import hashlib
import json

from planner.job import JobSpec
from torchkit.hardware.catalog import GpuSpec


def profile_key(*parts: object) -> str:
    """Stable short content key of everything that determines a profile (workload fingerprint, input, amp,
    optimizer, GPU type, method, torch version): the same inputs always give the same key."""
    text = json.dumps([str(p) for p in parts], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def job_profile_key(job: JobSpec, gpu: GpuSpec, *, method: str, fingerprint: str, torch_version: str) -> str:
    """The key of ``job``'s profile on ``gpu`` made by ``method`` (``estimate``/``measure``), for the
    workload whose content fingerprint is ``fingerprint`` under torch ``torch_version``."""
    return profile_key(
        fingerprint, job.imgsz, job.input_shape, job.seq_len, job.amp_for(gpu), job.optimizer,
        gpu.name, method, job.fit, torch_version,
    )
