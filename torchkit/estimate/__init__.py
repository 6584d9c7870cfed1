"""The fake-tensor estimator of a training step: memory (peak and breakdown), FLOPs and bytes per operator,
device memory and step time on any catalog GPU, and the curves over batch size. No GPU needed.

Importing this package does not import torch; the functions that run fake passes import it when called.

Typical use::

    from torchkit.workloads import get_workload
    from torchkit.estimate import estimate_curves
    curves = estimate_curves(get_workload("resnet50"), gpu_spec, amp="fp16", optimizer="sgd")

Modules: ``estimator`` (public functions), ``memory_tracker`` (dispatch-mode tracker), ``op_costs``
(FLOPs/bytes per op), ``attention`` (scaled-dot-product attention as a GPU runs it), ``rnn_workspace`` (an
LSTM's workspace), ``overhead`` (kernel workspace and CUDA overhead models), ``roofline`` (step time),
``time_model`` (the calibrated constants and their error), ``identity`` (what estimates are named with),
``ddp_sync`` (DDP's buckets and ring all-reduce), ``cpu_truth`` (real CPU peak from the profiler), and the
``calibration`` package (the step-time model's fit on public measurements).
"""

from __future__ import annotations

from torchkit.estimate.estimator import (
    DEFAULT_PROBE_BATCHES,
    ESTIMATOR_MIN_TORCH,
    EstimatedCurves,
    StepEstimate,
    check_estimator_torch,
    cpu_peak_bytes,
    cuda_device_bytes,
    curves_from_estimates,
    estimate_curves,
    estimate_step,
    estimate_steps,
    range_probe_batch,
    step_time_s,
)
from torchkit.estimate.identity import ESTIMATE_REVISION, estimate_identity
from torchkit.estimate.op_costs import KernelCost, OpCost
from torchkit.estimate.overhead import DEFAULT_CUDA_OVERHEAD, CudaOverhead
from torchkit.step.options import AMP_MODES, OPTIMIZERS, AmpMode, OptimizerName

__all__ = [
    "AMP_MODES",
    "DEFAULT_CUDA_OVERHEAD",
    "DEFAULT_PROBE_BATCHES",
    "ESTIMATOR_MIN_TORCH",
    "OPTIMIZERS",
    "AmpMode",
    "CudaOverhead",
    "ESTIMATE_REVISION",
    "EstimatedCurves",
    "KernelCost",
    "OpCost",
    "OptimizerName",
    "StepEstimate",
    "check_estimator_torch",
    "cpu_peak_bytes",
    "cuda_device_bytes",
    "curves_from_estimates",
    "estimate_curves",
    "estimate_identity",
    "estimate_step",
    "estimate_steps",
    "range_probe_batch",
    "step_time_s",
]
