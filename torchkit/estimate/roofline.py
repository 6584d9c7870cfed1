"""Step time on a catalog GPU by a per-operator roofline over the kernels a fake pass recorded.

Each kernel takes ``max(flops / (COMPUTE_EFFICIENCY · peak), bytes / (BANDWIDTH_EFFICIENCY · bandwidth))
+ KERNEL_LAUNCH_S``; the GPU time is their sum. Eager PyTorch also spends CPU time per operator
(``EAGER_DISPATCH_S``) and runs asynchronously, so the step takes ``max(GPU time, CPU dispatch time)``:
the GPU-bound regime at large batches, the launch-bound floor at small ones. Pure arithmetic, no torch.

Peak FLOP/s per kernel: 16-bit kernels (what autocast lowers matmul/conv/attention to) use the GPU's
FP16/BF16 tensor-core peak; FP32 convolutions on compute capability >= 8.0 use TF32 tensor cores,
because PyTorch leaves ``torch.backends.cudnn.allow_tf32`` True by default (docs: "TensorFloat-32 (TF32)
on Ampere (and later) devices"), and TF32 dense peak is half the FP16 dense peak on A100/H100/L4/RTX 30-40
datasheets; FP32 matmuls use the FP32 peak (``torch.backends.cuda.matmul.allow_tf32`` is False by
default since 1.12).

Known limitations: no overlap between kernels, no caching effects (L2 makes small elementwise kernels
faster than DRAM bandwidth says), cuDNN algorithm choice and tensor-core alignment (channel counts not a
multiple of 8 run slower) are not modelled, nor is communication (DDP all-reduce) or the data loader.
"""

from __future__ import annotations

from collections.abc import Iterable

from torchkit.errors import ConfigError
from torchkit.estimate.op_costs import KernelCost
from torchkit.hardware.catalog import GpuSpec

COMPUTE_EFFICIENCY = 0.75
"""Fraction of peak FLOP/s a matmul/conv/attention kernel reaches: the factor PyTorch's own roofline
uses (``torch/utils/_runtime_estimation.py``, ``flops_to_ns``: "Uses 75% of theoretical peak")."""
BANDWIDTH_EFFICIENCY = 0.85
"""Fraction of datasheet DRAM bandwidth a streaming kernel reaches (STREAM/BabelStream-type copies reach
about 85-90% on recent NVIDIA GPUs; approximate)."""
KERNEL_LAUNCH_S = 3e-6
"""GPU-side gap per kernel between back-to-back launches (``cudaLaunchKernel`` ~1-3 µs on CUDA 12 drivers;
approximate)."""
EAGER_DISPATCH_S = 12e-6
"""CPU time PyTorch eager spends per operator (Python, autograd, dispatcher, launch): ~5-25 µs per op
(jiahuanglin.xyz "From PyTorch op to kernel launch"; approximate). It bounds the step from below when
kernels are tiny."""


def _peak_flops_per_s(kernel: KernelCost, gpu: GpuSpec) -> float:
    if kernel.compute in ("fp16", "bf16"):
        try:
            return gpu.peak_flops_per_s(kernel.compute)
        except ValueError as e:
            raise ConfigError(f"{e} (GPU {gpu.name}: choose --amp fp16 or off)") from e
    if kernel.kind == "conv" and _cc_major(gpu) >= 8:
        return gpu.fp16_tflops * 1e12 / 2  # TF32 tensor cores (cudnn.allow_tf32 defaults to True)
    return gpu.fp32_tflops * 1e12


def _cc_major(gpu: GpuSpec) -> int:
    try:
        return int(str(gpu.compute_capability).split(".")[0])
    except ValueError:
        return 0


def kernel_time_s(kernel: KernelCost, gpu: GpuSpec) -> float:
    """GPU time of one kernel: roofline + launch gap."""
    compute_s = kernel.flops / (COMPUTE_EFFICIENCY * _peak_flops_per_s(kernel, gpu)) if kernel.flops else 0.0
    memory_s = kernel.bytes_moved / (BANDWIDTH_EFFICIENCY * gpu.memory_bandwidth_bytes_per_s)
    return max(compute_s, memory_s) + KERNEL_LAUNCH_S


def kernels_time_s(kernels: Iterable[KernelCost], gpu: GpuSpec, *, amp: str = "off") -> float:
    """Step time of ``kernels`` on ``gpu``: ``max(Σ kernel_time_s, n · EAGER_DISPATCH_S)``.

    Raises:
        ConfigError: ``amp`` is bf16 and the GPU has no bf16 support.
    """
    if amp == "bf16" and not gpu.supports_bf16:
        raise ConfigError(f"{gpu.name} has no bf16 support (use --amp fp16 or off)")
    gpu_s = 0.0
    count = 0
    for kernel in kernels:
        gpu_s += kernel_time_s(kernel, gpu)
        count += 1
    return max(gpu_s, count * EAGER_DISPATCH_S)
