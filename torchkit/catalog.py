"""The GPU catalog: specs of the GPU types batchplan plans for, loaded from ``cluster_configs/gpus.yaml``.

Pure Python + PyYAML (no torch). Used by the estimator (roofline step time, device memory) and by the
planner (cluster configs name catalog types; real nodes map NVML names to catalog entries via aliases).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    """One GPU type. Throughputs are dense (no sparsity) peaks from the vendor datasheet."""

    name: str
    """canonical type name, e.g. ``A100-SXM4-80GB``"""
    aliases: tuple[str, ...] = ()
    """names NVML reports for this type, e.g. ``NVIDIA A100-SXM4-80GB``; matched case-insensitively"""
    memory_bytes: int
    """total memory as the driver reports it (``nvmlDeviceGetMemoryInfo().total``), in bytes"""
    fp16_tflops: float
    """dense FP16 tensor-core peak, TFLOP/s"""
    bf16_tflops: float | None
    """dense BF16 tensor-core peak, TFLOP/s; None where the GPU has no BF16 support"""
    fp32_tflops: float
    """FP32 peak (non-tensor-core; TF32 is not assumed), TFLOP/s"""
    memory_bandwidth_bytes_per_s: float
    """DRAM bandwidth, bytes/s"""
    compute_capability: str = ""
    """CUDA compute capability, e.g. ``8.0``"""
    source: str = ""
    """where the figures come from (datasheet URL or document)"""

    @property
    def supports_bf16(self) -> bool:
        return self.bf16_tflops is not None and self.bf16_tflops > 0

    def peak_flops_per_s(self, amp: str) -> float:
        """Peak FLOP/s for an AMP mode (``fp16``, ``bf16`` or ``off``)."""
        if amp == "fp16":
            return self.fp16_tflops * 1e12
        if amp == "bf16":
            if not self.supports_bf16:
                raise ValueError(f"{self.name} has no bf16 support (use --amp fp16)")
            return float(self.bf16_tflops) * 1e12
        if amp == "off":
            return self.fp32_tflops * 1e12
        raise ValueError(f"unknown amp mode {amp!r} (use fp16, bf16 or off)")
