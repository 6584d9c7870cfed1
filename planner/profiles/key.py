"""The one name of a profile: a short content key of everything that determines it (``job_key_inputs`` →
``key_of_inputs``). ``planner.obtain.lookup`` names every profile the driver, ``batchplan profile`` and
``autobatch_ddp`` obtain with it, so a profile made by one is found by the others. Pure Python."""

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


#: what a profile key is made of, in the order ``profile_key`` hashes it; a cache entry records these, so its
#: key can be recomputed from the job and GPU it claims to describe. Two optional parts follow them, each
#: only when set, so that the keys of existing (NCHW, uncalibrated) profiles stay valid: ``channels_last``
#: and, for estimates, ``time_model`` (the identity of the step-time calibration an estimate is priced with:
#: a new calibration is a new profile)
KEY_FIELDS = (
    "fingerprint",
    "imgsz",
    "input_shape",
    "seq_len",
    "amp",
    "optimizer",
    "gpu",
    "method",
    "fit",
    "torch_version",
)


def job_key_inputs(
    job: JobSpec, gpu: GpuSpec, *, method: str, fingerprint: str, torch_version: str, time_model: str = ""
) -> dict[str, str]:
    """The named parts of the key of ``job``'s profile on ``gpu`` made by ``method`` (``estimate``/
    ``measure``), for the workload whose content fingerprint is ``fingerprint`` under torch
    ``torch_version``, priced with the step-time calibration ``time_model``: the strings ``profile_key``
    hashes."""
    values = (
        fingerprint,
        job.imgsz,
        job.input_shape,
        job.seq_len,
        job.amp_for(gpu),
        job.optimizer,
        gpu.name,
        method,
        job.fit,
        torch_version,
    )
    inputs = {name: str(value) for name, value in zip(KEY_FIELDS, values, strict=True)}
    if job.channels_last:
        inputs["channels_last"] = "channels_last"
    if method == "estimate" and time_model:
        inputs["time_model"] = time_model
    return inputs


def key_of_inputs(inputs: dict[str, str]) -> str:
    """``profile_key`` of named parts, in their order (``job_key_inputs``, or
    ``planner.profiles.measured.measured_key_inputs``)."""
    return profile_key(*inputs.values())
