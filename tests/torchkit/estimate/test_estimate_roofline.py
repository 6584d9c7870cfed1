"""Roofline step time (torchkit/estimate/roofline.py): pure arithmetic on recorded kernels."""

from __future__ import annotations

import pytest

from torchkit.errors import ConfigError
from torchkit.estimate.op_costs import KernelCost
from torchkit.estimate.roofline import (
    BANDWIDTH_EFFICIENCY,
    COMPUTE_EFFICIENCY,
    EAGER_DISPATCH_S,
    KERNEL_LAUNCH_S,
    kernel_time_s,
    kernels_time_s,
)
from torchkit.hardware.catalog import load_catalog


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def _kernel(flops: int = 0, moved: int = 0, compute: str = "fp32", kind: str = "matmul") -> KernelCost:
    return KernelCost(name="k", flops=flops, bytes_moved=moved, compute=compute, kind=kind)


def test_compute_bound_kernel_takes_flops_over_efficient_peak(catalog) -> None:
    t4 = catalog.get("T4")
    kernel = _kernel(flops=10**12, moved=10**6, compute="fp16")
    expected = 10**12 / (COMPUTE_EFFICIENCY * t4.fp16_tflops * 1e12) + KERNEL_LAUNCH_S
    assert kernel_time_s(kernel, t4) == pytest.approx(expected)


def test_memory_bound_kernel_takes_bytes_over_efficient_bandwidth(catalog) -> None:
    a100 = catalog.get("A100-SXM4-80GB")
    kernel = _kernel(moved=10**9, kind="other")
    expected = 10**9 / (BANDWIDTH_EFFICIENCY * a100.memory_bandwidth_bytes_per_s) + KERNEL_LAUNCH_S
    assert kernel_time_s(kernel, a100) == pytest.approx(expected)


def test_fp32_convolution_uses_tf32_on_ampere_but_not_on_volta(catalog) -> None:
    conv = _kernel(flops=10**12, kind="conv")
    matmul = _kernel(flops=10**12, kind="matmul")
    a100, v100 = catalog.get("A100-SXM4-80GB"), catalog.get("V100-SXM2-16GB")
    tf32 = 10**12 / (COMPUTE_EFFICIENCY * a100.fp16_tflops * 1e12 / 2) + KERNEL_LAUNCH_S
    assert kernel_time_s(conv, a100) == pytest.approx(tf32)
    fp32 = 10**12 / (COMPUTE_EFFICIENCY * a100.fp32_tflops * 1e12) + KERNEL_LAUNCH_S
    assert kernel_time_s(matmul, a100) == pytest.approx(fp32)  # matmul allow_tf32 is False by default
    assert kernel_time_s(conv, v100) == pytest.approx(
        10**12 / (COMPUTE_EFFICIENCY * v100.fp32_tflops * 1e12) + KERNEL_LAUNCH_S
    )


def test_many_tiny_kernels_are_bound_by_eager_dispatch(catalog) -> None:
    tiny = [_kernel(moved=1024, kind="other")] * 1000
    assert kernels_time_s(tiny, catalog.get("H100-SXM5-80GB")) == pytest.approx(1000 * EAGER_DISPATCH_S)


def test_time_grows_with_work_and_is_shorter_on_faster_gpus(catalog) -> None:
    def step(scale: int) -> list[KernelCost]:
        return [
            _kernel(flops=scale * 10**11, moved=scale * 10**8, compute="fp16"),
            _kernel(moved=scale * 10**8, kind="other"),
        ]

    for name in ("T4", "A100-SXM4-80GB", "H100-SXM5-80GB"):
        times = [kernels_time_s(step(s), catalog.get(name), amp="fp16") for s in (1, 4, 16)]
        assert times[0] < times[1] < times[2]
    slowest_to_fastest = [
        kernels_time_s(step(4), catalog.get(n), amp="fp16")
        for n in ("T4", "A100-SXM4-80GB", "H100-SXM5-80GB")
    ]
    assert slowest_to_fastest == sorted(slowest_to_fastest, reverse=True)


def test_bf16_on_a_gpu_without_it_is_a_config_error(catalog) -> None:
    with pytest.raises(ConfigError, match=r"V100-SXM2-16GB has no bf16 support \(use --amp fp16 or off\)"):
        kernels_time_s([_kernel(flops=1, compute="bf16")], catalog.get("V100-SXM2-16GB"), amp="bf16")
