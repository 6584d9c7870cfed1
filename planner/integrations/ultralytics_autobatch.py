"""What the in-job plan of an Ultralytics trainer is made from: Ultralytics' own AutoBatch request, and a
device profile measured by Ultralytics' own AutoBatch probes.

``autobatch_request`` runs the trainer's own ``auto_batch()`` with ``check_train_batch_size`` replaced by a
recorder for the call, so that the image size (stride-aligned, with ``multi_scale``), the AMP dtype, the memory
fraction (``batch`` in (0, 1), else 0.6), the loss-simulation objects per image (detection tasks: the densest
image's labels × 4, for mosaic) and the dataset size are exactly those Ultralytics' single-GPU AutoBatch would
use for this trainer and this dataset, for any task, without restating how each task computes them.

``ultralytics_profile`` then calls Ultralytics' ``check_train_batch_size`` itself on this rank's GPU with that
request, with ``profile_ops`` wrapped to keep every probe's result: the probe batches, the deepcopy in train
mode under autocast, the peak reserved memory and the loss-memory envelope are Ultralytics'. Where Ultralytics
fits one line and keeps one number, batchplan keeps the points (memory and forward+backward time per probe) as
a ``DeviceProfile``, which the planner merges with the other GPU types' profiles. Ultralytics' own choice for
the GPU is kept in the profile's notes.

Built against ultralytics 8.4.190 (``BaseTrainer.auto_batch``, ``DetectionTrainer.auto_batch``,
``utils/autobatch.py``); the names it replaces while it runs are checked to exist first.

Known limitations: as in Ultralytics' AutoBatch, optimizer state and the EMA copy of the weights are not
measured (the fraction, 0.6 by default, leaves room for them); the time of each probe is one forward and
backward pass (``profile_ops(n=1)``), and the first probe, which also pays CUDA's warm-up, is left out of the
time fit.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from planner.errors import ConfigError, InfeasiblePlanError
from planner.job import JobSpec, Method
from planner.profiles.profile import DeviceProfile
from torchkit.hardware.catalog import GpuSpec
from torchkit.step.budget import DEFAULT_FRACTION
from torchkit.units import GIB

AmpName = Literal["bf16", "fp16", "off"]


@dataclass(frozen=True, kw_only=True)
class AutoBatchRequest:
    """The arguments Ultralytics' ``auto_batch`` passes to ``check_train_batch_size``, as plain data (the same on
    every rank; rank 0 records them and broadcasts them)."""

    imgsz: int
    """the probe image side: the largest training size (``multi_scale``), stride-aligned"""
    amp: AmpName
    """autocast of the probes and of training: ``bf16`` (``amp="bf16"``), ``fp16`` (AMP on) or ``off``"""
    batch: float
    """the trainer's ``batch``: a fraction of memory in (0, 1), else the default fraction applies"""
    max_num_obj: int
    """objects per image of the loss-memory simulation (0: none, e.g. classification)"""
    dataset_size: int
    """training images (0: not known to AutoBatch, e.g. classification); Ultralytics caps a batch at it"""

    @property
    def fraction(self) -> float:
        """Share of available memory: Ultralytics' rule (``batch`` if it is in (0, 1), else 0.6)."""
        return self.batch if 0.0 < self.batch < 1.0 else DEFAULT_FRACTION


@contextlib.contextmanager
def _replaced(module: Any, name: str, replacement: Any) -> Iterator[Any]:
    """``module.name`` replaced for the duration; the original is yielded and put back afterwards."""
    original = getattr(module, name, None)
    if original is None:
        import ultralytics

        raise ConfigError(
            f"ultralytics {ultralytics.__version__} has no {module.__name__}.{name}, which batchplan's trainer uses "
            "(built against ultralytics 8.4.190: pip install 'ultralytics>=8.4,<9')"
        )
    setattr(module, name, replacement)
    try:
        yield original
    finally:
        setattr(module, name, original)


def autobatch_request(trainer: Any) -> AutoBatchRequest:
    """The request Ultralytics' single-GPU AutoBatch would make for ``trainer`` (its own ``auto_batch()``, run
    with the call to ``check_train_batch_size`` recorded instead of profiled)."""
    import torch
    import ultralytics.engine.trainer as engine

    recorded: dict[str, Any] = {}
    signature = inspect.signature(getattr(engine, "check_train_batch_size", lambda: None))

    def record(*args: Any, **kwargs: Any) -> int:
        recorded.update(signature.bind(*args, **kwargs).arguments)
        return 1

    with _replaced(engine, "check_train_batch_size", record):
        trainer.auto_batch()
    if not recorded:
        raise ConfigError(
            f"{type(trainer).__name__}.auto_batch() did not call check_train_batch_size, so its "
            "AutoBatch request is unknown (built against ultralytics 8.4.190)"
        )
    amp = recorded.get("amp", True)
    amp_name: AmpName = "bf16" if amp is torch.bfloat16 else ("fp16" if amp else "off")
    return AutoBatchRequest(
        imgsz=int(recorded.get("imgsz", 640)),
        amp=amp_name,
        batch=float(recorded.get("batch", -1)),
        max_num_obj=int(recorded.get("max_num_obj", 0)),
        dataset_size=int(recorded.get("dataset_size", 0)),
    )


