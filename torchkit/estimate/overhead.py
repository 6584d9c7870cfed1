"""From fake-tensor bytes to what a device really needs: per-backend kernel-workspace models and the CUDA
overhead model.

A dispatch mode sees every tensor an operator returns, never the scratch a kernel allocates and frees
inside itself. Two per-operator models add that scratch as transient bytes at the operator
(``MemoryTracker`` reports the peak with them):

* **CPU** (oneDNN / ATen kernels): calibrated against ``torch.profiler`` allocation records of real
  steps (``cpu_truth.py``) on this project's machines (x86-64 AVX2 and AVX-512, oneDNN as shipped with
  torch 2.13, 2 threads). It exists to validate the fake estimate on CPU, where a ground truth can be measured.
* **CUDA** (cuDNN / flash attention): the shape of the scratch is known, its size is not calibrated
  yet (no GPU was available when it was written); see ``CUDNN_WORKSPACE_FRACTION``.

Then ``device_bytes_from_peak`` turns the CUDA peak (live bytes rounded to the caching allocator's
512-byte blocks, plus workspace) into device memory: ``fragmentation × peak + CUDA context + cuBLAS /
cuBLASLt workspaces``. Every constant has its source next to it; the ones marked *uncalibrated* are
priors to be replaced by measurements on a real GPU (``bench/gpu_check``).

Known limitations: the CPU model covers the operators of the reference workloads (convolution,
batch-norm backward, nearest upsampling, BCE-with-logits); other ISAs (AMX, ARM) pick other
oneDNN kernels with other scratch sizes (the oneDNN rules were fitted on AVX2 and checked on AVX-512, where
one rule differs); transposed,
grouped and 3-d convolutions use the 2-d rules unverified.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torchkit.hardware.catalog import GpuSpec
from torchkit.units import MIB

# --- CPU kernel workspace ------------------------------------------------------------------------------
CPU_GEMM_BWD_WEIGHTS_BUFFERS_PER_THREAD = 4
"""oneDNN's GEMM-based backward-weights convolution (taken on AVX2 when the output is narrower than the
kernel: 3x3 on <= 2x2 outputs, ViT's 16x16/16 patch embedding) holds, per thread that gets an image, 4
weight-sized buffers and one image's im2col columns (C·kh·kw·ho·wo elements); never less than the input's
gradient. Measured on AVX2 (AMD EPYC, torch 2.13, 1 and 2 threads, profiler peaks) to within 256 bytes per
thread at (4..1024, 64, 2, 2) and (4/64, 512, 2, 2) with 3x3 kernels, (16/256, 128, 1, 1) with 3x3 and ViT's
patch embedding at batch 1 and 8; from batch 1024 (64 channels) the input's gradient is the peak. Known miss:
the patch embedding at batch 32 peaks at x + y - w (another kernel), 44-47% above this rule.
On AVX-512 oneDNN's JIT kernel takes these shapes too and needs only the general ``max(x + y, w)``:
measured on an AMD EPYC (AVX-512, torch 2.13 / oneDNN 3.12, 1 and 2 threads) at (4, 512, 2, 2),
(64, 64, 2, 2), (256, 64, 2, 2) and (16, 128, 1, 1) inputs with 3x3 kernels, to the byte."""

CPU_ISAS_WITH_JIT_NARROW_BACKWARD = frozenset({"AVX512"})
"""``torch.backends.cpu.get_cpu_capability()`` values on which oneDNN's JIT backward-weights kernel takes
outputs narrower than the kernel (see ``CPU_GEMM_BWD_WEIGHTS_BUFFERS_PER_THREAD``)."""


def _cpu_narrow_backward_uses_gemm() -> bool:
    import torch

    return torch.backends.cpu.get_cpu_capability() not in CPU_ISAS_WITH_JIT_NARROW_BACKWARD


def _nbytes(t: Any) -> int:
    return int(t.numel()) * t.element_size() if t is not None else 0


def _packet(func: Any) -> str:
    return func._overloadpacket.__name__


def cpu_kernel_workspace_bytes(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """Bytes a CPU kernel allocates and frees inside ``func`` (see the module docstring).

    Rules, fitted on profiler records (x = input, y = output / grad-output, w = weight bytes):
    convolution forward ``max(x, y) + w`` (reorders to oneDNN's blocked layout); convolution backward
    ``max(x + y, w)``, strided with input gradient ``max(2x − w, x + y, w)``, without input gradient
    ``max(y, w)``, output narrower than the kernel ``4·T·w + max(x, y)/2`` (T threads). Convolutions that
    ATen does not send to oneDNN (16-bit dtypes on a CPU without native oneDNN bf16/fp16; tiny fp32
    batch-1 inputs) run ``slow_conv2d``, whose im2col buffer is ``B·C·kh·kw·Ho·Wo`` elements, forward and
    backward. Batch-norm backward ``x``; nearest upsampling ``x + y`` forward, ``grad_output`` backward;
    BCE-with-logits ``2·x``. LSTM backward (oneDNN) ``T·B·(4H + I + H)`` fp32.
    """
    name = _packet(func)
    if name == "convolution":
        x, w = args[0], args[1]
        if _cpu_uses_im2col(x, w, args[8] if len(args) > 8 else 1):
            return _im2col_bytes(x, w, out, args[3], args[4])
        return max(_nbytes(x), _nbytes(out)) + _nbytes(w)
    if name == "convolution_backward":
        x, w = args[1], args[2]
        if _cpu_uses_im2col(x, w, args[9] if len(args) > 9 else 1):
            return _im2col_bytes(x, w, args[0], args[4], args[5])
        return _cpu_conv_backward_bytes(args)
    if name == "native_batch_norm_backward":
        return _nbytes(args[1])
    if name == "upsample_nearest2d":
        return _nbytes(args[0]) + _nbytes(out)
    if name == "upsample_nearest2d_backward":
        return _nbytes(args[0])
    if name == "binary_cross_entropy_with_logits":
        return 2 * _nbytes(args[0])
    if name == "mkldnn_rnn_layer_backward":
        return _lstm_backward_scratch_bytes(args)
    return 0


def _lstm_backward_scratch_bytes(args: tuple) -> int:
    """oneDNN's LSTM backward scratchpad, ``T·B·(4H + I + H)`` fp32: the gate gradients of every step (its
    ``scratch_gates`` for the merged weight GEMM), the layer-input gradient it accumulates before PyTorch's
    copy, and the hidden-state gradients. Fitted on profiler records of 1-layer LSTMs (T 32-64, B 32-64,
    I 64-256, H 64-128): real peaks within 3%."""
    x, w_ih, w_hh = args[0], args[1], args[2]
    gates, in_features, hidden = int(w_ih.shape[0]), int(w_ih.shape[1]), int(w_hh.shape[1])
    steps_times_batch = x.numel() // max(in_features, 1)
    return steps_times_batch * (gates + in_features + hidden) * 4


def _cpu_uses_im2col(x: Any, w: Any, groups: int) -> bool:
    """Whether ATen runs this 2-d convolution as ``slow_conv2d`` (im2col + GEMM) rather than oneDNN.

    Follows ``ConvParams::use_mkldnn`` (aten/src/ATen/native/Convolution.cpp): 16-bit inputs go to oneDNN
    only where it supports them natively; fp32 goes to oneDNN unless a batch-1 input is tiny.
    """
    import torch

    if w.dim() != 4 or x.dim() != 4:
        return False
    if x.dtype in (torch.bfloat16, torch.float16):
        check = "_is_mkldnn_bf16_supported" if x.dtype == torch.bfloat16 else "_is_mkldnn_fp16_supported"
        return not bool(getattr(torch.ops.mkldnn, check)())
    if x.dtype != torch.float32 or groups > 1:
        return False
    kernel_large = w.shape[-1] > 3 and w.shape[-2] > 3
    return not (kernel_large or x.shape[0] > 1 or x.numel() > 20480)


def _im2col_bytes(x: Any, w: Any, y: Any, stride: Any, padding: Any) -> int:
    kh, kw = int(w.shape[-2]), int(w.shape[-1])
    if kh == kw == 1 and all(int(s) == 1 for s in stride) and all(int(p) == 0 for p in padding):
        return 0  # a 1x1 convolution without stride or padding is a plain GEMM: no column buffer
    batch, channels = int(x.shape[0]), int(x.shape[1])
    ho, wo = int(y.shape[-2]), int(y.shape[-1])
    return batch * channels * kh * kw * ho * wo * x.element_size()


cpu_kernel_workspace_bytes.ops = frozenset(  # type: ignore[attr-defined]  # ops with a rule (tracker filter)
    {
        "convolution",
        "convolution_backward",
        "native_batch_norm_backward",
        "upsample_nearest2d",
        "upsample_nearest2d_backward",
        "binary_cross_entropy_with_logits",
        "mkldnn_rnn_layer_backward",
    }
)


def _cpu_conv_backward_bytes(args: tuple) -> int:
    import torch

    grad_out, x, w = args[0], args[1], args[2]
    stride = args[4] if len(args) > 4 else (1,)
    output_mask = args[10] if len(args) > 10 else (True, True, True)
    gx, gy, gw = _nbytes(x), _nbytes(grad_out), _nbytes(w)
    needs_input_grad = bool(output_mask[0])
    if grad_out.dim() >= 3 and grad_out.shape[-1] < w.shape[-1] and _cpu_narrow_backward_uses_gemm():
        threads = min(torch.get_num_threads(), int(x.shape[0]))  # one image per thread at a time
        columns = (
            int(w.shape[1])
            * math.prod(int(k) for k in w.shape[2:])
            * math.prod(int(o) for o in grad_out.shape[2:])
            * x.element_size()
        )  # one image's im2col (w.shape[1]: C/groups)
        return max(threads * (CPU_GEMM_BWD_WEIGHTS_BUFFERS_PER_THREAD * gw + columns), gx)
    if not needs_input_grad:
        return max(gy, gw)
    if any(int(s) > 1 for s in stride):
        return max(2 * gx - gw, gx + gy, gw)
    return max(gx + gy, gw)


# --- CUDA kernel workspace -----------------------------------------------------------------------------
CUDNN_WORKSPACE_FRACTION = 1.0
"""*Uncalibrated.* cuDNN scratch of one convolution, as a fraction of its larger activation (input or
output). With ``cudnn.benchmark=False`` PyTorch takes the heuristics' first engine whose workspace it
can allocate; implicit-GEMM engines need little, FFT/Winograd engines need about an activation. The
caching allocator keeps the largest such block reserved, so it counts at the op where it is largest."""


def cuda_kernel_workspace_bytes(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """Bytes a CUDA kernel would allocate inside ``func``: cuDNN convolution workspace, and the fp32
    ``dq`` accumulator (+ row statistics) of flash / memory-efficient attention backward."""
    name = _packet(func)
    if name == "convolution":
        return int(CUDNN_WORKSPACE_FRACTION * max(_nbytes(args[0]), _nbytes(out)))
    if name == "convolution_backward":
        return int(CUDNN_WORKSPACE_FRACTION * max(_nbytes(args[0]), _nbytes(args[1])))
    if "attention" in name and name.endswith("backward"):
        # FlashAttention-2 backward accumulates dQ in fp32 ([B, S, H, D]) and keeps softmax_d ([B, H, S])
        grad_out = args[0]
        rows = math.prod(int(d) for d in grad_out.shape[:-1])
        return 4 * int(grad_out.numel()) + 4 * rows
    return 0


cuda_kernel_workspace_bytes.ops = frozenset(  # type: ignore[attr-defined]
    {
        "convolution",
        "convolution_backward",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
        "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_cudnn_attention_backward",
    }
)


# --- CUDA device overhead ------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class CudaOverhead:
    """Constants that turn a CUDA allocated-bytes peak into device memory."""

    fragmentation_factor: float = 1.08
    """Peak reserved / peak allocated of the caching allocator in a steady training loop: block splitting,
    2 MiB rounding of large segments (c10/cuda/CUDACachingAllocator.cpp: kSmallBuffer 2 MiB, kLargeBuffer
    20 MiB, kRoundLarge 2 MiB). *Bounded from above by public runs*, not measured: every batch in
    ``calibration/measured_throughput.csv`` ran on its card, and timm's ResNet-50 AMP at batch 512 on a
    24 GB RTX 3090 (estimated peak 21.6 GiB) fits only with a factor <= 1.088 besides the context below
    (``python bench/bench_time_model.py`` prints ``memory_fragmentation_bound``); 1.10, the earlier prior,
    predicted that run would not fit. No factor below it is supported either: on the same card timm ran out
    of memory with ResNeXt-101 NCHW at batch 256 (estimated peak 20.7 GiB, lower), so what the estimate
    misses there is per model and layout (cuDNN workspace), not a smaller uniform factor (bench/README.md
    §8, "Memory"). Measure ``max_memory_reserved / max_memory_allocated`` on a GPU to replace it."""
    context_bytes: int = 512 * MIB
    """CUDA context + lazily loaded kernel images, outside PyTorch's allocator. Sources: pytorch PR
    #86509 (287 MB with CUDA_MODULE_LOADING=LAZY, 667 MB without), pytorch#109888 (ptrblck: "around
    400MB if CUDA >= 11.7 ... lazy module loading"), unsloth-zoo PR #1053 (426 MiB, RTX 6000 Ada, torch
    2.10). cuDNN/cuBLAS kernels loaded at first use add to it: 512 MiB is an *uncalibrated* round-up."""
    cublas_workspace_bytes: int = 4096 * 1024 * 2 + 16 * 1024 * 8
    """PyTorch's default ``CUBLAS_WORKSPACE_CONFIG`` ``:4096:2:16:8`` = 8,519,680 B for compute
    capability < 9 (aten/src/ATen/cuda/CublasHandlePool.cpp; the fixed 8519680 B block seen in
    discuss.pytorch.org/t/178671), allocated through the caching allocator at the first GEMM, kept."""
    cublas_workspace_bytes_sm90: int = 4096 * 1024 * 8
    """``:4096:8`` = 32 MiB default for compute capability >= 9 (same file)."""
    cublaslt_workspace_bytes: int = 1024 * 1024
    """cuBLASLt workspace: 1 MiB default (pytorch PR #120925: "Keep workspace_size = 1024 for small Ampere")"""
    cublaslt_workspace_bytes_sm80_large: int = 4 * MIB
    """4 MiB on compute capability 8.x with >= 24 GiB (same PR: NVIDIA's recommended size)"""
    cublaslt_workspace_bytes_sm90: int = 32 * MIB
    """32 MiB on compute capability >= 9 (same PR: "the recommended workspace size for Hopper is 32 MiB")"""

    def blas_workspace_bytes(self, gpu: GpuSpec) -> int:
        """cuBLAS + cuBLASLt workspaces PyTorch allocates on ``gpu`` (one stream: the training step's)."""
        from torchkit.estimate.roofline import cc_major

        major = cc_major(gpu)
        if major >= 9:
            return self.cublas_workspace_bytes_sm90 + self.cublaslt_workspace_bytes_sm90
        if major == 8 and gpu.memory_bytes >= 24 * 2**30:
            return self.cublas_workspace_bytes + self.cublaslt_workspace_bytes_sm80_large
        return self.cublas_workspace_bytes + self.cublaslt_workspace_bytes


DEFAULT_CUDA_OVERHEAD = CudaOverhead()


def device_bytes_from_peak(
    peak_bytes: int, gpu: GpuSpec, overhead: CudaOverhead = DEFAULT_CUDA_OVERHEAD
) -> int:
    """Device memory for a step whose CUDA peak (512-B rounded live bytes + kernel workspace) is
    ``peak_bytes``: ``ceil(fragmentation × peak) + context + cuBLAS/cuBLASLt workspaces``."""
    return (
        int(math.ceil(overhead.fragmentation_factor * peak_bytes))
        + overhead.context_bytes
        + overhead.blas_workspace_bytes(gpu)
    )
