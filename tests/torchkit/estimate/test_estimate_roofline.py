"""Roofline step time (torchkit/estimate/roofline.py): pure arithmetic on recorded kernels."""

from __future__ import annotations

import pytest

from torchkit.errors import ConfigError
from torchkit.estimate.op_costs import KernelCost
from torchkit.estimate.roofline import KernelTable, TimeConstants, kernel_table, kernels_time_s

C = TimeConstants(
    tensor_core_efficiency=0.5,
    tf32_efficiency=0.4,
    fp32_efficiency=0.8,
    bandwidth_efficiency=0.6,
    layout_conversion_factor=1.5,
    grouped_conv_efficiency=0.25,
    kernel_launch_s=2e-6,
    eager_dispatch_s=10e-6,
)


def _kernel(
    flops: int = 0, moved: int = 0, compute: str = "fp32", kind: str = "matmul", groups: int = 1
) -> KernelCost:
    return KernelCost(name="k", flops=flops, bytes_moved=moved, compute=compute, kind=kind, groups=groups)


def _time(kernels, gpu, **kw) -> float:
    return kernels_time_s(kernels, gpu, constants=C, **kw)


def test_compute_bound_kernel_takes_flops_over_efficient_peak(catalog) -> None:
    t4 = catalog.get("T4")
    kernel = _kernel(flops=10**12, moved=10**6, compute="fp16")
    expected = 10**12 / (0.5 * t4.fp16_tflops * 1e12) + 2e-6
    assert _time([kernel], t4, amp="fp16") == pytest.approx(expected)


def test_memory_bound_kernel_takes_bytes_over_efficient_bandwidth(catalog) -> None:
    a100 = catalog.get("A100-SXM4-80GB")
    expected = 10**9 / (0.6 * a100.memory_bandwidth_bytes_per_s) + 2e-6
    assert _time([_kernel(moved=10**9, kind="other")], a100) == pytest.approx(expected)


def test_fp32_convolution_uses_tf32_on_ampere_but_not_on_volta(catalog) -> None:
    conv = _kernel(flops=10**12, kind="conv")
    matmul = _kernel(flops=10**12, kind="matmul")
    a100, v100 = catalog.get("A100-SXM4-80GB"), catalog.get("V100-SXM2-16GB")
    assert _time([conv], a100) == pytest.approx(10**12 / (0.4 * a100.fp16_tflops * 1e12 / 2) + 2e-6)
    # matmul allow_tf32 is False by default
    assert _time([matmul], a100) == pytest.approx(10**12 / (0.8 * a100.fp32_tflops * 1e12) + 2e-6)
    assert _time([conv], v100) == pytest.approx(10**12 / (0.8 * v100.fp32_tflops * 1e12) + 2e-6)


def test_layout_conversion_is_paid_where_the_layout_is_not_the_kernels_native_one(catalog) -> None:
    v100 = catalog.get("V100-SXM2-16GB")
    bw = 0.6 * v100.memory_bandwidth_bytes_per_s
    conv16 = _kernel(flops=10**9, moved=10**8, compute="fp16", kind="conv")
    conv32 = _kernel(flops=10**9, moved=10**8, compute="fp32", kind="conv")
    convert = 1.5 * 10**8 / bw
    # tensor-core (16-bit) convolutions are NHWC kernels: NCHW tensors pay the transposes
    assert _time([conv16], v100, channels_last=False) - _time(
        [conv16], v100, channels_last=True
    ) == pytest.approx(convert)
    # fp32 CUDA-core convolutions are NCHW kernels: channels_last pays instead
    assert _time([conv32], v100, channels_last=True) - _time(
        [conv32], v100, channels_last=False
    ) == pytest.approx(convert)
    # other kernels do not care
    other = _kernel(moved=10**8, kind="other")
    assert _time([other], v100, channels_last=True) == _time([other], v100, channels_last=False)


def test_grouped_convolution_runs_at_the_grouped_efficiency(catalog) -> None:
    gpu = catalog.get("RTX-3090")
    dense = _kernel(flops=10**12, moved=10, compute="fp16", kind="conv")
    grouped = _kernel(flops=10**12, moved=10, compute="fp16", kind="conv", groups=32)
    assert _time([grouped], gpu, amp="fp16", channels_last=True) - 2e-6 == pytest.approx(
        (_time([dense], gpu, amp="fp16", channels_last=True) - 2e-6) / 0.25
    )


