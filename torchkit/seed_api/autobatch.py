"""AutoBatch: the largest training batch that fits a fraction of one GPU's memory (Ultralytics' seed, re-done).

The GPU edge around the pure decision in ``torchkit.seed_api.batch_choice``:
- ``run_probes`` runs a ``measure(batch) -> peak_bytes`` callable over the probe list and stops at the first
  out-of-memory error; ``torchkit.step.oom.is_out_of_memory_error`` recognises one by type and by the known CUDA/cuBLAS/cuDNN texts;
- ``autobatch`` / ``check_train_batch_size`` keep the seed's signatures, messages (prefix ``"AutoBatch: "``)
  and guard rails: CPU/MPS and ``cudnn.benchmark`` fall back to ``batch_size`` with the seed's warning, setup
  errors give the seed's "error detected" fallback, nothing usable raises its RuntimeError, the cache is
  emptied in ``finally``.

Where the probing differs from the seed, and why (shared/reference/ultralytics-behaviour.md §1, §5, §6):
- available memory = driver-free + this process's reserved (the newest seed's formula; 8.0-8.4.0 used
  ``total - (reserved + allocated)``, which double-counts and ignores other processes);
- a probe is a real training step: forward, backward **and an optimizer step** (SGD momentum by default, or
  AdamW) on a deepcopy in train mode under the caller's autocast, measured as peak reserved memory after
  ``reset_peak_memory_stats``; the seed measured forward+backward only, as reserved memory at exit, and its
  picks ran out of memory in training (ultralytics#1451, #4679). The first probe runs twice: the first pass
  allocates the optimizer state and the library workspaces, which every later training step holds;
- probing stops at the first out-of-memory error (the seed went on and hit every larger size too);
- inputs are built on the device without ``requires_grad`` (the seed's input gradient does not exist in
  training); ``make_batch(b)`` supplies inputs for models that do not take images.

Known limitations: the probing copy holds the weights a second time (conservative: it stands in for the EMA
copy a YOLO trainer keeps); validation at 2x batch and data-dependent losses are not run; the detection loss
envelope (``max_num_obj``) is the seed's formula, not a measurement. Without a GPU only the loop, the step
and the decision are tested (on CPU, with synthetic measurements).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchkit.errors import WorkloadError
from torchkit.seed_api.batch_choice import (
    DEFAULT_BATCH,
    DEFAULT_FRACTION,
    PREFIX,
    FitMethod,
    check_options,
    choose_batch,
    memory_target_bytes,
    probe_list,
)
from torchkit.step.oom import is_out_of_memory_error
from torchkit.step.options import OptimizerName
from torchkit.step.train_step import make_optimizer, to_device, train_step
from torchkit.units import GIB

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------------
# Probing loop (pure Python around a measure callable)
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ProbeOutcome:
    """One probe: its peak memory, or why it failed."""

    batch: int
    """the probed batch size"""
    peak_bytes: int | None
    """peak memory of the step in bytes; None when it failed"""
    error: str | None = None
    """``"<ExceptionType>: <first line>"`` when it failed"""
    out_of_memory: bool = False
    """the failure was an out-of-memory error (probing stopped there)"""


def run_probes(
    batches: Sequence[int],
    measure: Callable[[int], float],
    *,
    cleanup: Callable[[], None] | None = None,
) -> tuple[ProbeOutcome, ...]:
    """Measure each batch in turn; stop at the first out-of-memory error.

    A failure that is not an out-of-memory error (a BatchNorm layer refusing batch 1, a shape error) is
    logged as a warning and recorded, and probing goes on: the seed (PR #26224) ignores failures below the
    first success, and ``choose_batch`` treats one above it as a ceiling. ``cleanup`` runs after every probe
    (after the exception and its traceback are released), to free the failed step's memory.
    """
    outcomes: list[ProbeOutcome] = []
    for batch in batches:
        error = None
        oom = False
        peak: int | None = None
        try:
            peak = int(measure(batch))
        except Exception as exc:  # a probe may fail in any way; each failure is reported below
            oom = is_out_of_memory_error(exc)
            first_line = (str(exc).strip().splitlines() or [""])[0]
            error = f"{type(exc).__name__}: {first_line}"
        if cleanup is not None:
            cleanup()
        outcomes.append(ProbeOutcome(batch=batch, peak_bytes=peak, error=error, out_of_memory=oom))
        if oom:
            log.info(f"{PREFIX}batch {batch} ran out of memory ({error}); not probing larger batches")
            break
        if error is not None:
            log.warning(f"{PREFIX}batch {batch} failed: {error}")
        else:
            log.debug(f"{PREFIX}batch {batch}: {peak / GIB:.3f}G peak reserved")
    return tuple(outcomes)


def loss_envelope_bytes(
    batch: int, imgsz: int, strides: Sequence[int], num_classes: int, max_num_obj: int
) -> int:
    """The seed's loss/assigner memory for a detection head (shared/reference/ultralytics-behaviour.md §2.20 step 5).

    ``B · A · 6 · (max_num_obj + 2·nc) · 4`` bytes with ``A = Σ_s (imgsz/s)²`` anchors; the 6 covers the
    assigner's metric/top-k state and the BCE path under AMP, the 2× on nc validation at up to 2× batch.
    """
    anchors = sum((imgsz // int(s)) ** 2 for s in strides)
    return batch * anchors * 6 * (max_num_obj + 2 * num_classes) * 4


# --------------------------------------------------------------------------------------------------------
# GPU edge
# --------------------------------------------------------------------------------------------------------


def input_channels(model: torch.nn.Module) -> int:
    """Image channels: ``model.yaml["channels"]`` (Ultralytics models), else the first Conv2d's, else 3."""
    import torch

    spec = getattr(model, "yaml", None)
    if isinstance(spec, dict) and "channels" in spec:
        return int(spec["channels"])
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            return int(module.in_channels)
    return 3


def image_batch_factory(
    model: torch.nn.Module, imgsz: int, device: torch.device
) -> Callable[[int], torch.Tensor]:
    """``make_batch`` for image models: random ``(b, ch, imgsz, imgsz)`` float32 images on ``device``."""
    import torch

    channels = input_channels(model)
    return lambda batch: torch.rand(batch, channels, imgsz, imgsz, device=device)


def _call_model(model: torch.nn.Module, inputs: Any) -> Any:
    """``model(x)`` for a tensor, ``model(*x)`` for a tuple/list, ``model(**x)`` for a dict (the seed's inputs)."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def surrogate_loss(output: Any, _targets: Any = None) -> torch.Tensor:
    """The probe's loss: the sum of every floating-point tensor in the output that needs a gradient (the
    seed's choice), in float32."""
    tensors = [t for t in _tensors_in(output) if t.is_floating_point() and t.requires_grad]
    if not tensors:
        raise WorkloadError(
            f"the model's output ({type(output).__name__}) holds no floating-point tensor that needs a gradient "
            "(AutoBatch back-propagates the sum of its outputs; put the model in train mode with trainable weights)"
        )
    return sum(t.float().sum() for t in tensors)


def probe_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, inputs: Any) -> None:
    """One training step as a probe (``torchkit.step.train_step.train_step`` with the surrogate loss, under the
    caller's autocast), then the gradients freed so that a probe leaves only weights and optimizer state.

    ``inputs`` is a tensor (``model(x)``), a tuple/list (``model(*x)``) or a dict (``model(**x)``).
    """
    train_step(model, optimizer, inputs, None, surrogate_loss, amp="off", forward=_call_model)
    model.zero_grad(set_to_none=True)


