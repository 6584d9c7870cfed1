"""Fixtures for torchkit tests: the fake NVIDIA driver (a fake ``pynvml`` module at the import boundary),
torch's view of CUDA devices (``torch.cuda.device_count``/``get_device_properties``), and a clean CUDA
environment. None of them is autouse: a test asks for what it needs."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest
from fake_pynvml import (
    FakeGpu,
    FakeNvml,
    NVMLError_LibraryNotFound,
    cuda_properties,
    mixed_load_gpus,
    pci_order_gpus,
)


@pytest.fixture
def cuda_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER from the outside; tests set them through the returned
    monkeypatch, which restores them afterwards."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    return monkeypatch


@pytest.fixture
def install_nvml(monkeypatch: pytest.MonkeyPatch) -> Callable[[FakeNvml], FakeNvml]:
    """Install a ``FakeNvml`` as ``sys.modules['pynvml']`` for this test; returns it for inspection."""

    def install(fake: FakeNvml) -> FakeNvml:
        monkeypatch.setitem(sys.modules, "pynvml", fake.module())
        return fake

    return install


@pytest.fixture
def fake_nvml(install_nvml: Callable[[FakeNvml], FakeNvml]) -> FakeNvml:
    """Four GPUs of mixed load (see ``fake_pynvml.mixed_load_gpus``)."""
    return install_nvml(FakeNvml(mixed_load_gpus()))


@pytest.fixture
def fake_nvml_unreadable(install_nvml: Callable[[FakeNvml], FakeNvml]) -> FakeNvml:
    """The four mixed GPUs, but GPU 2 is lost: every NVML call on it raises."""
    gpus = mixed_load_gpus()
    gpus[2].lost = True
    return install_nvml(FakeNvml(gpus))


@pytest.fixture
def fake_nvml_pci_order(install_nvml: Callable[[FakeNvml], FakeNvml]) -> FakeNvml:
    """Three GPUs whose CUDA order differs from their PCI order (see ``fake_pynvml.pci_order_gpus``)."""
    return install_nvml(FakeNvml(pci_order_gpus()))


@pytest.fixture
def nvml_library_missing(install_nvml: Callable[[FakeNvml], FakeNvml]) -> FakeNvml:
    """pynvml is installed but there is no driver: ``nvmlInit`` raises NVMLError_LibraryNotFound."""
    return install_nvml(FakeNvml([], init_error=NVMLError_LibraryNotFound))


@pytest.fixture
def pynvml_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import pynvml`` fails (nvidia-ml-py not installed)."""
    monkeypatch.setitem(sys.modules, "pynvml", None)


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Make torch see the given GPUs, in the given order, as CUDA devices 0..n-1.

    ``fake_cuda(gpus, with_ids=True, available=True)``: ``torch.cuda.device_count`` returns ``len(gpus)``,
    ``get_device_properties(i)`` describes ``gpus[i]``, ``is_available`` returns ``available``;
    ``set_device`` calls are recorded in ``torch.cuda.set_device_calls`` and ``current_device`` follows them.
    """
    import torch

    from torchkit.seed_api.device import get_gpu_info

    def install(gpus: list[FakeGpu], *, with_ids: bool = True, available: bool = True) -> None:
        props = [cuda_properties(g, with_ids=with_ids) for g in gpus]
        state = {"current": 0, "calls": []}

        def set_device(index: int) -> None:
            state["current"] = int(index)
            state["calls"].append(int(index))

        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(props))
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[int(i)])
        monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
        monkeypatch.setattr(torch.cuda, "set_device", set_device)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: state["current"])
        monkeypatch.setattr(torch.cuda, "set_device_calls", state["calls"], raising=False)

    get_gpu_info.cache_clear()
    yield install
    get_gpu_info.cache_clear()
