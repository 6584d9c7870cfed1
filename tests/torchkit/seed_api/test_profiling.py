"""torchkit.seed_api.profiling: synchronised timing, reserved-memory context, profile_ops rows and failure handling.

Runs on CPU; the accelerator paths are checked against a stand-in for ``torch.cuda``'s functions.
"""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import torchkit.seed_api.profiling as profiling
from torchkit.seed_api.profiling import cuda_memory_usage, profile_ops, time_sync
from torchkit.units import GIB

CPU = torch.device("cpu")


@pytest.fixture
def fake_cuda(monkeypatch):
    """Make ``torch.cuda`` look available and record the calls profiling makes to it."""
    calls: list[tuple] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append(("synchronize",)))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(("empty_cache",)))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: calls.append(("reset", d)))
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d=None: 3 * GIB)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: 2 * GIB)
    return calls


def test_time_sync_returns_increasing_perf_counter_without_sync_on_cpu(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: synced.append(a))
    t0 = time_sync(CPU)
    t1 = time_sync("cpu")
    t2 = time_sync()  # CUDA, which this machine does not have (or, on a GPU machine, syncs for real)
    assert t0 <= t1 <= t2
    assert synced == ([] if not torch.cuda.is_available() else [()])


def test_time_sync_synchronises_an_available_accelerator(fake_cuda):
    time_sync()
    time_sync("cuda:0")
    time_sync("mps")
    assert fake_cuda == [("synchronize",), ("synchronize",)]


def test_cuda_memory_usage_on_cpu_stays_zero():
    with cuda_memory_usage(CPU) as info:
        torch.ones(1000)
    assert info == {"memory": 0}


def test_cuda_memory_usage_reports_peak_reserved_even_when_the_block_raises(fake_cuda):
    with pytest.raises(ValueError), cuda_memory_usage("cuda:0") as info:
        assert info == {"memory": 0}
        raise ValueError("boom")
    assert info["memory"] == 3 * GIB  # the peak, not the 2 GiB reserved at exit
    assert fake_cuda == [("empty_cache",), ("reset", torch.device("cuda:0"))]


@pytest.mark.slow
def test_profile_ops_rows_on_cpu():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
    inputs = [torch.randn(2, 3, 16, 16), torch.randn(1, 3, 8, 8)]
    ops = [conv, lambda x: x * torch.sigmoid(x), nn.SiLU()]
    rows = profile_ops(inputs, ops, n=2, device=CPU)
    assert len(rows) == 6
    for row in rows:
        assert len(row) == 7
        params, gflops, mem, t_fwd, t_bwd, s_in, s_out = row
        assert mem == 0
        assert t_fwd >= 0 and t_bwd >= 0 and math.isfinite(t_bwd)
    assert [(row[5], row[6]) for row in rows] == [
        ((2, 3, 16, 16), (2, 8, 16, 16)),
        ((2, 3, 16, 16), (2, 3, 16, 16)),
        ((2, 3, 16, 16), (2, 3, 16, 16)),
        ((1, 3, 8, 8), (1, 8, 8, 8)),
        ((1, 3, 8, 8), (1, 3, 8, 8)),
        ((1, 3, 8, 8), (1, 3, 8, 8)),
    ]
    assert rows[0][:2] == [8 * 3 * 9, pytest.approx(2 * 8 * 27 * 2 * 16 * 16 / 1e9)]
    assert rows[3][:2] == [216, pytest.approx(2 * 8 * 27 * 8 * 8 / 1e9)]
    assert rows[1][:2] == [0, 0.0] and rows[2][:2] == [0, 0.0]  # element-wise: no params, no matmul FLOPs


