"""Software stacks of the calibration data, and what each may be used for.

The estimator predicts a step as PyTorch eager runs it (``pytorch-eager``: the reference stack). Public
throughput of Hopper, Ada and Turing cards comes mostly from other stacks: MLPerf Training's tuned NVIDIA
containers (MXNet ResNet-50 with fused NHWC kernels, DALI and CUDA graphs, measured per GPU of a
data-parallel run) and single-GPU ``torch.compile`` scripts. Such rows are honest as *ratios between GPU
types inside one stack* (``../shared/reference/gpu-throughput-hopper-ada-turing.md``), not as eager PyTorch
throughput: the fit gives every other stack two terms of its own (``calibration/fit.py``):

* a throughput factor: the stack's speed on any GPU relative to eager PyTorch (tuned kernels, input
  pipeline, the per-GPU share of a data-parallel run);
* a memory-traffic factor: the share of the elementwise/normalisation kernels' bytes the stack still moves
  (fused kernels do not write and read back what eager PyTorch does: MLPerf's ResNet-50 fuses batch norm and
  ReLU into its NHWC convolutions, ``symbols/resnet-v1b-normconv-fl.py``; Inductor fuses pointwise chains).
  Without it a fused stack's ratios between a compute-rich card and a bandwidth-rich one would be read as
  architecture efficiencies (the TensorFlow rows rejected in bench/README.md section 8 failed that way).

Both are determined by architectures the data shows in the reference stack *and* in the other stack (the
anchors: A100, A30, A40 in MLPerf; A100 and RTX 3090 in the compiled script, the V100 in its sm7x variant),
so a Hopper, Ada or Turing card seen only in another stack is placed relative to those anchors, never by its
absolute throughput.
"""

from __future__ import annotations

from dataclasses import dataclass

REFERENCE_STACK = "pytorch-eager"


@dataclass(frozen=True, kw_only=True)
class Stack:
    """One software stack rows can come from."""

    name: str
    description: str
    row_log_sigma: float
    """assumed noise of one row in log throughput (its weight in the fit)"""
    cuda_graphs: bool
    """the stack replays CUDA graphs: no per-operator CPU dispatch bounds its step"""
    fused: bool
    """the stack fuses elementwise kernels: it gets a memory-traffic factor"""


STACKS: dict[str, Stack] = {
    s.name: s
    for s in (
        Stack(
            name=REFERENCE_STACK,
            description="PyTorch eager, one GPU (what the estimator predicts)",
            # repeats of one configuration in the data differ by ~4% (DeepLearningExamples V100 16 GB vs 32 GB
            # AMP 1200 vs 1156 img/s; sandeepkumar-skb vs DLE V100 AMP NHWC 1154 vs 1200)
            row_log_sigma=0.05,
            cuda_graphs=False,
            fused=False,
        ),
        Stack(
            name="mlperf-mxnet",
            description="MLPerf Training ResNet-50, NVIDIA's MXNet container (fused NHWC kernels, DALI, CUDA "
            "graphs), throughput per GPU of a data-parallel run",
            # the same card differs 16-19% across submitters and containers (L40S 2204 vs 1852-1858 img/s):
            # about 0.08 in log either way
            row_log_sigma=0.08,
            cuda_graphs=True,
            fused=True,
        ),
        Stack(
            name="pytorch-compile",
            description="PyTorch 2.8-2.10 torch.compile(mode='reduce-overhead'), one GPU, synthetic data on the GPU, "
            "bf16 autocast on compute capability 8.0 and later (xiaoran007/GPU-Insights)",
            # one run per card, no repeats published; the eager rows' noise plus the compiler's variation
            row_log_sigma=0.06,
            cuda_graphs=True,
            fused=True,
        ),
        Stack(
            name="pytorch-compile-sm7x",
            description="the same script on compute capability 7.x (Volta, Turing): fp16 autocast with a GradScaler "
            "(no bf16), and scaled_dot_product_attention's memory-efficient kernel, since PyTorch's "
            "FlashAttention needs sm80: another kernel set, so another stack",
            row_log_sigma=0.06,
            cuda_graphs=True,
            fused=True,
        ),
    )
}
"""every stack a row may name (the ``stack`` column of ``measured_throughput.csv``)"""
