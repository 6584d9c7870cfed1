"""torchkit.seed_api.autobatch: out-of-memory recognition, the probing loop, the probe step, the CPU edge.

The probing loop is exercised with synthetic ``measure`` callables (our own loop logic); torch.cuda itself is
never faked. The CPU edge, the path this machine really takes, is tested as is.
"""

from __future__ import annotations

import logging

import pytest
import torch

from torchkit.errors import WorkloadError
from torchkit.seed_api.autobatch import (
    autobatch,
    build_optimizer,
    check_train_batch_size,
    image_batch_factory,
    input_channels,
    loss_envelope_bytes,
    probe_step,
    run_probes,
)
from torchkit.seed_api.batch_choice import PROBES_LARGE_GPU, choose_batch
from torchkit.units import GIB

# ----------------------------------------------------------------------------------------------------------
# out-of-memory recognition and the probing loop
# ----------------------------------------------------------------------------------------------------------


def synthetic_measure(intercept_bytes, bytes_per_sample, limit_bytes, calls):
    """Peak of an affine step; torch.cuda.OutOfMemoryError above ``limit_bytes``. Records each call."""

    def measure(batch):
        calls.append(batch)
        peak = intercept_bytes + bytes_per_sample * batch
        if peak > limit_bytes:
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {peak} bytes\nmore lines"
            )
        return peak

    return measure


def test_run_probes_stops_at_the_first_oom_and_cleans_up_after_each():
    calls, cleaned = [], []
    outcomes = run_probes(
        PROBES_LARGE_GPU, synthetic_measure(GIB, GIB, 20 * GIB, calls), cleanup=lambda: cleaned.append(1)
    )
    assert calls == [1, 2, 4, 8, 16, 32]  # 64 never tried
    assert [o.peak_bytes for o in outcomes] == [2 * GIB, 3 * GIB, 5 * GIB, 9 * GIB, 17 * GIB, None]
    assert outcomes[-1].out_of_memory
    assert outcomes[-1].error == f"OutOfMemoryError: CUDA out of memory. Tried to allocate {33 * GIB} bytes"
    assert len(cleaned) == 6


def test_run_probes_goes_on_after_an_error_that_is_not_oom(caplog):
    def measure(batch):
        if batch == 1:
            raise ValueError("Expected more than 1 value per channel when training")
        return batch * GIB

    with caplog.at_level(logging.WARNING, logger="torchkit.seed_api.autobatch"):
        outcomes = run_probes([1, 2, 4], measure)
    assert [(o.batch, o.peak_bytes, o.out_of_memory) for o in outcomes] == [
        (1, None, False),
        (2, 2 * GIB, False),
        (4, 4 * GIB, False),
    ]
    assert "AutoBatch: batch 1 failed: ValueError: Expected more than 1 value per channel" in caplog.text