@pytest.mark.slow
def test_profile_ops_single_tensor_and_op_and_device_string(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # select_device may set it; restored afterwards
    rows = profile_ops(torch.randn(4, 5), nn.Linear(5, 3), n=1, device="cpu")
    assert len(rows) == 1
    assert rows[0][0] == 18 and rows[0][1] == pytest.approx(2 * 4 * 5 * 3 / 1e9)
    assert rows[0][5:] == [(4, 5), (4, 3)]


@pytest.mark.slow
def test_profile_ops_tuple_output_and_integer_input():
    emb = nn.Embedding(10, 4)
    rows = profile_ops(torch.tensor([[1, 2, 3]]), [emb, lambda x: (emb(x), emb(x) * 2)], n=1, device=CPU)
    assert rows[0][0] == 40 and rows[0][6] == (1, 3, 4)
    assert rows[1][6] == "list" and math.isfinite(rows[1][4])


@pytest.mark.slow
def test_profile_ops_non_oom_failure_is_none_with_warning(caplog):
    def broken(x):
        raise ValueError("shape mismatch in broken op")

    with caplog.at_level(logging.INFO, logger="torchkit.seed_api.profiling"):
        rows = profile_ops(torch.randn(2, 3), [broken, nn.Identity()], n=1, device=CPU)
    assert rows[0] is None and rows[1] is not None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "ValueError: shape mismatch in broken op" in warnings[0].getMessage()


def test_profile_ops_out_of_memory_is_none_logged_at_info(caplog):
    def oom(x):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")

    with caplog.at_level(logging.INFO, logger="torchkit.seed_api.profiling"):
        rows = profile_ops(torch.randn(2, 3), oom, n=3, device=CPU)
    assert rows == [None]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "out of memory for input (2, 3): CUDA out of memory. Tried to allocate 80.00 GiB" in caplog.text


class _OomInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")


def test_profile_ops_out_of_memory_in_backward_is_an_oom_not_a_missing_backward(caplog):
    with caplog.at_level(logging.INFO, logger="torchkit.seed_api.profiling"):
        rows = profile_ops(torch.randn(3), _OomInBackward.apply, n=2, device=CPU)
    assert rows == [None]
    assert "out of memory for input (3,)" in caplog.text
    assert "backward time is NaN" not in caplog.text


def test_profile_ops_failed_backward_gives_nan_and_one_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="torchkit.seed_api.profiling"):
        rows = profile_ops(torch.randn(3), lambda x: (x > 0).float(), n=4, device=CPU)
    assert math.isnan(rows[0][4]) and math.isfinite(rows[0][3])
    assert len(caplog.records) == 1 and "backward of function failed" in caplog.text


def test_profile_ops_half_input_makes_module_half():
    linear = nn.Linear(4, 2)
    rows = profile_ops(torch.randn(3, 4).half(), linear, n=1, device=CPU)
    assert rows[0] is not None and linear.weight.dtype == torch.float16


def test_profile_ops_adds_loss_envelope_only_on_accelerators():
    head = nn.Sequential(nn.Conv2d(3, 4, 1))
    head.stride = torch.tensor([8.0, 16.0, 32.0])
    head.names = {i: str(i) for i in range(80)}
    rows = profile_ops(torch.randn(1, 3, 64, 64), head, n=1, device=CPU, max_num_obj=4)
    assert rows[0][2] == 0  # CPU: no envelope


def test_loss_envelope_matches_reference_figures():
    head = SimpleNamespace(stride=torch.tensor([8.0, 16.0, 32.0]), names=list(range(80)))
    x = torch.empty(16, 3, 640, 640, device="meta")
    # A = 80² + 40² + 20² = 8400 anchors; 8400·6·(4 + 160)·4 B = 31.5 MiB per image
    per_image_mib = profiling._loss_envelope_gib(head, x[:1], 4) * 1024
    assert per_image_mib == pytest.approx(8400 * 6 * 164 * 4 / 2**20) == pytest.approx(31.53, abs=0.01)
    # max_num_obj=360: 100 MiB per image, 1.56 GiB at batch 16
    assert profiling._loss_envelope_gib(head, x, 360) == pytest.approx(1.56, abs=0.01)


def test_loss_envelope_without_stride_warns_and_adds_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="torchkit.seed_api.profiling"):
        assert profiling._loss_envelope_gib(nn.Identity(), torch.empty(1, 3, 8, 8), 4) == 0.0
    assert "no 'stride'/'names'" in caplog.text
