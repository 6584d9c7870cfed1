"""Making a device profile for one (job, GPU type): by estimation on fake tensors, or by measuring real
training steps on a real GPU.

``estimate`` works for any catalog GPU on any machine; ``measure`` needs the GPU itself; ``auto`` measures
where a CUDA GPU is present and estimates otherwise (the choice is recorded in the profile's ``method`` and
a note).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import replace
from typing import Any

from planner.errors import ConfigError
from planner.job import JobSpec
from planner.profiles.key import job_key_inputs
from planner.profiles.profile import DeviceProfile
from torchkit.estimate.identity import estimate_identity
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
    from torchkit.workloads import get_workload

    for directory in factory_search_dirs(job.model):
        if directory not in sys.path:
            sys.path.append(directory)
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


def profile_key_inputs(
    job: JobSpec, gpu: GpuSpec, *, method: str, identity: tuple[str, str] | None = None
) -> dict[str, str]:
    """The named parts of the key of ``job``'s profile on ``gpu`` made by ``method``, under this process's
    estimator and step-time calibration (``estimate_identity``): the one way the driver, ``profile`` and
    ``autobatch_ddp`` name a profile.
    ``identity``: ``job_fingerprint(job)`` when the caller already has it (it hashes sources or traces a model)."""
    fingerprint, torch_version = identity if identity is not None else job_fingerprint(job)
    return job_key_inputs(job, gpu, method=method, fingerprint=fingerprint, torch_version=torch_version,
                          time_model=estimate_identity())


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


def resolve_method(method: str, device_index: int | None) -> str:
    """``auto`` → ``measure`` when this process can use a CUDA GPU at ``device_index``, else ``estimate``."""
    if method != "auto":
        return method
    if device_index is None:
        return "estimate"
    try:
        import torch

        return "measure" if torch.cuda.is_available() and device_index < torch.cuda.device_count() else "estimate"
    except Exception:  # a broken CUDA install must not stop a plan that can be estimated
        log.warning("CUDA is not usable here; estimating instead of measuring", exc_info=True)
        return "estimate"


def _estimated_curves(
    job: JobSpec, gpu: GpuSpec, workload: Any, amp: str, estimates_cache: dict[Any, Any] | None
) -> tuple[Any, int | None]:
    """The estimated curves at the default probes, plus one probe near the memory cap where the small-batch
    step times cannot tell what a large batch costs (``torchkit.estimate.range_probe_batch``). Returns the
    curves and that extra batch (None when not needed)."""
    from planner.profiles.profile import MAX_PLANNED_BATCH
    from torchkit.estimate import DEFAULT_PROBE_BATCHES, estimate_curves, range_probe_batch

    cache = estimates_cache if estimates_cache is not None else {}
    options = {"amp": amp, "optimizer": job.optimizer, "estimates_cache": cache, "channels_last": job.channels_last}
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
    method: str = "estimate",
    device_index: int | None = None,
    estimates_cache: dict[Any, Any] | None = None,
) -> DeviceProfile:
    """Profile the job's training step on one GPU type.

    Args:
        method: ``estimate``, ``measure`` or ``auto``.
        device_index: the CUDA device to measure on (PCI order) for ``measure``/``auto``.
        estimates_cache: fake-pass results kept between calls; fake passes do not depend on the GPU type,
            so profiling several types in one process reuses them.

    Raises:
        ConfigError: ``measure`` without a usable GPU.
        WorkloadError: the model cannot be built or run.
    """
    resolved = resolve_method(method, device_index)
    amp = job.amp_for(gpu)
    workload = workload_for(job)
    if resolved == "estimate":
        from torchkit.estimate.time_model import uncertainty_for

        curves, range_probe = _estimated_curves(job, gpu, workload, amp, estimates_cache)
        notes = [f"{gpu.name}: no free GPU of this type to measure on; estimated"] if method == "auto" else []
        if range_probe is not None:
            log.info("%s: the small-batch probes are launch-bound (eager dispatch); one more fake pass at batch %d "
                     "prices the batches near the memory cap", gpu.name, range_probe)
        notes += workload.notes  # what the model source stands in for or leaves out (e.g. YOLO's loss)
        uncertainty = uncertainty_for(gpu)
        if not uncertainty.calibrated_gpu:
            notes.append(_uncalibrated_note(gpu.name, uncertainty))
        return DeviceProfile.from_points(
            gpu=gpu.name,
            method="estimate",
            amp=amp,
            memory_points=curves.memory_points,
            time_points=curves.time_points,
            fit=job.fit,
            notes=notes,
            breakdown_bytes=curves.breakdown_bytes,
            min_memory_bytes=curves.floor_device_bytes,
            time_log_sigma=uncertainty.log_sigma,
            time_model=uncertainty.basis,
        )
    if resolved == "measure":
        import torch

        if device_index is None or not torch.cuda.is_available() or device_index >= torch.cuda.device_count():
            raise ConfigError(
                f"--method measure needs a CUDA GPU of type {gpu.name} (device {device_index}) on the probing "
                "node, and none is usable here (use --method estimate or auto)"
            )
        from torchkit.estimate.overhead import DEFAULT_CUDA_OVERHEAD
        from torchkit.step.measure import measure_curve

        curve = measure_curve(workload, torch.device("cuda", device_index), amp=amp, optimizer=job.optimizer,
                              context_bytes=DEFAULT_CUDA_OVERHEAD.context_bytes)
        notes = (
            [f"{gpu.name}: measured in the default (NCHW) memory format; --channels-last changes estimates only"]
            if job.channels_last
            else []
        )
        return DeviceProfile.from_points(
            gpu=gpu.name,
            method="measure",
            amp=amp,
            memory_points=curve.memory_points,
            time_points=curve.time_points,
            oom_batch=curve.oom_batch,
            fit=job.fit,
            notes=notes,
            time_model="measured",
        )
    raise ConfigError(f"unknown profiling method {method!r} (use auto, measure or estimate)")
