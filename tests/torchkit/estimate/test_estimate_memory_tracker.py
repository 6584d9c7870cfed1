"""The dispatch-mode memory tracker (torchkit/estimate/memory_tracker.py)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from torchkit.estimate.memory_tracker import MemoryCategory, MemoryTracker, Phase


def _run(tracker: MemoryTracker) -> None:
    with tracker:
        a = torch.ones(1000)  # 4000 B
        b = a * 2  # 8000 live
        view = b.view(10, 100)  # a view: no new storage
        del a  # 4000 live
        c = view + 1  # 8000 live
        del b, view, c  # 0 live


@pytest.mark.parametrize("fake", [False, True], ids=["real", "fake"])
def test_peak_is_the_largest_sum_of_live_storages(fake: bool) -> None:
    tracker = MemoryTracker()
    if fake:
        with FakeTensorMode():
            _run(tracker)
    else:
        _run(tracker)
    result = tracker.result()
    assert result.peak.peak_bytes == 8000
    assert result.num_allocations == 3
    assert result.rounded_peak_bytes == 2 * 4096  # 4000 B rounds up to 8 blocks of 512 B


def test_categories_come_from_registration_phase_and_marks() -> None:
    params = [torch.nn.Parameter(torch.zeros(256))]  # 1024 B
    tracker = MemoryTracker()
    tracker.register(params, MemoryCategory.PARAMETERS)
    with tracker:
        tracker.set_phase(Phase.FORWARD)
        saved = params[0] * 3  # activation, 1024 B
        tracker.set_phase(Phase.BACKWARD)
        grad = torch.ones(256)  # becomes a gradient, 1024 B
        scratch = torch.ones(128)  # temporary, 512 B
        tracker.mark([grad], MemoryCategory.GRADIENTS)
        del saved, grad, scratch
    peak = tracker.result().peak
    assert peak.peak_bytes == 1024 * 3 + 512
    assert peak.breakdown_bytes == {
        "parameters": 1024,
        "activations": 1024,
        "gradients": 1024,
        "temporaries": 512,
    }
    assert peak.phase == "backward"


def test_workspace_model_adds_transient_bytes_at_its_op_only() -> None:
    def workspace(func, args, kwargs, out) -> int:
        return 10_000 if func._overloadpacket.__name__ == "mul" else 0

    tracker = MemoryTracker({"test": workspace})
    with FakeTensorMode(), tracker:
        a = torch.ones(1000)  # 4000
        b = a * 2  # 8000 live + 10000 transient
        c = b + 1  # 12000 live
        del a, b, c
    result = tracker.result()
    assert result.peak.peak_bytes == 12000
    assert result.workspace_peaks["test"].peak_bytes == 18000
    assert result.workspace_peaks["test"].breakdown_bytes["workspace"] == 10_000
    assert result.workspace_peaks["test"].op == "mul.Tensor"
    assert result.max_workspace_bytes == {"test": 10_000}


def test_peak_window_starts_at_the_requested_iteration() -> None:
    tracker = MemoryTracker()
    with FakeTensorMode(), tracker:
        tracker.set_iteration(0)
        big = torch.ones(10_000)  # 40000 B, freed before iteration 1
        del big
        tracker.set_iteration(1)
        small = torch.ones(100)
        del small
    assert tracker.result(from_iteration=0).peak.peak_bytes == 40_000
    assert tracker.result(from_iteration=1).peak.peak_bytes == 400
    assert tracker.result(from_iteration=1).peak.iteration == 1


def test_phase_peaks_are_reported_per_phase() -> None:
    tracker = MemoryTracker()
    with FakeTensorMode(), tracker:
        tracker.set_phase(Phase.FORWARD)
        a = torch.ones(1000)
        tracker.set_phase(Phase.OPTIMIZER)
        del a
        b = torch.ones(10)
        del b
    phases = tracker.result().phase_peak_bytes
    assert phases == {"forward": 4000, "optimizer": 40}