def test_probing_then_choosing_with_a_synthetic_affine_device():
    # 1 G fixed + 0.5 G per sample on a 24 G device with 23 G available: 32 fits, 64 runs out of memory
    calls = []
    outcomes = run_probes(PROBES_LARGE_GPU, synthetic_measure(GIB, GIB // 2, 23 * GIB, calls))
    choice = choose_batch(
        [o.batch for o in outcomes],
        [o.peak_bytes for o in outcomes],
        total_bytes=24 * GIB,
        available_bytes=23 * GIB,
    )
    assert calls == list(PROBES_LARGE_GPU)
    assert choice.batch == int((0.6 * 23 - 1) / 0.5) == 25
    assert choice.oom_ceiling == 64 and choice.limited_by == "budget"


def test_probe_step_failure_on_batch_1_batchnorm_is_a_real_non_oom_error():
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.BatchNorm1d(4)
    ).train()
    optimizer = build_optimizer(model, "sgd")
    make = image_batch_factory(model, 8, torch.device("cpu"))

    def measure(batch):
        probe_step(model, optimizer, make(batch))
        return GIB + batch * GIB // 8  # synthetic peak: CPU has no allocator statistics

    outcomes = run_probes([1, 2, 4], measure)
    assert outcomes[0].error.startswith("ValueError: Expected more than 1 value per channel")
    assert not outcomes[0].out_of_memory and outcomes[1].peak_bytes is not None
    choice = choose_batch(
        [o.batch for o in outcomes],
        [o.peak_bytes for o in outcomes],
        total_bytes=8 * GIB,
        available_bytes=8 * GIB,
    )
    assert choice.batch == int((0.6 * 8 - 1) * 8)
    assert "failed below the smallest batch that ran (2)" in choice.warnings[0]


# ----------------------------------------------------------------------------------------------------------
# the training step, inputs and the loss envelope (CPU)
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "buffers"), [("sgd", {"momentum_buffer"}), ("adamw", {"step", "exp_avg", "exp_avg_sq"})]
)
def test_probe_step_takes_an_optimizer_step_and_frees_gradients(name, buffers):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten()).train()
    before = model[0].weight.detach().clone()
    optimizer = build_optimizer(model, name)
    probe_step(model, optimizer, torch.rand(2, 3, 8, 8))
    assert not torch.equal(model[0].weight, before)
    assert set(optimizer.state[model[0].weight]) == buffers
    assert all(p.grad is None for p in model.parameters())


def test_probe_step_accepts_tuple_and_dict_inputs_and_dict_outputs():
    class TwoInputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 2)

        def forward(self, x, y=None):
            return {"logits": self.linear(x + (0 if y is None else y)), "ids": torch.arange(3)}

    model = TwoInputs()
    probe_step(model, None, (torch.rand(2, 4), torch.rand(2, 4)))
    probe_step(model, None, {"x": torch.rand(2, 4)})


def test_probe_step_without_a_differentiable_output_is_a_workload_error():
    model = torch.nn.Linear(4, 2).requires_grad_(False)
    with pytest.raises(WorkloadError, match="no floating-point tensor that needs a gradient"):
        probe_step(model, build_optimizer(model, "sgd"), torch.rand(2, 4))


def test_input_channels_from_yaml_then_first_conv_then_3():
    conv = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3))
    assert input_channels(conv) == 1
    conv.yaml = {"channels": 4}
    assert input_channels(conv) == 4
    assert input_channels(torch.nn.Linear(3, 3)) == 3
    assert image_batch_factory(torch.nn.Conv2d(5, 1, 1), 32, torch.device("cpu"))(3).shape == (3, 5, 32, 32)


def test_loss_envelope_matches_the_seeds_examples_at_640():
    strides = [8, 16, 32]  # 8400 anchors at 640
    mib = 2**20
    assert loss_envelope_bytes(1, 640, strides, 80, 4) / mib == pytest.approx(31.5, abs=0.05)
    assert loss_envelope_bytes(1, 640, strides, 80, 360) / mib == pytest.approx(100, abs=0.05)
    assert loss_envelope_bytes(16, 640, strides, 80, 360) / GIB == pytest.approx(1.56, abs=0.005)
    assert loss_envelope_bytes(1, 640, strides, 365, 2000) / mib == pytest.approx(525, abs=0.5)


# ----------------------------------------------------------------------------------------------------------
# the CPU edge: the seed's fallback and messages
# ----------------------------------------------------------------------------------------------------------


def test_autobatch_on_cpu_returns_batch_size_with_the_seeds_warning(caplog):
    model = torch.nn.Conv2d(3, 4, 3)
    with caplog.at_level(logging.INFO, logger="torchkit.seed_api.autobatch"):
        assert autobatch(model, imgsz=320, batch_size=24) == 24
    assert [r.getMessage() for r in caplog.records] == [
        "AutoBatch: Computing optimal batch size for imgsz=320 at 60.0% GPU memory utilization.",
        "AutoBatch: intended for GPU devices, using default batch-size 24",
    ]
    assert caplog.records[1].levelno == logging.WARNING


