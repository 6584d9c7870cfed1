"""The estimator's public functions: one fake pass of a training step → memory, FLOPs and bytes; then, for
any catalog GPU, device memory and step time, and the curves over batch size.

A fake pass copies the model, built once outside fake mode (:mod:`torchkit.workloads.construct`: on the
meta device, else on the CPU, so constructors that read values work), with fake parameters and buffers,
builds the optimizer and batch under ``FakeTensorMode`` (no memory, no compute), runs
the training step of :mod:`torchkit.step.train_step` under :class:`MemoryTracker` (an optimizer step on zero
gradients creates the optimizer state, then one full iteration: forward, backward, step), and records every
operator's FLOPs and bytes of that iteration. It does not depend on the GPU: a ``StepEstimate``
is computed once per (workload, batch, amp, optimizer) and priced for many GPUs by
:func:`cuda_device_bytes` and :func:`step_time_s` (pure arithmetic). :func:`estimate_steps` takes a cache
dict keyed by (fingerprint, batch, amp, optimizer) for that reuse.

A CPU build cannot make fake CUDA tensors, so the pass runs on fake CPU tensors with CPU autocast in the
requested dtype; what differs on CUDA (allocator rounding and caching, context, cuBLAS/cuDNN workspace)
is the overhead model of :mod:`torchkit.estimate.overhead`.

Known limitations:
- Data-dependent operators (``nonzero``, boolean-mask indexing, ``.item()``, Python branches on tensor
  values) cannot run on fake tensors; such a model raises ``WorkloadError`` naming the operator (the
  reference workloads are written without them, see ``workloads/yolo.py``).
- CPU autocast and CUDA autocast lower the same matmul/convolution/attention operators to 16 bits but
  differ on a few others (CUDA keeps e.g. ``layer_norm`` and ``softmax`` outputs in fp32, CPU keeps some
  in 16 bits); activations of such layers can differ by that factor.
- CPU ``batch_norm`` kernels may save different auxiliaries than cuDNN's (a few per-channel vectors).
- Attention: the pass is made for a *target*. ``target="cuda"`` (the default: what the planner prices)
  runs ``scaled_dot_product_attention`` as CUDA's flash / memory-efficient kernel would, whatever path CPU
  would take (CPU's flash refuses dropout, so CPU stores the s×s probabilities and masks);
  ``target="cpu"`` runs it as CPU does (what a real CPU step peaks at). See :mod:`torchkit.estimate.attention`.
- GradScaler, EMA, validation and data-loader memory are not part of the step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torchkit.errors import UserError, WorkloadError
from torchkit.estimate.attention import AttentionTarget
from torchkit.estimate.op_costs import KernelCost, OpCost, OpCostRecorder, aggregate
from torchkit.hardware.catalog import GpuSpec
from torchkit.step.options import AmpMode, OptimizerName
from torchkit.step.train_step import StepHooks, check_options

log = logging.getLogger(__name__)

ESTIMATOR_MIN_TORCH = "2.4.0"
"""Oldest torch the estimator supports (also pyproject's floor). It needs: ``TorchDispatchMode``,
``FakeTensorMode`` and storage weak references (torch 2.0), ``torch.utils.flop_counter.flop_registry`` with
its SDPA formulas and the CPU flash-attention operators (2.2+), CPU autocast in float16 (absent from the
oldest 2.x releases). Tested on torch 2.13 only (the version this project is developed with)."""

DEFAULT_PROBE_BATCHES: tuple[int, ...] = (32, 128, 512)
"""Probe batches of :func:`estimate_curves`. Peak memory is a convex, piecewise-affine function of the
batch: the peak is the largest of ``a(t)·b + c(t)`` over the moments t of the step, so it moves (from the
optimizer step at tiny batches to the start of backward) and the slope settles at its largest value. A
fake pass costs the same at any batch (and no memory), so the probes sit where the slope has settled: on
five reference workloads the three points are exactly colinear, on ResNet-18 within 0.5% (its peak moves
between operators up to batch ~128; at 16/64/256 it is 1.1% off).
Below the smallest probe the fit can undershoot (the optimizer-step peak does not shrink with the
batch): ``EstimatedCurves.floor_device_bytes`` is that floor."""


@dataclass(frozen=True, kw_only=True)
class StepEstimate:
    """What one fake pass of a training step says (GPU-independent)."""

    workload: str
    """workload name"""
    batch: int
    amp: str
    optimizer: str
    peak_allocated_bytes: int
    """peak live tensor bytes of a training step with optimizer state present (every iteration after the
    first), fake tensors, exact bytes"""
    breakdown_bytes: dict[str, int]
    """category -> bytes live at that peak: parameters, buffers, inputs, gradients, optimizer_state,
    activations, temporaries (categories with no bytes are left out); sums to ``peak_allocated_bytes``"""
    flops: int
    """FLOPs of one step (forward + backward + optimizer) by torch's formulas (matmul/conv/attention)"""
    bytes_moved: int
    """bytes read + written by all operators of one step"""
    op_costs: tuple[OpCost, ...]
    """per aten operator: count, FLOPs, bytes (largest FLOPs first)"""
    wall_s: float
    """how long the fake pass took"""
    peak_phase: str = ""
    """forward / backward / optimizer: where the peak happened"""
    peak_op: str = ""
    """the operator at the peak"""
    cpu_peak_with_workspace_bytes: int = 0
    """peak with the CPU kernel-workspace model's transient bytes (what a real CPU step needs)"""
    cpu_peak_op: str = ""
    """the operator at that CPU peak"""
    cuda_peak_with_workspace_bytes: int = 0
    """peak with live bytes rounded to 512-byte CUDA blocks and the cuDNN workspace model added"""
    cuda_rounded_peak_bytes: int = 0
    """peak with live bytes rounded to 512-byte blocks, no workspace"""
    optimizer_peak_bytes: int = 0
    """peak while the optimizer steps: a floor the step needs at any batch (parameters, gradients,
    optimizer state and the optimizer's temporaries; plus this batch's inputs)"""
    kernels: tuple[KernelCost, ...] = field(default=(), repr=False)
    """every kernel of the step in order (what the roofline prices)"""
    num_params: int = 0
    """trainable parameter elements"""
    margin_bytes: int = 0
    """the workload's margin for memory the simulated step does not hold (``Workload.margin_bytes``);
    added to the device bytes, not to the CPU peak (a real CPU step does not hold it either)"""
    target: str = "cuda"
    """the device kind the pass was made for: ``cuda`` (attention as CUDA's fused kernels run it) or ``cpu``"""
    cuda_attention_calls: int = 0
    """attention calls run as a CUDA kernel would (0 for a CPU target, or a model without SDPA)"""


def check_estimator_torch(version: str | None = None) -> None:
    """Raise ``UserError`` if ``version`` (default: the installed torch) is older than ESTIMATOR_MIN_TORCH."""
    from torchkit.versions import check_torch_version

    if not check_torch_version(version, minimum=ESTIMATOR_MIN_TORCH):
        import torch

        raise UserError(
            f"the estimator needs torch >= {ESTIMATOR_MIN_TORCH}, found {version or torch.__version__} "
            "(pip install -U torch, or use --method measure on a GPU)"
        )


def estimate_step(
    workload: Any,
    batch: int,
    *,
    amp: AmpMode = "off",
    optimizer: OptimizerName = "sgd",
    target: AttentionTarget = "cuda",
) -> StepEstimate:
    """One fake pass: memory, FLOPs and bytes of a training step of ``workload`` at ``batch`` for ``target``.

    Raises:
        WorkloadError: the model cannot be built or run on fake tensors (with the cause).
        ConfigError: unknown amp mode, optimizer or target.
        UserError: torch older than ``ESTIMATOR_MIN_TORCH``.
    """
    _check_request(batch, amp, optimizer, target)
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torchkit.estimate.memory_tracker import MemoryCategory
    from torchkit.step.train_step import make_optimizer
    from torchkit.workloads.construct import fake_copy

    start = time.perf_counter()
    recorder = OpCostRecorder()
    tracker = _memory_tracker(recorder)
    template = _template(workload)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    model = fake_copy(template, mode)
    with mode:
        params = _fake_trainable_params(workload, model)
        opt = make_optimizer(optimizer, params)
        inputs, targets = _fake_batch(workload, batch)
        tracker.register(model.parameters(), MemoryCategory.PARAMETERS)
        tracker.register(model.buffers(), MemoryCategory.BUFFERS)
        tracker.register(torch.utils._pytree.tree_flatten((inputs, targets))[0], MemoryCategory.INPUTS)
        attention = _run_fake_training(
            workload,
            batch,
            model,
            opt,
            inputs,
            targets,
            amp=amp,
            target=target,
            tracker=tracker,
            recorder=recorder,
        )
        num_params = sum(p.numel() for p in params)
        del model, opt, inputs, targets, params
    result = tracker.result(from_iteration=1)
    kernels = tuple(recorder.kernels)
    return StepEstimate(
        workload=workload.name,
        batch=batch,
        amp=amp,
        optimizer=optimizer,
        peak_allocated_bytes=result.peak.peak_bytes,
        breakdown_bytes=result.peak.breakdown_bytes,
        flops=sum(k.flops for k in kernels),
        bytes_moved=sum(k.bytes_moved for k in kernels),
        op_costs=aggregate(kernels),
        wall_s=time.perf_counter() - start,
        peak_phase=result.peak.phase,
        peak_op=result.peak.op,
        cpu_peak_with_workspace_bytes=result.workspace_peaks["cpu"].peak_bytes,
        cpu_peak_op=result.workspace_peaks["cpu"].op,
        cuda_peak_with_workspace_bytes=result.workspace_peaks["cuda"].peak_bytes,
        cuda_rounded_peak_bytes=result.rounded_peak_bytes,
        optimizer_peak_bytes=result.phase_peak_bytes.get("optimizer", 0),
        kernels=kernels,
        num_params=int(num_params),
        margin_bytes=int(getattr(workload, "margin_bytes", 0)),
        target=target,
        cuda_attention_calls=attention.total,
    )


def _memory_tracker(recorder: OpCostRecorder) -> Any:
    """A ``MemoryTracker`` that also keeps each device's peak with its kernel workspaces (CUDA's with the live
    bytes rounded to its caching allocator's 512-byte blocks) and tells ``recorder`` every op."""
    from torchkit.estimate.memory_tracker import MemoryTracker
    from torchkit.estimate.overhead import cpu_kernel_workspace_bytes, cuda_kernel_workspace_bytes

    return MemoryTracker(
        {"cpu": cpu_kernel_workspace_bytes, "cuda": cuda_kernel_workspace_bytes},
        workspace_block_bytes={"cpu": 1, "cuda": 512},
        op_observer=recorder,
    )


def _run_fake_training(
    workload: Any,
    batch: int,
    model: Any,
    opt: Any,
    inputs: Any,
    targets: Any,
    *,
    amp: AmpMode,
    target: AttentionTarget,
    tracker: Any,
    recorder: OpCostRecorder,
) -> Any:
    """The training iterations on fake tensors, watched by ``tracker`` and ``recorder``, with attention priced
    as on ``target``; returns the attention ledger (its CUDA attention calls).

    Raises:
        WorkloadError: the step failed on fake tensors (with the cause and what to do).
    """
    from torchkit.estimate.attention import attention_as
    from torchkit.estimate.rnn_workspace import RnnWorkspaceMode
    from torchkit.step.train_step import run_training_iterations

    hooks = _TrackerHooks(tracker, recorder)
    try:
        with RnnWorkspaceMode(), tracker, attention_as(target) as attention:
            run_training_iterations(
                model, opt, inputs, targets, workload.loss_fn, amp=amp, hooks=hooks, warm_start=True
            )
    except WorkloadError:
        raise
    except Exception as e:
        raise WorkloadError(
            f"training step of {workload.name!r} at batch {batch} failed on fake tensors: {type(e).__name__}: "
            f"{_first_line(e)} (data-dependent ops such as nonzero/.item()/boolean indexing cannot be "
            "estimated; use --method measure, or make the model shape-static)"
        ) from e
    return attention


def _check_request(batch: Any, amp: str, optimizer: str, target: str) -> None:
    """What ``estimate_step`` refuses before it builds anything (see its Raises)."""
    from torchkit.estimate.attention import TARGETS

    check_estimator_torch()
    check_options(amp, optimizer)
    if target not in TARGETS:
        from torchkit.errors import ConfigError

        raise ConfigError(f"unknown estimate target {target!r} (use one of: {', '.join(TARGETS)})")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise WorkloadError(f"batch size must be a positive integer, got {batch!r}")


def _fake_trainable_params(workload: Any, model: Any) -> list:
    """The model's trainable parameters, after checking that it holds only fake tensors and has some."""
    from torch._subclasses.fake_tensor import FakeTensor

    params = [p for p in model.parameters() if p.requires_grad]
    real = [
        n for n, t in [*model.named_parameters(), *model.named_buffers()] if not isinstance(t, FakeTensor)
    ]
    if real:
        raise WorkloadError(
            f"model {workload.name!r} holds real tensors ({', '.join(real[:3])}...) the estimator cannot use "
            "(build the architecture in the factory; load weights elsewhere)"
        )
    if not params:
        raise WorkloadError(
            f"model {workload.name!r} has no trainable parameters (a training step needs some; check the factory)"
        )
    return params


def _fake_batch(workload: Any, batch: int) -> tuple[Any, Any]:
    """``workload.make_batch(batch)`` under the caller's fake mode, its failure as a WorkloadError."""
    try:
        return workload.make_batch(batch)
    except Exception as e:
        raise WorkloadError(
            f"input builder of {workload.name!r} failed at batch {batch}: {type(e).__name__}: {_first_line(e)} "
            "(make_batch must build its tensors with torch.rand*/randint so that fake tensors can stand in)"
        ) from e


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


def _template(workload: Any) -> Any:
    """The model built outside fake mode (see :mod:`torchkit.workloads.construct`)."""
    from torchkit.workloads import model_template

    return model_template(workload)


class _TrackerHooks(StepHooks):
    """Tells the tracker the phase and iteration, marks gradients and optimizer state, records op costs
    in the last iteration."""

    def __init__(self, tracker: Any, recorder: OpCostRecorder) -> None:
        from torchkit.estimate.memory_tracker import MemoryCategory, Phase

        self._tracker, self._recorder = tracker, recorder
        self._category, self._phase = MemoryCategory, Phase

    def iteration(self, index: int) -> None:
        from torchkit.step.train_step import NUM_ITERATIONS

        self._tracker.set_iteration(index)
        self._recorder.enabled = index == NUM_ITERATIONS - 1

    def forward(self) -> None:
        self._tracker.set_phase(self._phase.FORWARD)
        self._recorder.phase = "forward"

    def backward(self) -> None:
        self._tracker.set_phase(self._phase.BACKWARD)
        self._recorder.phase = "backward"

    def after_backward(self, params: list) -> None:
        self._tracker.mark((p.grad for p in params), self._category.GRADIENTS)

    def optimizer(self) -> None:
        self._tracker.set_phase(self._phase.OPTIMIZER)
        self._recorder.phase = "optimizer"

    def after_step(self, optimizer: Any) -> None:
        from torchkit.step.train_step import optimizer_state_tensors

        self._tracker.mark(optimizer_state_tensors(optimizer), self._category.OPTIMIZER_STATE)


def cpu_peak_bytes(estimate: StepEstimate) -> int:
    """What a real CPU training step peaks at: the fake peak plus the CPU kernel-workspace model.

    Raises:
        ValueError: the estimate ran attention as CUDA does (``target="cuda"`` on a model that calls SDPA),
            so it is not what a CPU step holds; estimate with ``target="cpu"``.
    """
    if estimate.cuda_attention_calls:
        raise ValueError(
            f"this estimate of {estimate.workload!r} prices {estimate.cuda_attention_calls} attention calls as CUDA "
            "runs them; a CPU peak needs estimate_step(..., target='cpu')"
        )
    return max(estimate.cpu_peak_with_workspace_bytes, estimate.peak_allocated_bytes)


def cuda_device_bytes(estimate: StepEstimate, gpu: GpuSpec, *, overhead: Any = None) -> int:
    """Device memory the step needs on ``gpu``: reserved (allocator rounding, cuDNN workspace,
    fragmentation) + CUDA context + cuBLAS workspace. See :mod:`torchkit.estimate.overhead`;
    ``overhead`` overrides its ``DEFAULT_CUDA_OVERHEAD`` (a calibrated ``CudaOverhead``)."""
    from torchkit.estimate.overhead import DEFAULT_CUDA_OVERHEAD, device_bytes_from_peak

    peak = max(
        estimate.cuda_peak_with_workspace_bytes,
        estimate.cuda_rounded_peak_bytes,
        estimate.peak_allocated_bytes,
    )
    return device_bytes_from_peak(peak + estimate.margin_bytes, gpu, overhead or DEFAULT_CUDA_OVERHEAD)


def step_time_s(
    estimate: StepEstimate, gpu: GpuSpec, *, channels_last: bool = False, constants: Any = None
) -> float:
    """Roofline step time on ``gpu`` (see :mod:`torchkit.estimate.roofline`) with the calibrated constants of
    its architecture (:mod:`torchkit.estimate.time_model`) unless ``constants`` (a ``TimeConstants``) is
    given; ``channels_last``: the model and batch are in NHWC memory format."""
    from torchkit.estimate.roofline import kernels_time_s
    from torchkit.estimate.time_model import constants_for

    return kernels_time_s(
        estimate.kernels,
        gpu,
        amp=estimate.amp,
        channels_last=channels_last,
        constants=constants if constants is not None else constants_for(gpu),
    )


def backward_share(
    estimate: StepEstimate, gpu: GpuSpec, *, channels_last: bool = False, constants: Any = None
) -> float | None:
    """Share of the forward + backward roofline time (``step_time_s``'s pricing, the optimizer left out) that
    is the backward pass's kernels: what DDP's all-reduces can overlap. None where the kernels do not say
    which pass ran them (an estimate made before they did) or one pass has none."""
    from torchkit.estimate.roofline import kernels_time_s
    from torchkit.estimate.time_model import constants_for

    options = {
        "amp": estimate.amp,
        "channels_last": channels_last,
        "constants": constants if constants is not None else constants_for(gpu),
    }
    forward = [k for k in estimate.kernels if k.phase == "forward"]
    backward = [k for k in estimate.kernels if k.phase == "backward"]
    if not forward or not backward:
        return None
    forward_s, backward_s = kernels_time_s(forward, gpu, **options), kernels_time_s(backward, gpu, **options)
    return backward_s / (forward_s + backward_s)


@dataclass(frozen=True, kw_only=True)
class EstimatedCurves:
    """Estimated memory and time over batch size on one GPU type."""

    memory_points: tuple[tuple[int, int], ...]
    """(batch, device bytes on the GPU) per probe"""
    time_points: tuple[tuple[int, float], ...]
    """(batch, step seconds on the GPU) per probe"""
    allocated_points: tuple[tuple[int, int], ...]
    """(batch, fake peak allocated bytes) per probe"""
    breakdown_bytes: dict[str, int]
    """category -> bytes at the peak of the largest probe"""
    num_fake_passes: int
    """fake passes run for these curves (0 when every probe came from the cache)"""
    floor_device_bytes: int = 0
    """device bytes the step needs at any batch (the optimizer-step peak, smallest probe): an affine fit
    through ``memory_points`` can fall below it at batches under the smallest probe; use
    ``max(fit(b), floor_device_bytes)`` there"""
    backward_shares: tuple[tuple[int, float], ...] = ()
    """(batch, ``backward_share``) per probe whose kernels tell the passes apart"""


def estimate_steps(
    workload: Any,
    batches: Sequence[int] = DEFAULT_PROBE_BATCHES,
    *,
    amp: AmpMode = "off",
    optimizer: OptimizerName = "sgd",
    estimates_cache: MutableMapping[tuple, StepEstimate] | None = None,
    target: AttentionTarget = "cuda",
) -> tuple[tuple[StepEstimate, ...], int]:
    """``estimate_step`` for each batch, reusing ``estimates_cache`` (key: fingerprint, batch, amp,
    optimizer, target). Returns the estimates (in the order of ``batches``) and the number of fake passes run."""
    from torchkit.workloads import workload_fingerprint

    key_base = workload_fingerprint(workload) if estimates_cache is not None else ""
    keys = [(key_base, int(batch), amp, optimizer, target) for batch in batches]
    todo = sum(1 for key in keys if estimates_cache is None or key not in estimates_cache)
    out, passes = [], 0
    for key in keys:
        cached = estimates_cache.get(key) if estimates_cache is not None else None
        if cached is None:
            cached = estimate_step(workload, key[1], amp=amp, optimizer=optimizer, target=target)
            passes += 1
            # progress inside a long estimate (a large model's pass takes seconds to tens of seconds)
            log.info("fake pass %d of %d done (batch %d, %.1f s)", passes, todo, key[1], cached.wall_s)
            if estimates_cache is not None:
                estimates_cache[key] = cached
        out.append(cached)
    return tuple(out), passes


def curves_from_estimates(
    estimates: Sequence[StepEstimate],
    gpu: GpuSpec,
    *,
    num_fake_passes: int = 0,
    overhead: Any = None,
    channels_last: bool = False,
) -> EstimatedCurves:
    """Price precomputed estimates on ``gpu`` (no torch, no fake pass); ``overhead``: a ``CudaOverhead``;
    ``channels_last``: NHWC memory format (changes the step time, see the roofline)."""
    if not estimates:
        raise ValueError("curves need at least one estimate")
    from torchkit.estimate.overhead import DEFAULT_CUDA_OVERHEAD, device_bytes_from_peak

    overhead = overhead or DEFAULT_CUDA_OVERHEAD
    ordered = sorted(estimates, key=lambda e: e.batch)
    floor = device_bytes_from_peak(ordered[0].optimizer_peak_bytes + ordered[0].margin_bytes, gpu, overhead)
    return EstimatedCurves(
        memory_points=tuple((e.batch, cuda_device_bytes(e, gpu, overhead=overhead)) for e in ordered),
        time_points=tuple((e.batch, step_time_s(e, gpu, channels_last=channels_last)) for e in ordered),
        allocated_points=tuple((e.batch, e.peak_allocated_bytes) for e in ordered),
        breakdown_bytes=dict(ordered[-1].breakdown_bytes),
        num_fake_passes=num_fake_passes,
        floor_device_bytes=floor,
        backward_shares=tuple(
            (e.batch, share)
            for e in ordered
            if (share := backward_share(e, gpu, channels_last=channels_last)) is not None
        ),
    )


RANGE_PROBE_MIN_REACH = 4
"""a range probe is added only when the card holds at least this many times the largest probe batch"""


def range_probe_batch(curves: EstimatedCurves, memory_bytes: int, *, upper: int) -> int | None:
    """A batch to add one fake pass at, so the step-time fit covers the batches a plan can choose; or None.

    The probes sit at small batches (``DEFAULT_PROBE_BATCHES``). A small model's steps there are
    launch-bound: every probe's time is the eager-dispatch floor, the fitted per-sample time is ~0, and a plan
    at the memory cap (tens of thousands of samples for an MLP) would be priced at the floor, millions of
    samples per second on every GPU alike. So when the card holds at least ``RANGE_PROBE_MIN_REACH`` times the
    largest probe and the per-sample part of the largest probe's time is below its fixed part (the slope
    says little about the cap), this returns the largest batch whose predicted memory fits the whole card
    (``memory_bytes``), at most ``upper``. A fake pass costs the same at any batch."""
    from torchkit.step.fit import fit_memory, fit_time, max_batch_within

    largest = max(b for b, _ in curves.time_points)
    try:
        cap = max_batch_within(fit_memory(curves.memory_points).fit, memory_bytes, upper=upper)
        time = fit_time(curves.time_points).fit
    except ValueError:  # no usable points: the profile's own fit reports it
        return None
    if cap < RANGE_PROBE_MIN_REACH * largest or time.s_per_sample * largest >= time.intercept_s:
        return None
    return cap


def estimate_curves(
    workload: Any,
    gpu: GpuSpec,
    *,
    amp: AmpMode = "off",
    optimizer: OptimizerName = "sgd",
    batches: Sequence[int] = DEFAULT_PROBE_BATCHES,
    estimates_cache: MutableMapping[tuple, StepEstimate] | None = None,
    overhead: Any = None,
    channels_last: bool = False,
) -> EstimatedCurves:
    """Memory and step-time points of ``workload`` on ``gpu`` at ``batches`` (one fake pass per batch not in
    ``estimates_cache``). Fit them with ``torchkit.step.fit.fit_memory`` / ``fit_time``.

    Raises:
        ValueError: fewer than two distinct probe batches.
        WorkloadError, ConfigError: as :func:`estimate_step`; ConfigError for bf16 on a GPU without it.
    """
    if len(set(batches)) < 2:
        raise ValueError(f"curves need at least two distinct probe batches, got {tuple(batches)}")
    if amp == "bf16" and not gpu.supports_bf16:
        from torchkit.errors import ConfigError

        raise ConfigError(f"{gpu.name} has no bf16 support (use --amp fp16 or off)")
    estimates, passes = estimate_steps(
        workload, batches, amp=amp, optimizer=optimizer, estimates_cache=estimates_cache
    )
    return curves_from_estimates(
        estimates, gpu, num_fake_passes=passes, overhead=overhead, channels_last=channels_last
    )
