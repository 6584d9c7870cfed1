"""Step time on a catalog GPU by a per-operator roofline over the kernels a fake pass recorded.

Each kernel takes ``max(flops / (e_class · peak_class), bytes / (e_bw · bandwidth)) + launch gap`` (a grouped
convolution's ``e_class`` scaled by ``grouped_conv_efficiency``, at most 1), plus, for
a convolution whose tensors are not in its kernel's native memory layout, the transposes cuDNN runs around
it (``layout_conversion_factor × its bytes`` at the streaming bandwidth). The GPU time is their sum. Eager
PyTorch also spends CPU time per operator and runs asynchronously, so the step takes
``max(GPU time, n · eager dispatch)``: GPU-bound at large batches, launch-bound at small ones.

The efficiencies ``e_*`` and the layout factor are *calibrated* per GPU architecture on public measured
training throughput (``torchkit/estimate/calibration/``, fitted by ``bench/calibrate_time.py``); see
:mod:`torchkit.estimate.time_model` for how a GPU gets its constants. Peaks per kernel class:

* ``fp16`` / ``bf16``: matmul/conv/attention under autocast run on tensor cores at the GPU's 16-bit peak;
* ``conv32``: fp32 convolutions use TF32 tensor cores on compute capability >= 8.0, because PyTorch leaves
  ``torch.backends.cudnn.allow_tf32`` True (docs: "TensorFloat-32 (TF32) on Ampere (and later) devices");
  TF32 dense peak is half the FP16 dense peak on A100/H100/L4/RTX 30-40 datasheets; below 8.0 they run at
  the FP32 peak;
* ``matmul32``: fp32 matmuls use the FP32 peak (``torch.backends.cuda.matmul.allow_tf32`` is False by
  default since 1.12);
* ``memory``: every other kernel (elementwise, normalisation, reductions, copies, the foreach optimizer)
  is priced by its bytes only.

Native layouts: tensor-core convolutions (16-bit, TF32) are NHWC kernels, so NCHW tensors are transposed
around them (NVIDIA's "Tensor Core performance guide": NHWC avoids the transposes); fp32 CUDA-core
convolutions are NCHW kernels, so channels_last costs the conversion there instead.

A kernel's bytes stream at the soft minimum of the DRAM's rate (``bandwidth_efficiency`` of the datasheet
bandwidth) and the SMs' (``sm_stream_bytes_per_flop`` times the FP32 peak): a card with much DRAM bandwidth
for its SMs (an H200) cannot use all of it.

Known limitations: no overlap between kernels, no caching effects (L2 makes small elementwise kernels
faster than DRAM bandwidth says), cuDNN algorithm choice and channel counts not a multiple of 8 are not
modelled, nor is communication (DDP all-reduce) or the data loader. Pure numpy, no torch.
"""

from __future__ import annotations

import enum
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from torchkit.errors import ConfigError
from torchkit.estimate.op_costs import KernelCost
from torchkit.hardware.catalog import GpuSpec


class KernelClass(enum.IntEnum):
    """What prices a kernel (GPU-independent; the GPU decides e.g. TF32 vs FP32 for ``CONV32``)."""

    FP16 = 0
    BF16 = 1
    CONV32 = 2
    MATMUL32 = 3
    MEMORY = 4


