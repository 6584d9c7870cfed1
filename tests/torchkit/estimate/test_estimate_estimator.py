"""The estimator's public functions (torchkit/estimate/estimator.py), held against exact byte and FLOP counts
and against the peak of the same training step really run on CPU (torch.profiler allocation records)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn

from torchkit.errors import ConfigError, UserError, WorkloadError
from torchkit.estimate import (
    DEFAULT_CUDA_OVERHEAD,
    ESTIMATOR_MIN_TORCH,
    check_estimator_torch,
    cpu_peak_bytes,
    cuda_device_bytes,
    curves_from_estimates,
    estimate_curves,
    estimate_step,
    estimate_steps,
    step_time_s,
)
from torchkit.estimate.cpu_truth import measure_cpu_peak
from torchkit.estimate.estimator import backward_share
from torchkit.estimate.roofline import kernels_time_s
from torchkit.estimate.time_model import constants_for
from torchkit.hardware.catalog import load_catalog
from torchkit.workloads import Workload, get_workload

MIB = 2**20
IN, HIDDEN, OUT = 64, 128, 10
MLP_PARAM_BYTES = 4 * (IN * HIDDEN + HIDDEN + HIDDEN * OUT + OUT)
MLP_PARAM_TENSORS = 4


def _mlp_workload() -> Workload:
    return Workload(
        name="test-mlp",
        sample_shape=(IN,),
        build_model=lambda: nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT)),
        make_batch=lambda b: (torch.randn(b, IN), None),
        loss_fn=lambda out, _: out.float().pow(2).mean(),
    )


def _conv_workload(hw: int = 16) -> Workload:
    return Workload(
        name="test-conv",
        sample_shape=(3, hw, hw),
        build_model=lambda: nn.Conv2d(3, 8, 3, padding=1, bias=False),
        make_batch=lambda b: (torch.randn(b, 3, hw, hw), None),
        loss_fn=lambda out, _: out.float().pow(2).mean(),
    )


def test_sgd_parameters_gradients_and_momentum_are_exact_bytes() -> None:
    est = estimate_step(_mlp_workload(), 4, optimizer="sgd")
    # tiny batch: the peak is in the optimizer step, where foreach SGD builds grad + wd·param as a new list
    assert est.peak_phase == "optimizer"
    assert est.breakdown_bytes["parameters"] == MLP_PARAM_BYTES
    assert est.breakdown_bytes["gradients"] == MLP_PARAM_BYTES
    assert est.breakdown_bytes["optimizer_state"] == MLP_PARAM_BYTES  # one momentum buffer per parameter
    assert est.breakdown_bytes["temporaries"] == MLP_PARAM_BYTES
    assert est.breakdown_bytes["inputs"] == 4 * IN * 4
    assert est.peak_allocated_bytes == sum(est.breakdown_bytes.values())


def test_adamw_state_is_two_fp32_copies_plus_step_scalars() -> None:
    est = estimate_step(_mlp_workload(), 4, optimizer="adamw")
    assert est.breakdown_bytes["parameters"] == MLP_PARAM_BYTES
    assert est.breakdown_bytes["gradients"] == MLP_PARAM_BYTES
    assert est.breakdown_bytes["optimizer_state"] == 2 * MLP_PARAM_BYTES + 4 * MLP_PARAM_TENSORS
    assert est.optimizer_peak_bytes == est.peak_allocated_bytes


def test_amp_keeps_fp32_parameters_and_runs_matmuls_in_16_bits() -> None:
    est = estimate_step(_mlp_workload(), 4, amp="bf16", optimizer="adamw")
    assert est.breakdown_bytes["parameters"] == MLP_PARAM_BYTES
    assert {k.compute for k in est.kernels if k.kind == "matmul"} == {"bf16"}


def test_flops_of_a_linear_net_equal_the_formula() -> None:
    batch = 8
    est = estimate_step(_mlp_workload(), batch)
    forward = 2 * batch * IN * HIDDEN + 2 * batch * HIDDEN * OUT
    # backward: both gradients of the last layer, only the weight gradient of the first (its input needs none)
    backward = 2 * (2 * batch * HIDDEN * OUT) + 2 * batch * IN * HIDDEN
    assert est.flops == forward + backward
    assert {c.name for c in est.op_costs if c.flops} == {"addmm.default", "mm.default"}


def test_flops_of_a_convolution_equal_the_formula() -> None:
    batch, hw = 4, 16
    est = estimate_step(_conv_workload(hw), batch)
    forward = 2 * batch * 8 * hw * hw * 3 * 3 * 3
    assert est.flops == 2 * forward  # forward + weight gradient (the image needs no gradient)


def test_bytes_moved_count_reads_and_writes() -> None:
    est = estimate_step(_mlp_workload(), 8)
    relu = [k for k in est.kernels if k.name == "relu.default"]
    assert len(relu) == 1 and relu[0].bytes_moved == 2 * 8 * HIDDEN * 4
    assert est.bytes_moved == sum(c.bytes_moved for c in est.op_costs)
    assert all(k.name not in ("view.default", "t.default", "detach.default") for k in est.kernels)


def test_memory_is_affine_in_batch_where_activations_dominate() -> None:
    estimates, passes = estimate_steps(_conv_workload(), (64, 128, 256))
    assert passes == 3
    (b0, m0), (b1, m1), (b2, m2) = [(e.batch, e.peak_allocated_bytes) for e in estimates]
    slope = (m2 - m0) / (b2 - b0)
    assert m1 == pytest.approx(m0 + slope * (b1 - b0), rel=1e-3)
    assert slope > 0


@pytest.mark.slow
def test_default_probes_are_colinear_for_a_resnet() -> None:
    curves = estimate_curves(get_workload("resnet18"), load_catalog().get("T4"))
    (b0, m0), (b1, m1), (b2, m2) = curves.allocated_points
    assert m1 == pytest.approx(m0 + (m2 - m0) / (b2 - b0) * (b1 - b0), rel=0.01)  # measured: 0.47% below
    assert curves.num_fake_passes == 3
    # below the probes the peak cannot fall under the optimizer step's: the floor says so
    assert 0 < curves.floor_device_bytes < curves.memory_points[0][1]


def test_cuda_device_bytes_add_the_documented_overhead(catalog) -> None:
    est = estimate_step(_conv_workload(), 4)
    peak = max(est.cuda_peak_with_workspace_bytes, est.cuda_rounded_peak_bytes)
    assert peak >= est.peak_allocated_bytes
    overhead = DEFAULT_CUDA_OVERHEAD
    t4 = catalog.get("T4")  # compute capability 7.5: cuBLAS :4096:2:16:8 + 1 MiB cuBLASLt
    assert (
        cuda_device_bytes(est, t4)
        == math.ceil(overhead.fragmentation_factor * peak) + 512 * MIB + 8_519_680 + MIB
    )
    h100 = catalog.get("H100-SXM5-80GB")  # compute capability 9.0: 32 MiB cuBLAS + 32 MiB cuBLASLt
    assert (
        cuda_device_bytes(est, h100) == math.ceil(overhead.fragmentation_factor * peak) + 512 * MIB + 64 * MIB
    )
    assert cuda_device_bytes(est, t4) > est.peak_allocated_bytes + overhead.context_bytes


@pytest.mark.slow
def test_step_time_grows_with_batch_and_is_shorter_on_h100_than_t4(catalog) -> None:
    estimates, _ = estimate_steps(get_workload("resnet50"), (16, 64, 256))
    for gpu_name in ("T4", "H100-SXM5-80GB"):
        times = [step_time_s(e, catalog.get(gpu_name)) for e in estimates]
        assert times == sorted(times) and times[0] < times[-1]
    assert step_time_s(estimates[-1], catalog.get("H100-SXM5-80GB")) < step_time_s(
        estimates[-1], catalog.get("T4")
    )


def test_grouped_convolutions_are_recorded_with_their_groups() -> None:
    workload = Workload(
        name="test-grouped",
        sample_shape=(8, 8, 8),
        build_model=lambda: nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=4), nn.Conv2d(8, 8, 1)),
        make_batch=lambda b: (torch.randn(b, 8, 8, 8), None),
        loss_fn=lambda out, _: out.float().pow(2).mean(),
    )
    est = estimate_step(workload, 2)
    convs = [k for k in est.kernels if k.kind == "conv"]
    assert {k.groups for k in convs} == {1, 4}
    assert all(k.groups == 1 for k in est.kernels if k.kind != "conv")


def test_channels_last_changes_the_step_time_by_the_layout_model(catalog) -> None:
    """16-bit convolutions are NHWC kernels: channels_last saves their transposes; fp32 ones on Volta are
    NCHW kernels: channels_last costs the transposes instead."""
    from dataclasses import replace

    from torchkit.estimate.time_model import load_time_model

    v100 = catalog.get("V100-SXM2-16GB")
    amp = estimate_step(
        _conv_workload(224), 32, amp="fp16"
    )  # large enough to be GPU-bound, not dispatch-bound
    fp32 = estimate_step(_conv_workload(224), 32)
    assert step_time_s(amp, v100, channels_last=True) < step_time_s(amp, v100)
    assert step_time_s(fp32, v100, channels_last=True) > step_time_s(fp32, v100)
    no_cost = replace(load_time_model().constants_for(v100), layout_conversion_factor=1e-12)
    assert step_time_s(amp, v100, channels_last=True, constants=no_cost) == pytest.approx(
        step_time_s(amp, v100, constants=no_cost)
    )
    curves = estimate_curves(_conv_workload(224), v100, amp="fp16", batches=(32, 64), channels_last=True)
    assert curves.time_points[0][1] == pytest.approx(step_time_s(amp, v100, channels_last=True))


def test_step_time_uses_the_calibrated_constants_of_the_gpus_architecture(catalog) -> None:
    from dataclasses import replace

    from torchkit.estimate.time_model import load_time_model

    v100 = catalog.get("V100-SXM2-16GB")
    est = estimate_step(_conv_workload(224), 32, amp="fp16")
    calibrated = load_time_model().constants_for(v100)
    assert calibrated == load_time_model().arch_constants["volta"]
    assert step_time_s(est, v100) == pytest.approx(step_time_s(est, v100, constants=calibrated))
    slower = replace(calibrated, bandwidth_efficiency=calibrated.bandwidth_efficiency / 2)
    assert step_time_s(est, v100, constants=slower) > step_time_s(est, v100)


@pytest.mark.slow
def test_estimates_are_reused_from_the_cache_for_every_gpu(catalog) -> None:
    cache: dict = {}
    workload = get_workload("resnet18", imgsz=64)
    first = estimate_curves(workload, catalog.get("T4"), batches=(4, 8), estimates_cache=cache)
    again = estimate_curves(workload, catalog.get("A100-SXM4-80GB"), batches=(4, 8), estimates_cache=cache)
    assert (first.num_fake_passes, again.num_fake_passes) == (2, 0)
    assert first.allocated_points == again.allocated_points
    assert len(cache) == 2
    priced = curves_from_estimates(list(cache.values()), catalog.get("A100-SXM4-80GB"))
    assert priced.memory_points == again.memory_points and priced.time_points == again.time_points


def test_bf16_curves_on_a_gpu_without_bf16_are_a_config_error(catalog) -> None:
    with pytest.raises(ConfigError, match=r"T4 has no bf16 support \(use --amp fp16 or off\)"):
        estimate_curves(_mlp_workload(), catalog.get("T4"), amp="bf16", batches=(2, 4))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"batch": 0}, WorkloadError, r"batch size must be a positive integer, got 0"),
        ({"batch": 2, "amp": "fp8"}, ConfigError, r"unknown amp mode 'fp8' \(use one of: fp16, bf16, off\)"),
        (
            {"batch": 2, "optimizer": "lion"},
            ConfigError,
            r"unknown optimizer 'lion' \(use one of: sgd, adamw\)",
        ),
    ],
)
def test_bad_options_are_user_errors(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        estimate_step(_mlp_workload(), **kwargs)


class _DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        return y[y > 0]  # boolean-mask indexing: the output shape depends on the values


def test_data_dependent_model_is_a_workload_error_that_says_why() -> None:
    workload = Workload(
        name="test-data-dependent",
        sample_shape=(4,),
        build_model=_DataDependent,
        make_batch=lambda b: (torch.randn(b, 4), None),
        loss_fn=lambda out, _: out.sum(),
    )
    with pytest.raises(WorkloadError, match=r"failed on fake tensors.*data-dependent ops"):
        estimate_step(workload, 2)


def test_failing_factory_is_a_workload_error() -> None:
    def broken() -> nn.Module:
        raise OSError("checkpoint not found")

    workload = Workload(
        name="broken",
        sample_shape=(4,),
        build_model=broken,
        make_batch=lambda b: (None, None),
        loss_fn=lambda out, _: out,
    )
    with pytest.raises(
        WorkloadError, match=r"model factory of 'broken' failed: OSError: checkpoint not found"
    ):
        estimate_step(workload, 2)


def test_the_declared_torch_range_is_checked() -> None:
    check_estimator_torch()  # the installed torch is supported
    check_estimator_torch(ESTIMATOR_MIN_TORCH)
    with pytest.raises(UserError, match=r"needs torch >= 2.4.0, found 2.3.1"):
        check_estimator_torch("2.3.1")


def test_input_builder_failure_is_a_workload_error() -> None:
    def make_batch(batch: int):
        raise ValueError("no data")

    workload = Workload(
        name="no-data",
        sample_shape=(IN,),
        build_model=lambda: nn.Linear(IN, 2),
        make_batch=make_batch,
        loss_fn=lambda out, _: out.sum(),
    )
    with pytest.raises(
        WorkloadError, match=r"input builder of 'no-data' failed at batch 2: ValueError: no data"
    ):
        estimate_step(workload, 2)


# --- accuracy against the real CPU peak (torch.profiler allocation records) ----------------------------
CPU_CASES = [
    ("resnet18", {"imgsz": 64}, 4, "sgd"),  # peak at a 2x2 conv backward: oneDNN's 4·T·w weight scratch
    ("resnet50", {"imgsz": 64}, 8, "sgd"),
    ("yolo-n", {"imgsz": 128}, 2, "adamw"),
    ("vit-b16", {"imgsz": 32}, 8, "sgd"),
    ("gpt2-small", {"seq_len": 32}, 2, "sgd"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "kwargs", "batch", "optimizer"), CPU_CASES)
def test_estimated_cpu_peak_is_within_10_percent_of_the_real_one(name, kwargs, batch, optimizer) -> None:
    workload = get_workload(name, **kwargs)
    estimate = estimate_step(workload, batch, optimizer=optimizer, target="cpu")
    truth = measure_cpu_peak(workload, batch, optimizer=optimizer)
    assert cpu_peak_bytes(estimate) == pytest.approx(truth.peak_bytes, rel=0.10)


@pytest.mark.slow
def test_cpu_kernel_workspace_model_explains_the_convolution_scratch() -> None:
    # two convolutions at 64x64, peak in the second one's backward: oneDNN reorders its input and its
    # output gradient into scratch buffers that fake tensors never see (measured: 12.6 MiB fake, 20.6 real)
    workload = Workload(
        name="two-convs",
        sample_shape=(3, 64, 64),
        build_model=lambda: nn.Sequential(
            nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1)
        ),
        make_batch=lambda b: (torch.randn(b, 3, 64, 64), None),
        loss_fn=lambda out, _: out.mean(),
    )
    estimate = estimate_step(workload, 4)
    truth = measure_cpu_peak(workload, 4)
    assert estimate.peak_allocated_bytes < 0.9 * truth.peak_bytes  # fake tensors alone miss the scratch
    assert cpu_peak_bytes(estimate) == pytest.approx(truth.peak_bytes, rel=0.05)


@pytest.mark.slow
def test_both_ground_truth_readings_agree() -> None:
    workload = _conv_workload(32)
    by_events = measure_cpu_peak(workload, 4, method="allocations")
    by_memory_profile = measure_cpu_peak(workload, 4, method="memory_profile")
    assert by_events.peak_bytes == by_memory_profile.peak_bytes > 0


def _curves(times_s: tuple[float, float, float]):
    from torchkit.estimate import EstimatedCurves

    batches = (32, 128, 512)
    return EstimatedCurves(
        memory_points=tuple((b, 2**30 + b * 2**20) for b in batches),  # 1 GiB + 1 MiB per sample
        time_points=tuple(zip(batches, times_s, strict=True)),
        allocated_points=(),
        breakdown_bytes={},
        num_fake_passes=0,
    )


def test_a_range_probe_is_asked_for_only_where_the_probes_cannot_price_the_cap() -> None:
    from torchkit.estimate import range_probe_batch

    floor = (1e-3, 1e-3, 1.001e-3)  # launch-bound: every probe on the dispatch floor
    assert range_probe_batch(_curves(floor), 16 * 2**30, upper=65536) == pytest.approx(
        15 * 1024, abs=1
    )  # the card
    assert range_probe_batch(_curves(floor), 16 * 2**30, upper=4000) == 4000  # never past the planning bound
    assert range_probe_batch(_curves(floor), 3 * 2**30, upper=65536) is None  # cap 2048 < 4 × 512: in range
    assert range_probe_batch(_curves((1e-3, 4e-3, 16e-3)), 16 * 2**30, upper=65536) is None  # GPU-bound


def test_kernels_say_their_pass_and_the_backward_share_is_the_backward_kernels_roofline_share(
    catalog,
) -> None:
    est = estimate_step(_mlp_workload(), 256)
    assert {k.phase for k in est.kernels} == {"forward", "backward", "optimizer"}
    # a Linear's backward: the weight gradient (a matmul of the forward's FLOPs) and, but for the first layer
    # (its input needs none), the input gradient
    matmul_flops = {
        p: sum(k.flops for k in est.kernels if k.phase == p and k.kind == "matmul")
        for p in ("forward", "backward")
    }
    assert matmul_flops["forward"] == 2 * 256 * (IN * HIDDEN + HIDDEN * OUT)
    assert matmul_flops["backward"] == matmul_flops["forward"] + 2 * 256 * HIDDEN * OUT
    gpu = catalog.get("A100-SXM4-80GB")
    share = backward_share(est, gpu)
    forward_s = kernels_time_s(
        [k for k in est.kernels if k.phase == "forward"], gpu, constants=constants_for(gpu)
    )
    backward_s = kernels_time_s(
        [k for k in est.kernels if k.phase == "backward"], gpu, constants=constants_for(gpu)
    )
    assert share == pytest.approx(backward_s / (forward_s + backward_s)) and 0.4 < share < 0.9
    curves = curves_from_estimates([est], gpu)
    assert curves.backward_shares == ((256, share),)
    unmarked = dataclasses.replace(est, kernels=tuple(dataclasses.replace(k, phase="") for k in est.kernels))
    assert (
        backward_share(unmarked, gpu) is None and curves_from_estimates([unmarked], gpu).backward_shares == ()
    )