def job_for(trainer: Any, request: AutoBatchRequest, *, global_batch: int | None, simulated: bool) -> JobSpec:
    """The job a plan for ``trainer`` describes: the same model, input and precision as ``batchplan plan
    --model ultralytics:FILE.yaml --imgsz N --amp A --optimizer O`` (README, "Ultralytics: batch=-1 on several
    GPUs"), profiled by estimate for simulated GPU types and by Ultralytics' probes (``measure``) on real ones."""
    import sys

    args = trainer.args
    model = str(args.model)
    # Ultralytics' "auto" picks AdamW for short runs (its two moments per weight: the larger state) and MuSGD
    # (one momentum buffer, as SGD) for long ones; the plan is made before the run's length in steps is known
    optimizer = "sgd" if str(args.optimizer).lower() in {"sgd", "musgd", "rmsprop"} else "adamw"
    # channels_last on CUDA unless asked off (BaseTrainer._setup_train, 8.4.190; not auto-enabled on Windows)
    channels_last = args.channels_last is True or (args.channels_last is None and sys.platform != "win32")
    return JobSpec(
        model=model if model.startswith("ultralytics:") else f"ultralytics:{model}",
        imgsz=request.imgsz,
        amp=request.amp,
        optimizer=optimizer,
        fraction=request.fraction,
        global_batch=global_batch,
        method=Method.ESTIMATE if simulated else Method.MEASURE,
        channels_last=channels_last,
    )


def ultralytics_profile(model: Any, request: AutoBatchRequest, gpu: GpuSpec, device: Any) -> DeviceProfile:
    """The memory and time curve of ``model``'s training step on this rank's ``device``, from Ultralytics'
    AutoBatch probes (``check_train_batch_size`` with ``profile_ops`` recorded).

    Raises:
        InfeasiblePlanError: no probe gave a usable point (Ultralytics' own RuntimeError, or no probe ran).
    """
    import torch
    import ultralytics.utils.autobatch as autobatch

    from planner.integrations.ultralytics_batchnorm import plain_batchnorm

    probes: list[tuple[list[int], list[Any]]] = []

    def recording_profile_ops(inputs: Any, ops: Any, *args: Any, **kwargs: Any) -> list[Any]:
        results = real_profile_ops(inputs, ops, *args, **kwargs)
        probes.append(([int(x.shape[0]) for x in inputs], list(results)))
        return results

    amp = torch.bfloat16 if request.amp == "bf16" else request.amp == "fp16"
    with (
        _replaced(autobatch, "profile_ops", recording_profile_ops) as real_profile_ops,
        plain_batchnorm(model),
    ):
        try:
            chosen = autobatch.check_train_batch_size(
                model,
                imgsz=request.imgsz,
                amp=amp,
                batch=request.batch,
                max_num_obj=request.max_num_obj,
                dataset_size=request.dataset_size,
            )
        except RuntimeError as e:  # Ultralytics: no probe produced a usable point
            raise InfeasiblePlanError(f"{gpu.name} ({device}): {e}") from e
    if not probes:
        raise InfeasiblePlanError(
            f"{gpu.name} ({device}): Ultralytics' AutoBatch did not profile (see its warning above: it needs a CUDA "
            "device and torch.backends.cudnn.benchmark=False)"
        )
    batches, results = probes[-1]
    total_bytes = int(torch.cuda.get_device_properties(device).total_memory)
    return profile_from_probes(
        gpu.name, batches, results, total_bytes=total_bytes, request=request, chosen=chosen, where=str(device)
    )


def profile_from_probes(
    gpu_name: str,
    batches: list[int],
    results: list[Any],
    *,
    total_bytes: int,
    request: AutoBatchRequest,
    chosen: int,
    where: str,
) -> DeviceProfile:
    """A device profile from Ultralytics' ``profile_ops`` rows (``[params, GFLOPs, GiB, forward ms, backward
    ms, in, out]`` per probe batch, None where the probe failed): a memory point per usable row (numeric, above
    0, below the device's total), no point at or above the first failure after a success (Ultralytics' memory
    ceiling, kept as ``oom_batch``), and a time point (forward + backward) per usable row but the first.

    Raises:
        InfeasiblePlanError: no usable row.
    """
    import ultralytics

    total_gib = total_bytes / GIB
    memory_points, time_points, oom_batch = [], [], None
    for batch, result in zip(batches, results, strict=True):
        if result is None:
            if memory_points and oom_batch is None:  # the first failure above a success: Ultralytics' ceiling
                oom_batch = batch
            continue
        memory_gib, forward_ms, backward_ms = result[2], result[3], result[4]
        if isinstance(memory_gib, int | float) and 0 < memory_gib < total_gib and oom_batch is None:
            memory_points.append((batch, int(memory_gib * GIB)))
            if math.isfinite(forward_ms + backward_ms):
                time_points.append((batch, (forward_ms + backward_ms) / 1000))
    if not memory_points:
        raise InfeasiblePlanError(
            f"{gpu_name} ({where}): none of Ultralytics' AutoBatch probes {batches} fit "
            "(free GPU memory, reduce imgsz, or set batch explicitly)"
        )
    if len(time_points) >= 3:
        time_points = time_points[1:]  # the first probe also paid CUDA's and cuDNN's warm-up
    notes = (
        f"{gpu_name}: measured by Ultralytics' AutoBatch probes (ultralytics {ultralytics.__version__} "
        f"profile_ops at batches {batches}, loss-memory simulation for {request.max_num_obj} objects per image, "
        f"imgsz {request.imgsz}); optimizer state and the EMA copy are not measured, as in Ultralytics' AutoBatch",
        f"{gpu_name}: Ultralytics' AutoBatch alone picks batch {chosen} for this GPU",
    )
    return DeviceProfile.from_points(
        gpu=gpu_name,
        method="measure",
        amp=request.amp,
        memory_points=memory_points,
        time_points=time_points,
        oom_batch=oom_batch,
        notes=notes,
        time_model="measured",
    )