@dataclass(frozen=True, kw_only=True)
class TimeConstants:
    """The constants the roofline prices kernels with on one GPU (see :mod:`torchkit.estimate.time_model`)."""

    tensor_core_efficiency: float
    """fraction of the 16-bit tensor-core peak a matmul/conv/attention kernel reaches"""
    tf32_efficiency: float
    """fraction of the TF32 peak (half the FP16 peak) an fp32 convolution reaches on compute capability >= 8"""
    fp32_efficiency: float
    """fraction of the FP32 CUDA-core peak an fp32 matmul (or pre-Ampere convolution) reaches"""
    bandwidth_efficiency: float
    """fraction of datasheet DRAM bandwidth a streaming (elementwise, normalisation, optimizer) kernel reaches"""
    layout_conversion_factor: float
    """extra bytes, as a multiple of a convolution's own bytes, to transpose its tensors when they are not in
    its kernel's native layout"""
    grouped_conv_efficiency: float
    """a grouped convolution (groups > 1) reaches this multiple of what a dense one of its precision does
    (capped at the peak); fitted per architecture, well below 1 on the data: cuDNN's grouped kernels
    (ResNeXt's 3x3, 32 groups) do little work per byte and reach a fraction of the dense efficiency"""
    kernel_launch_s: float
    """GPU-side gap per kernel between back-to-back launches"""
    eager_dispatch_s: float
    """CPU time PyTorch eager spends per operator (bounds the step from below)"""
    sm_stream_bytes_per_flop: float = math.inf
    """the SM side of streaming: bytes a second the SMs can move, per FP32 FLOP a second of the GPU (its FP32
    peak is SMs x clock x FP32 lanes, so within an architecture this is bytes per SM per clock). A kernel's
    DRAM traffic cannot stream faster than this however fast the DRAM is: each SM keeps a bounded number of
    loads in flight, so by Little's law its share of the bandwidth is at most (bytes in flight) / (DRAM
    latency), and the loads and the kernel's own instructions take issue slots on the SM. It binds on a card
    whose DRAM is fast for its SMs (the H200: the H100 SXM's SMs with 1.43x its bandwidth, measured 1.13x an
    H100 SXM in MLPerf Training's ResNet-50); the streaming bandwidth is the soft minimum of
    ``bandwidth_efficiency x DRAM`` and this (``STREAMING_SOFTMIN_POWER``). ``inf``: no limit (the calibration
    fits it where its data can see it: ``calibration/fit.py`` ``SM_STREAM_PRIORS``)"""


STREAMING_SOFTMIN_POWER = 4.0
"""p of the soft minimum ``(a^-p + b^-p)^(-1/p)`` of the DRAM and SM streaming rates: the smaller decides far
from the crossover, both cost near it (a kernel at the crossover stalls on both), and the fit sees a smooth
function of both constants"""


def streaming_bytes_per_s(dram_bytes_per_s: float, sm_bytes_per_s: float) -> float:
    """The rate a streaming kernel moves DRAM traffic at: the soft minimum of what the DRAM delivers and what
    the SMs can take (``TimeConstants.sm_stream_bytes_per_flop``)."""
    if math.isinf(sm_bytes_per_s):
        return dram_bytes_per_s
    p = STREAMING_SOFTMIN_POWER
    return (dram_bytes_per_s**-p + sm_bytes_per_s**-p) ** (-1.0 / p)


@dataclass(frozen=True, kw_only=True)
class KernelTable:
    """A step's kernels grouped by (class, convolution or not, grouped or not, FLOPs, bytes): what the
    roofline prices.

    Identical kernels (a ResNet repeats its block shapes) are one row with a count, so a table is small
    enough to store (the calibration keeps one per measured configuration) and cheap to price.
    """

    kernel_class: np.ndarray
    """int8 :class:`KernelClass` per row"""
    is_conv: np.ndarray
    """bool per row: a convolution (pays the layout conversion)"""
    grouped: np.ndarray
    """bool per row: a grouped convolution (its compute efficiency is scaled by ``grouped_conv_efficiency``)"""
    flops: np.ndarray
    """float64 FLOPs of one kernel"""
    bytes_moved: np.ndarray
    """float64 bytes read + written by one kernel"""
    count: np.ndarray
    """float64 kernels of this shape in one step"""

    @property
    def num_kernels(self) -> int:
        return int(self.count.sum())

    def to_json(self) -> dict:
        return {
            "kernel_class": [int(c) for c in self.kernel_class],
            "is_conv": [bool(c) for c in self.is_conv],
            "grouped": [bool(c) for c in self.grouped],
            "flops": [int(f) for f in self.flops],
            "bytes_moved": [int(b) for b in self.bytes_moved],
            "count": [int(c) for c in self.count],
        }

    @classmethod
    def from_json(cls, data: dict) -> KernelTable:
        return cls(
            kernel_class=np.asarray(data["kernel_class"], dtype=np.int8),
            is_conv=np.asarray(data["is_conv"], dtype=bool),
            grouped=np.asarray(data["grouped"], dtype=bool),
            flops=np.asarray(data["flops"], dtype=np.float64),
            bytes_moved=np.asarray(data["bytes_moved"], dtype=np.float64),
            count=np.asarray(data["count"], dtype=np.float64),
        )