def _tensors_in(value: Any) -> Iterator[torch.Tensor]:
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors_in(item)
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors_in(item)


def build_optimizer(model: torch.nn.Module, name: OptimizerName | None) -> torch.optim.Optimizer | None:
    """The probe's optimizer over the trainable weights, so its state is counted; None for ``None``.

    It is the one training step's optimizer (``torchkit.step.train_step.make_optimizer``: SGD momentum with
    weight decay, or AdamW, foreach): SGD keeps one buffer per weight, AdamW two.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if name is None or not params:
        return None
    return make_optimizer(name, params)


def _model_device(model: torch.nn.Module) -> torch.device:
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    raise WorkloadError("the model has no parameters or buffers, so AutoBatch cannot tell its device")


def _gpu_measure(model, device, accelerator, make_batch, optimizer_name, envelope):
    """``measure(batch) -> peak reserved bytes`` and ``cleanup()`` for one device (needs an accelerator)."""
    optimizer = build_optimizer(model, optimizer_name)
    has_peak = hasattr(accelerator, "max_memory_reserved") and hasattr(accelerator, "reset_peak_memory_stats")
    warmed = False

    def cleanup() -> None:
        model.zero_grad(set_to_none=True)
        gc.collect()
        accelerator.empty_cache()

    def measure(batch: int) -> int:
        nonlocal warmed
        if not warmed:  # allocates optimizer state and library workspaces, as every later step holds them
            probe_step(model, optimizer, to_device(make_batch(batch), device))
            warmed = True
        cleanup()
        if has_peak:
            accelerator.reset_peak_memory_stats(device)
        probe_step(model, optimizer, to_device(make_batch(batch), device))
        accelerator.synchronize(device)
        peak = accelerator.max_memory_reserved(device) if has_peak else accelerator.memory_reserved(device)
        return int(peak) + envelope(batch)

    return measure, cleanup


def _envelope_for(model, imgsz: int, max_num_obj: int) -> Callable[[int], int]:
    strides, names = getattr(model, "stride", None), getattr(model, "names", None)
    if not max_num_obj or strides is None or names is None:
        return lambda batch: 0
    strides = [int(s) for s in (strides.tolist() if hasattr(strides, "tolist") else strides)]
    return lambda batch: loss_envelope_bytes(batch, imgsz, strides, len(names), max_num_obj)


def _device_memory(device: torch.device) -> tuple[Any, int, int, int, str]:
    """(accelerator module, device index, total bytes, available bytes, label) of ``device``, logged.
    Available = driver-free + what this process already reserved."""
    from torchkit.seed_api.device import get_torch_device_backend

    accelerator = get_torch_device_backend(device)
    index = device.index if device.index is not None else accelerator.current_device()
    properties = accelerator.get_device_properties(index)
    total = int(properties.total_memory)
    reserved = int(accelerator.memory_reserved(index))
    available = (
        reserved + int(accelerator.mem_get_info(index)[0]) if hasattr(accelerator, "mem_get_info") else total
    )
    label = f"{device.type.upper()}:{index}"
    log.info(
        f"{PREFIX}{label} ({properties.name}) {total / GIB:.2f}G total, {reserved / GIB:.2f}G reserved, "
        f"{available / GIB:.2f}G available"
    )
    return accelerator, index, total, available, label


def _choose_and_log(
    outcomes,
    *,
    total: int,
    available: int,
    fraction: float,
    fit: FitMethod,
    dataset_size: int,
    multiple_of: int,
    batch_size: int,
    label: str,
) -> int:
    """The batch chosen from the probes' outcomes (``choose_batch``), with the seed's log lines."""
    choice = choose_batch(
        [o.batch for o in outcomes],
        [o.peak_bytes for o in outcomes],
        total_bytes=total,
        available_bytes=available,
        fraction=fraction,
        fit=fit,
        dataset_size=dataset_size,
        multiple_of=multiple_of,
        default_batch=batch_size,
    )
    for point in choice.outliers:
        log.info(f"{PREFIX}batch {point.batch} ({point.value / GIB:.3f}G) is {point.reason}")
    for note in choice.warnings:
        log.warning(f"{PREFIX}{note}")
    t, share = total / GIB, choice.predicted_fraction_of_total
    if choice.predicted_bytes > 0:  # not after the seed rules' "error detected" fallback
        log.info(
            f"{PREFIX}Using batch-size {choice.batch} for {label} {t * share:.2f}G/{t:.2f}G ({share * 100:.0f}%) ✅"
        )
    return choice.batch


def _can_probe(device: torch.device, batch_size: int) -> bool:
    """False (with the seed's warning) where autobatch answers the default: CPU/MPS, or cudnn.benchmark on."""
    import torch

    if device.type in {"cpu", "mps"}:
        log.warning(f"{PREFIX}intended for GPU devices, using default batch-size {batch_size}")
        return False
    if device.type == "cuda" and torch.backends.cudnn.benchmark:
        log.warning(
            f"{PREFIX}Requires torch.backends.cudnn.benchmark=False, using default batch-size {batch_size}"
        )
        return False
    return True


def autobatch(
    model: torch.nn.Module,
    imgsz: int = 640,
    fraction: float = DEFAULT_FRACTION,
    batch_size: int = DEFAULT_BATCH,
    max_num_obj: int = 1,
    dataset_size: int = 0,
    *,
    fit: FitMethod = "affine",
    optimizer: OptimizerName | None = "sgd",
    make_batch: Callable[[int], Any] | None = None,
    multiple_of: int = 1,
) -> int:
    """The largest batch whose training step fits ``fraction`` of the available memory of the model's GPU.

    Probes batches 1..16 (1..64 on cards of 16 GiB or more) with real training steps on a deepcopy of the
    model in train mode, under the caller's autocast (``check_train_batch_size`` sets it), and fits peak
    memory against batch. Returns ``batch_size`` on CPU/MPS, with ``cudnn.benchmark`` on, or when the probes
    cannot even be set up (each with the seed's warning).

    Args:
        model: the model, on its training device.
        imgsz: square image size of the probe inputs (ignored with ``make_batch``).
        fraction: share of available memory (driver-free + reserved by this process) to fill.
        batch_size: the fallback.
        max_num_obj: adds the seed's loss envelope for detection models (those with ``stride`` and ``names``).
        dataset_size: when > 0, no probe and no result above it.
        fit: decision rule, see ``choose_batch``.
        optimizer: ``"sgd"`` (default), ``"adamw"``, or None for forward+backward only (the seed's probe).
        make_batch: ``make_batch(b)`` -> the model's input for batch ``b`` (a tensor, a tuple of positional
            arguments or a dict of keyword arguments), for models that do not take images.
        multiple_of: round the batch down to a multiple of this.

    Raises:
        RuntimeError: no probe ran (the seed's message), or no multiple of ``multiple_of`` fits.
    """

    log.info(
        f"{PREFIX}Computing optimal batch size for imgsz={imgsz} at {fraction * 100}% GPU memory utilization."
    )
    check_options(fit, fraction=fraction, dataset_size=dataset_size, multiple_of=multiple_of)
    device = _model_device(model)
    if not _can_probe(device, batch_size):
        return batch_size

    accelerator, index, total, available, label = _device_memory(device)
    batches = probe_list(total, dataset_size)
    try:
        probes = _set_up_probes(
            model,
            device,
            accelerator,
            imgsz=imgsz,
            make_batch=make_batch,
            optimizer=optimizer,
            max_num_obj=max_num_obj,
            label=label,
            batch_size=batch_size,
        )
        if probes is None:
            return batch_size
        measure, cleanup = probes
        outcomes = run_probes(batches, measure, cleanup=cleanup)
        del measure, cleanup, probes
        return _choose_and_log(
            outcomes,
            total=total,
            available=available,
            fraction=fraction,
            fit=fit,
            dataset_size=dataset_size,
            multiple_of=multiple_of,
            batch_size=batch_size,
            label=label,
        )
    finally:
        gc.collect()
        accelerator.empty_cache()


def _set_up_probes(
    model: torch.nn.Module,
    device,
    accelerator,
    *,
    imgsz: int,
    make_batch: Callable[[int], Any] | None,
    optimizer: OptimizerName | None,
    max_num_obj: int,
    label: str,
    batch_size: int,
) -> tuple[Callable[[int], int], Callable[[], None]] | None:
    """``measure`` and ``cleanup`` of the probes (``_gpu_measure``) on a deepcopy of ``model`` in train mode;
    None, with the seed's warning that ``batch_size`` is used, when they cannot be set up (seed §1.2 step 9).

    Raises:
        RuntimeError: not even the model's copy fits on the device (``label``): batch 16 would not either.
    """
    try:
        probe_model = copy.deepcopy(model).train()
        make = make_batch or image_batch_factory(probe_model, imgsz, device)
        return _gpu_measure(
            probe_model,
            device,
            accelerator,
            make,
            optimizer,
            _envelope_for(probe_model, imgsz, max_num_obj),
        )
    except Exception as exc:  # seed §1.2 step 9: the probes cannot be set up
        if is_out_of_memory_error(exc):  # not even the model's copy fits: 16 would not either
            raise RuntimeError(
                f"{PREFIX}copying the model for probing ran out of memory on {label}: free GPU memory "
                "or set batch explicitly"
            ) from exc
        log.warning(f"{PREFIX}error detected: {exc},  using default batch-size {batch_size}.")
        return None


def check_train_batch_size(
    model: torch.nn.Module,
    imgsz: int = 640,
    amp: bool | torch.dtype = True,
    batch: float = -1,
    max_num_obj: int = 1,
    dataset_size: int = 0,
    *,
    fit: FitMethod = "affine",
    optimizer: OptimizerName | None = "sgd",
    make_batch: Callable[[int], Any] | None = None,
    multiple_of: int = 1,
) -> int:
    """``autobatch`` under the training's autocast; ``batch`` in (0, 1) is the memory fraction, else 0.60.

    ``amp`` is a bool (fp16 autocast) or a dtype (``torch.bfloat16``), as the trainer passes it. The
    keyword-only options are ``autobatch``'s.
    """
    from torchkit.seed_api.precision import autocast

    fraction = batch if 0.0 < batch < 1.0 else DEFAULT_FRACTION
    device = _model_device(model)
    # autobatch returns before probing on CPU/MPS: no autocast there (it would only log MPS warnings)
    context = contextlib.nullcontext() if device.type in {"cpu", "mps"} else autocast(amp, device.type)
    with context:
        return autobatch(
            model,
            imgsz,
            fraction=fraction,
            max_num_obj=max_num_obj,
            dataset_size=dataset_size,
            fit=fit,
            optimizer=optimizer,
            make_batch=make_batch,
            multiple_of=multiple_of,
        )


# --------------------------------------------------------------------------------------------------------
# The same answer without the GPU
# --------------------------------------------------------------------------------------------------------


def estimate_batch(
    workload: Any,
    gpu: Any = "T4",
    fraction: float = DEFAULT_FRACTION,
    *,
    amp: str | None = None,
    optimizer: OptimizerName = "sgd",
    imgsz: int | None = None,
    available_bytes: int | None = None,
    dataset_size: int = 0,
    multiple_of: int = 1,
    max_batch: int = 1024,
) -> int:
    """AutoBatch's answer for a GPU you do not have: the largest batch whose *estimated* training-step memory
    fits ``fraction`` of the GPU's available memory, from fake-tensor passes (``torchkit.estimate``).

    Args:
        workload: a ``torchkit.workloads.Workload`` or a workload name (``resnet50``, ``pkg.mod:factory``).
        gpu: a catalog type name or NVML alias (``T4``, ``NVIDIA A100-SXM4-80GB``) or a ``GpuSpec``.
        fraction: share of the available memory to fill, in (0, 1] (Ultralytics' default 0.60).
        amp: ``fp16``, ``bf16`` or ``off``; default bf16 where the GPU supports it, else fp16.
        available_bytes: memory free for the job (default: the GPU's total, an idle card).
        max_batch: upper clamp, the seed's 1024.

    Returns:
        The batch; the same decision rule as ``autobatch`` (``torchkit.seed_api.batch_choice.choose_batch``, affine
        fit) applied to estimated instead of measured probes.

    Raises:
        ConfigError: unknown GPU type, bf16 on a GPU without it, bad fraction.
        WorkloadError: the workload cannot be built or run.
        RuntimeError: not even the smallest probe fits.
    """
    from torchkit.estimate import estimate_curves
    from torchkit.hardware.catalog import GpuSpec, load_catalog
    from torchkit.workloads import get_workload

    spec = gpu if isinstance(gpu, GpuSpec) else load_catalog().get(str(gpu))
    if isinstance(workload, str):
        workload = get_workload(workload, imgsz=imgsz)
    amp = amp or ("bf16" if spec.supports_bf16 else "fp16")
    curves = estimate_curves(workload, spec, amp=amp, optimizer=optimizer)
    batches = [b for b, _ in curves.memory_points]
    choice = choose_batch(
        batches,
        [v for _, v in curves.memory_points],
        total_bytes=spec.memory_bytes,
        available_bytes=spec.memory_bytes if available_bytes is None else available_bytes,
        fraction=fraction,
        fit="affine",
        dataset_size=dataset_size,
        multiple_of=multiple_of,
        max_batch=max_batch,
    )
    budget = memory_target_bytes(fraction, spec.memory_bytes if available_bytes is None else available_bytes)
    if curves.floor_device_bytes > budget:
        # the optimizer step alone (weights, gradients, state) does not fit, whatever the batch
        raise RuntimeError(
            f"{PREFIX}no batch fits {workload.name} on {spec.name}: a training step needs at least "
            f"{curves.floor_device_bytes / GIB:.2f}G, the budget is {budget / GIB:.2f}G "
            "(use a larger GPU, a smaller model, or a higher fraction)"
        )
    log.info(
        "%sestimated batch-size %d for %s on %s (%s, %s): %.2fG predicted of %.2fG",
        PREFIX,
        choice.batch,
        workload.name,
        spec.name,
        amp,
        optimizer,
        choice.predicted_bytes / GIB,
        spec.memory_bytes / GIB,
    )
    return choice.batch