@pytest.mark.parametrize(("batch", "percent"), [(-1, "60.0"), (0, "60.0"), (16, "60.0"), (0.7, "70.0")])
def test_check_train_batch_size_reads_fractional_batch_and_falls_back_on_cpu(caplog, batch, percent):
    with caplog.at_level(logging.INFO, logger="torchkit.seed_api.autobatch"):
        assert check_train_batch_size(torch.nn.Conv2d(3, 4, 3), imgsz=64, batch=batch) == 16
    assert f"at {percent}% GPU memory utilization." in caplog.records[0].getMessage()


def test_autobatch_rejects_an_unknown_fit_and_a_model_without_tensors():
    with pytest.raises(ValueError, match="unknown fit 'cubic'"):
        autobatch(torch.nn.Conv2d(3, 4, 3), fit="cubic")
    with pytest.raises(WorkloadError, match="no parameters or buffers"):
        autobatch(torch.nn.ReLU())


# ----------------------------------------------------------------------------------------------------------
# on a real GPU (skipped without one): bench/gpu_check.sh runs these on a lent machine
# ----------------------------------------------------------------------------------------------------------

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def small_convnet() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.SiLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.SiLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10),
    )  # fmt: skip


@pytest.mark.gpu
@requires_cuda
def test_autobatch_on_a_gpu_picks_a_batch_whose_step_runs(caplog):
    model = small_convnet().cuda()
    with caplog.at_level(logging.INFO, logger="torchkit.seed_api.autobatch"):
        batch = check_train_batch_size(model, imgsz=128, amp=True)
    assert 1 <= batch <= 1024
    assert f"AutoBatch: Using batch-size {batch} for CUDA:" in caplog.text
    probe_step(model, build_optimizer(model, "sgd"), torch.rand(batch, 3, 128, 128, device="cuda"))


@pytest.mark.gpu
@requires_cuda
def test_autobatch_with_cudnn_benchmark_falls_back_with_the_seeds_warning(caplog, monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    with caplog.at_level(logging.WARNING, logger="torchkit.seed_api.autobatch"):
        assert autobatch(small_convnet().cuda(), batch_size=12) == 12
    assert (
        "AutoBatch: Requires torch.backends.cudnn.benchmark=False, using default batch-size 12" in caplog.text
    )


# ---------------------------------------------------------------------------------------- estimate_batch


@pytest.fixture(scope="module")
def convnet_workload():
    from torchkit.workloads import get_workload

    return get_workload("tests.planner.tiny_models:convnet", input_shape=(3, 32, 32))


def test_estimate_batch_agrees_with_the_planner_cap_for_the_same_budget(convnet_workload):
    from planner.job import JobSpec
    from planner.obtain.make import make_profile
    from torchkit.hardware.catalog import load_catalog
    from torchkit.seed_api.autobatch import estimate_batch

    t4 = load_catalog().get("T4")
    batch = estimate_batch(convnet_workload, "Tesla T4", 0.6, max_batch=10**6)
    profile = make_profile(
        JobSpec(model="tests.planner.tiny_models:convnet", input_shape=(3, 32, 32)), t4, method="estimate"
    )
    assert batch == profile.max_batch(int(0.6 * t4.memory_bytes))
    assert 100 < batch < 10**6
    assert profile.memory_bytes(batch) <= 0.6 * t4.memory_bytes < profile.memory_bytes(batch + 1)


def test_estimate_batch_keeps_the_seed_clamp_and_the_dataset_clamp(convnet_workload):
    from torchkit.seed_api.autobatch import estimate_batch

    assert estimate_batch(convnet_workload, "A100-SXM4-80GB") == 1024
    assert estimate_batch(convnet_workload, "T4", dataset_size=37) == 37


def test_estimate_batch_names_an_unknown_gpu_and_the_fix(convnet_workload):
    from torchkit.errors import ConfigError
    from torchkit.seed_api.autobatch import estimate_batch

    with pytest.raises(ConfigError, match="A100-80.*not in the catalog"):
        estimate_batch(convnet_workload, "A100-80")