def kernel_class(kernel: KernelCost) -> KernelClass:
    """The pricing class of one recorded kernel."""
    if not kernel.flops:
        return KernelClass.MEMORY
    if kernel.compute == "fp16":
        return KernelClass.FP16
    if kernel.compute == "bf16":
        return KernelClass.BF16
    return KernelClass.CONV32 if kernel.kind == "conv" else KernelClass.MATMUL32


def kernel_table(kernels: Iterable[KernelCost]) -> KernelTable:
    """Group ``kernels`` into a :class:`KernelTable` (order does not matter to the roofline)."""
    counts: dict[tuple[int, bool, bool, int, int], int] = defaultdict(int)
    for k in kernels:
        counts[(int(kernel_class(k)), k.kind == "conv", k.groups > 1, int(k.flops), int(k.bytes_moved))] += 1
    keys = sorted(counts)
    return KernelTable(
        kernel_class=np.asarray([k[0] for k in keys], dtype=np.int8),
        is_conv=np.asarray([k[1] for k in keys], dtype=bool),
        grouped=np.asarray([k[2] for k in keys], dtype=bool),
        flops=np.asarray([k[3] for k in keys], dtype=np.float64),
        bytes_moved=np.asarray([k[4] for k in keys], dtype=np.float64),
        count=np.asarray([counts[k] for k in keys], dtype=np.float64),
    )


def cc_major(gpu: GpuSpec) -> int:
    """Major compute capability (0 where the catalog entry has none)."""
    try:
        return int(str(gpu.compute_capability).split(".")[0])
    except ValueError:
        return 0


