"""Making a device profile for one (job, GPU type) in this process: by estimation on fake tensors, or by
measuring real training steps on a real GPU.

``estimate`` works for any catalog GPU on any machine; ``measure`` needs the GPU itself; ``auto`` is decided
here, where the GPU is (``planner.obtain.method.resolve_method``), and recorded in the profile's
``method`` and, where it estimated although a device was named, a note. Where a profile is looked up and
cached: ``planner.obtain.lookup``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import statistics
import sys
from dataclasses import replace
from typing import Any

from planner.job import JobSpec, Method
from planner.obtain.method import resolve_method
from planner.profiles.profile import DeviceProfile
from torchkit.estimate.time_model import TimeUncertainty
from torchkit.hardware.catalog import GpuSpec

log = logging.getLogger(__name__)


def factory_search_dirs(model: str) -> tuple[str, ...]:
    """Where a user factory (``package.module:factory``) is imported from besides ``sys.path``: the current
    directory, as ``uvicorn app:app`` does (the console script's ``sys.path`` does not include it), searched
    after everything else. A probe appends these to its ``sys.path`` too (never PYTHONPATH, which comes
    before the standard library). None for a built-in workload."""
    return (os.getcwd(),) if ":" in model else ()


def workload_for(job: JobSpec):
    """The torchkit workload the job names (built-in or ``package.module:factory``, see ``factory_search_dirs``).

    The search directories are appended to ``sys.path``, not prepended: a ``json.py`` lying in the working
    directory must not replace the standard library's."""
    from planner.obtain.time_limit import user_code_time_limit
    from torchkit.workloads import get_workload

    for directory in factory_search_dirs(job.model):
        if directory not in sys.path:
            sys.path.append(directory)
    limit = (
        user_code_time_limit(job.user_code_timeout_s, job.model)
        if ":" in job.model
        else contextlib.nullcontext()
    )
    with limit:  # a factory that hangs is stopped (planner.obtain.time_limit)
        return get_workload(
            job.model,
            imgsz=job.imgsz,
            input_shape=job.input_shape,
            seq_len=job.seq_len,
            vocab_size=job.vocab_size,
            input_dtype=job.input_dtype,
        )


def job_fingerprint(job: JobSpec) -> tuple[str, str]:
    """``(workload fingerprint, torch version)``: the parts of a profile key (``planner.profiles.key``) that
    name the model and the torch that traces it.

    A built-in workload is defined by its name, its input options and the source of ``torchkit.workloads``:
    those are hashed, so a cache hit costs no torch import and no model build (the warm path of ``plan``).
    A user factory (``package.module:factory``) can depend on anything it imports: its model is built on fake
    tensors and fingerprinted (``torchkit.workloads.workload_fingerprint``).
    """
    import hashlib
    import importlib.metadata
    import importlib.util
    from pathlib import Path

    if ":" in job.model:
        import torch

        from torchkit.workloads import workload_fingerprint

        return workload_fingerprint(workload_for(job)), torch.__version__
    # the name is checked where the model is built (a probe, on a cache miss); an unknown one has no profile
    spec = importlib.util.find_spec("torchkit.workloads")  # the package's files, without importing it (torch)
    sources = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.py"))
    digest = hashlib.sha256(repr((job.model, job.imgsz, job.input_shape, job.seq_len)).encode())
    for source in sources:
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return f"src-{digest.hexdigest()[:16]}", importlib.metadata.version("torch")


def _uncalibrated_note(gpu_name: str, uncertainty: TimeUncertainty) -> str:
    """The warning for a GPU type without measured rows in the step-time calibration."""
    scope = (
        "its architecture's constants are calibrated on other types"
        if uncertainty.calibrated_arch
        else "nor any GPU of its architecture: the global constants apply"
    )
    return (
        f"{gpu_name}: no measured training throughput of this GPU type in the step-time calibration ({scope}); "
        f"its predicted step time may be off by about ±{uncertainty.relative:.0%} (one sigma)"
    )


def _estimated_curves(
    job: JobSpec, gpu: GpuSpec, workload: Any, amp: str, estimates_cache: dict[Any, Any] | None
) -> tuple[Any, int | None]:
    """The estimated curves at the default probes, plus one probe near the memory cap where the small-batch
    step times cannot tell what a large batch costs (``torchkit.estimate.range_probe_batch``). Returns the
    curves and that extra batch (None when not needed)."""
    from planner.profiles.profile import MAX_PLANNED_BATCH
    from torchkit.estimate import DEFAULT_PROBE_BATCHES, estimate_curves, range_probe_batch

    cache = estimates_cache if estimates_cache is not None else {}
    options = {
        "amp": amp,
        "optimizer": job.optimizer,
        "estimates_cache": cache,
        "channels_last": job.channels_last,
    }
    curves = estimate_curves(workload, gpu, **options)
    extra = range_probe_batch(curves, gpu.memory_bytes, upper=MAX_PLANNED_BATCH)
    if extra is None:
        return curves, None
    wider = estimate_curves(workload, gpu, batches=(*DEFAULT_PROBE_BATCHES, extra), **options)
    return replace(wider, num_fake_passes=curves.num_fake_passes + wider.num_fake_passes), extra


def make_profile(
    job: JobSpec,
    gpu: GpuSpec,
    *,
    method: Method | str = Method.ESTIMATE,
    device_index: int | None = None,
    estimates_cache: dict[Any, Any] | None = None,
) -> DeviceProfile:
    """Profile the job's training step on one GPU type, here.

    Args:
        method: ``estimate``, ``measure`` or ``auto`` (``planner.obtain.method``).
        device_index: the CUDA device to measure on (PCI order) for ``measure``/``auto``; None: none here.
        estimates_cache: fake-pass results kept between calls; fake passes do not depend on the GPU type,
            so profiling several types in one process reuses them.

    Raises:
        FieldError: ``measure`` without a usable GPU.
        WorkloadError: the model cannot be built or run.
    """
    resolved = resolve_method(Method(method), device_index, gpu.name)
    amp = job.amp_for(gpu)
    workload = workload_for(job)
    # what both ways record: the GPU type, the method that made the profile, its amp and memory curve model
    made = {"gpu": gpu.name, "method": resolved.method.value, "amp": amp, "fit": job.fit}
    if resolved.method is Method.ESTIMATE:
        notes = [resolved.note] if resolved.note else []
        return _estimated_profile(job, gpu, workload, amp, estimates_cache, made, notes)
    if resolved.method is Method.MEASURE:
        return _measured_profile(job, gpu, workload, amp, device_index, made)
    raise AssertionError(f"resolve_method gave {resolved.method!r}")  # our own invariant: estimate or measure


def _estimated_profile(
    job: JobSpec,
    gpu: GpuSpec,
    workload: Any,
    amp: str,
    estimates_cache: dict[Any, Any] | None,
    made: dict[str, Any],
    notes: list[str],
) -> DeviceProfile:
    """The profile the fake-tensor estimator gives for ``gpu`` (``made``: the fields both ways record; ``notes``:
    said before), with the time model's uncertainty for that GPU type."""
    from torchkit.estimate.time_model import uncertainty_for

    curves, range_probe = _estimated_curves(job, gpu, workload, amp, estimates_cache)
    if range_probe is not None:
        log.info(
            "%s: the small-batch probes are launch-bound (eager dispatch); one more fake pass at batch %d "
            "prices the batches near the memory cap",
            gpu.name,
            range_probe,
        )
    notes = [*notes, *workload.notes]  # what the model source stands in for or leaves out (e.g. YOLO's loss)
    uncertainty = uncertainty_for(gpu)
    if not uncertainty.calibrated_gpu:
        notes.append(_uncalibrated_note(gpu.name, uncertainty))
    return DeviceProfile.from_points(
        **made,
        memory_points=curves.memory_points,
        time_points=curves.time_points,
        notes=notes,
        breakdown_bytes=curves.breakdown_bytes,
        min_memory_bytes=curves.floor_device_bytes,
        time_log_sigma=uncertainty.log_sigma,
        time_model=uncertainty.basis,
        # the overlap of DDP's all-reduces with the backward pass (planner.plan.comm): the probes' median
        backward_share=statistics.median(s for _, s in curves.backward_shares)
        if curves.backward_shares
        else None,
    )


def _measured_profile(
    job: JobSpec, gpu: GpuSpec, workload: Any, amp: str, device_index: int | None, made: dict[str, Any]
) -> DeviceProfile:
    """The profile measured on CUDA device ``device_index`` (``made``: the fields both ways record)."""
    import torch

    from torchkit.estimate.overhead import DEFAULT_CUDA_OVERHEAD
    from torchkit.step.measure import measure_curve

    curve = measure_curve(
        workload,
        torch.device("cuda", device_index),
        amp=amp,
        optimizer=job.optimizer,
        context_bytes=DEFAULT_CUDA_OVERHEAD.context_bytes,
    )
    notes = (
        [f"{gpu.name}: measured in the default (NCHW) memory format; channels_last changes estimates only"]
        if job.channels_last
        else []
    )
    return DeviceProfile.from_points(
        **made,
        memory_points=curve.memory_points,
        time_points=curve.time_points,
        oom_batch=curve.oom_batch,
        notes=notes,
        time_model="measured",
        # the overlap of DDP's all-reduces with the backward pass, timed: the probes' median
        backward_share=statistics.median(s for _, s in curve.backward_shares)
        if curve.backward_shares
        else None,
    )