def test_many_tiny_kernels_are_bound_by_eager_dispatch(catalog) -> None:
    tiny = [_kernel(moved=1024, kind="other")] * 1000
    assert _time(tiny, catalog.get("H100-SXM5-80GB")) == pytest.approx(1000 * 10e-6)


def test_a_table_prices_like_its_kernels_and_survives_json(catalog) -> None:
    kernels = [
        _kernel(flops=10**11, moved=10**7, compute="bf16", kind="conv"),
        _kernel(flops=10**11, moved=10**7, compute="bf16", kind="conv"),
        _kernel(flops=10**10, moved=10**6, compute="fp32"),
        _kernel(moved=10**8, kind="other"),
    ]
    table = kernel_table(kernels)
    assert table.num_kernels == 4 and len(table.count) == 3  # the two identical convolutions are one row
    gpu = catalog.get("A100-SXM4-80GB")
    again = KernelTable.from_json(table.to_json())
    assert _time(again, gpu, amp="bf16") == pytest.approx(_time(kernels, gpu, amp="bf16"))


def test_time_grows_with_work_and_is_shorter_on_faster_gpus(catalog) -> None:
    def step(scale: int) -> list[KernelCost]:
        return [
            _kernel(flops=scale * 10**11, moved=scale * 10**8, compute="fp16"),
            _kernel(moved=scale * 10**8, kind="other"),
        ]

    for name in ("T4", "A100-SXM4-80GB", "H100-SXM5-80GB"):
        times = [_time(step(s), catalog.get(name), amp="fp16") for s in (1, 4, 16)]
        assert times[0] < times[1] < times[2]
    slowest_to_fastest = [
        _time(step(4), catalog.get(n), amp="fp16") for n in ("T4", "A100-SXM4-80GB", "H100-SXM5-80GB")
    ]
    assert slowest_to_fastest == sorted(slowest_to_fastest, reverse=True)


def test_bf16_on_a_gpu_without_it_is_a_config_error(catalog) -> None:
    with pytest.raises(ConfigError, match=r"V100-SXM2-16GB has no bf16 support \(use --amp fp16 or off\)"):
        _time([_kernel(flops=1, compute="bf16")], catalog.get("V100-SXM2-16GB"), amp="bf16")


def test_a_streaming_kernel_runs_at_the_soft_minimum_of_dram_and_sm_rates(catalog) -> None:
    """``sm_stream_bytes_per_flop`` bounds what the SMs can stream (bytes per FP32 FLOP of the card): no limit
    by default; well below the DRAM's rate it decides; the H200 (the H100's SMs, 1.43x its DRAM) then gains
    little on a memory-bound step."""
    from dataclasses import replace

    from torchkit.estimate.roofline import STREAMING_SOFTMIN_POWER, streaming_bytes_per_s

    kernel = _kernel(moved=10**10)
    h100, h200 = catalog.get("H100-SXM5-80GB"), catalog.get("H200-SXM-141GB")
    dram = 0.6 * h100.memory_bandwidth_bytes_per_s
    assert _time([kernel], h100) == pytest.approx(10**10 / dram + 2e-6)  # C has no limit (inf)
    limited = replace(C, sm_stream_bytes_per_flop=0.02)
    sm = 0.02 * h100.fp32_tflops * 1e12
    rate = (dram**-STREAMING_SOFTMIN_POWER + sm**-STREAMING_SOFTMIN_POWER) ** (-1 / STREAMING_SOFTMIN_POWER)
    assert rate == pytest.approx(streaming_bytes_per_s(dram, sm)) and rate < min(dram, sm)
    assert kernels_time_s([kernel], h100, constants=limited) == pytest.approx(10**10 / rate + 2e-6)
    gain_free = _time([kernel], h100) / _time([kernel], h200)
    gain_limited = kernels_time_s([kernel], h100, constants=limited) / kernels_time_s(
        [kernel], h200, constants=limited
    )
    assert gain_free == pytest.approx(4800 / 3350, rel=1e-3) and gain_limited < 1.05
    assert streaming_bytes_per_s(dram, float("inf")) == dram