@dataclass(frozen=True)
class PlacedTable:
    """A kernel table on one GPU in one memory layout: everything the roofline needs that does not depend on
    the constants, computed once (a calibration prices the same rows thousands of times)."""

    kernel_class: np.ndarray
    flops_at_peak_s: np.ndarray
    """each kernel's FLOPs over its class's datasheet peak (0 for memory kernels)"""
    grouped: np.ndarray
    bytes_moved: np.ndarray
    is_memory: np.ndarray
    """memory-class kernels (elementwise, normalisation, copies): what kernel fusion removes"""
    layout_mismatch: np.ndarray
    """convolutions whose tensors are not in their kernel's native layout (they pay the conversion)"""
    count: np.ndarray
    num_kernels: int
    bandwidth_bytes_per_s: float
    fp32_flops_per_s: float
    """the GPU's FP32 peak: SMs x clock x FP32 lanes (what the SM side of streaming scales with)"""
    tf32: bool

    @classmethod
    def of(cls, table: KernelTable, gpu: GpuSpec, *, channels_last: bool = False) -> PlacedTable:
        """Place ``table`` on ``gpu``. Raises ConfigError for bf16 kernels on a GPU without bf16."""
        kind = table.kernel_class.astype(np.intp)
        if np.any(kind == KernelClass.BF16) and not gpu.supports_bf16:
            raise ConfigError(f"{gpu.name} has no bf16 support (use --amp fp16 or off)")
        tf32 = cc_major(gpu) >= 8
        bf16_peak = float(gpu.bf16_tflops) * 1e12 if gpu.supports_bf16 else 1.0
        peaks = np.array(
            [
                gpu.fp16_tflops * 1e12,
                bf16_peak,
                gpu.fp16_tflops * 1e12 / 2 if tf32 else gpu.fp32_tflops * 1e12,  # TF32 tensor cores
                gpu.fp32_tflops * 1e12,
                np.inf,
            ]
        )
        native_nhwc = (kind <= KernelClass.BF16) | ((kind == KernelClass.CONV32) & tf32)
        return cls(
            kernel_class=kind,
            flops_at_peak_s=np.where(table.flops > 0, table.flops / peaks[kind], 0.0),
            grouped=table.grouped,
            bytes_moved=table.bytes_moved,
            is_memory=kind == KernelClass.MEMORY,
            layout_mismatch=table.is_conv & (native_nhwc != channels_last),
            count=table.count,
            num_kernels=table.num_kernels,
            bandwidth_bytes_per_s=gpu.memory_bandwidth_bytes_per_s,
            fp32_flops_per_s=gpu.fp32_tflops * 1e12,
            tf32=tf32,
        )

    def time_s(self, c: TimeConstants, *, memory_traffic: float = 1.0, cuda_graphs: bool = False) -> float:
        """Step time with constants ``c`` (the module docstring). ``memory_traffic``: the share of the
        memory-class kernels' bytes a fusing software stack still moves (1: eager PyTorch);
        ``cuda_graphs``: the stack replays CUDA graphs, so no per-operator CPU dispatch bounds the step."""
        effs = np.array(
            [
                c.tensor_core_efficiency,
                c.tensor_core_efficiency,
                c.tf32_efficiency if self.tf32 else c.fp32_efficiency,
                c.fp32_efficiency,
                1.0,
            ]
        )
        # a kernel never beats its peak, however the grouped factor came out
        eff = np.minimum(
            1.0, effs[self.kernel_class] * np.where(self.grouped, c.grouped_conv_efficiency, 1.0)
        )
        compute_s = self.flops_at_peak_s / eff
        bandwidth = streaming_bytes_per_s(
            c.bandwidth_efficiency * self.bandwidth_bytes_per_s,
            c.sm_stream_bytes_per_flop * self.fp32_flops_per_s,
        )
        moved = (
            self.bytes_moved * np.where(self.is_memory, memory_traffic, 1.0)
            if memory_traffic != 1.0
            else self.bytes_moved
        )
        memory_s = moved / bandwidth
        convert_s = np.where(
            self.layout_mismatch, c.layout_conversion_factor * self.bytes_moved / bandwidth, 0.0
        )
        per_kernel_s = np.maximum(compute_s, memory_s) + convert_s + c.kernel_launch_s
        gpu_s = float(np.dot(self.count, per_kernel_s))
        return gpu_s if cuda_graphs else max(gpu_s, self.num_kernels * c.eager_dispatch_s)


def table_time_s(
    table: KernelTable, gpu: GpuSpec, constants: TimeConstants, *, channels_last: bool = False
) -> float:
    """Step time of the kernels in ``table`` on ``gpu`` (see the module docstring)."""
    return PlacedTable.of(table, gpu, channels_last=channels_last).time_s(constants)


def kernels_time_s(
    kernels: Sequence[KernelCost] | KernelTable,
    gpu: GpuSpec,
    *,
    amp: str = "off",
    channels_last: bool = False,
    constants: TimeConstants,
) -> float:
    """Step time of ``kernels`` on ``gpu`` with ``constants`` (the estimator passes the calibrated ones of
    the GPU's architecture, :func:`torchkit.estimate.time_model.constants_for`).

    Raises:
        ConfigError: ``amp`` is bf16 and the GPU has no bf16 support.
    """
    if amp == "bf16" and not gpu.supports_bf16:
        raise ConfigError(f"{gpu.name} has no bf16 support (use --amp fp16 or off)")
    table = kernels if isinstance(kernels, KernelTable) else kernel_table(kernels)
    return table_time_s(table, gpu, constants, channels_last=channels_last)
