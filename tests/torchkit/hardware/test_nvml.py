"""torchkit.hardware.nvml: reading GPUs through (fake) NVML."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
from fake_pynvml import GIB, MISSING_PID, FakeNvml, mixed_load_gpus

from torchkit.hardware.nvml import (
    GpuProcess,
    NvmlUnavailableError,
    read_local_gpu_stats,
    read_local_inventory,
)

# ------------------------------------------------------------------------------------------------ import cost


def test_importing_torchkit_loads_neither_torch_nor_nvml():
    code = (
        "import sys, torchkit, torchkit.hardware.nvml, torchkit.hardware.gpu_select, torchkit.seed_api.device, planner, planner.cli.devices\n"
        "print(sorted(m for m in ('torch', 'pynvml', 'ray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ------------------------------------------------------------------------------------------------ reading


def test_read_local_gpu_stats_reads_every_field(fake_nvml):
    stats = read_local_gpu_stats()
    assert [s.index for s in stats] == [0, 1, 2, 3]
    busy = stats[0]
    assert busy.name == "Tesla V100-SXM2-16GB"
    assert busy.uuid == "GPU-00000000-0000-0000-0000-000000000000"
    assert busy.pci_bus_id == "00000000:1A:00.0"  # decoded from NVML's bytes
    # v2 memory info: "used" excludes the 0.5 GiB the driver reserves
    assert busy.memory_total_bytes == 16 * GIB
    assert busy.memory_used_bytes == 12 * GIB
    assert busy.memory_free_bytes == 16 * GIB - 12 * GIB - GIB // 2
    assert busy.utilization_fraction == pytest.approx(0.85)
    assert busy.temperature_c == 71
    assert busy.power_w == pytest.approx(250.0)
    assert busy.power_limit_w == pytest.approx(300.0)


def test_processes_are_named_through_psutil_where_visible(fake_nvml):
    import psutil

    stats = read_local_gpu_stats()
    assert stats[0].processes == (
        GpuProcess(pid=os.getpid(), name=psutil.Process().name(), used_memory_bytes=12 * GIB),
    )
    assert stats[1].processes == ()
    # a pid psutil cannot see (another container) keeps its pid; NVML gave no memory figure
    assert stats[2].processes == (GpuProcess(pid=MISSING_PID, name=None, used_memory_bytes=None),)


def test_unsupported_readings_are_unknown_not_negative(fake_nvml):
    gpu = read_local_gpu_stats()[3]
    assert gpu.utilization_fraction is None
    assert gpu.temperature_c is None
    assert gpu.power_w is None
    assert gpu.power_limit_w is None


def test_memory_falls_back_to_v1_on_drivers_without_v2(install_nvml):
    install_nvml(FakeNvml(mixed_load_gpus(), memory_v2=False))
    busy = read_local_gpu_stats()[0]
    assert busy.memory_used_bytes == 12 * GIB + GIB // 2  # v1 counts the reserved memory as used
    assert busy.memory_free_bytes == 16 * GIB - 12 * GIB - GIB // 2


def test_inventory_reports_driver_versions_and_releases_nvml(fake_nvml):
    inventory = read_local_inventory()
    assert inventory.driver_version == "550.54.15"
    assert inventory.nvml_version == "12.550.54.15"
    assert inventory.cuda_driver_version == "12.4"  # NVML's 12040
    assert len(inventory.gpus) == 4
    assert inventory.warnings == ()
    assert fake_nvml.init_calls == 1
    assert fake_nvml.shutdown_calls == 1


def test_an_unreadable_gpu_is_left_out_with_a_warning(fake_nvml_unreadable, caplog):
    with caplog.at_level(logging.WARNING, logger="torchkit.hardware.nvml"):
        stats = read_local_gpu_stats()
    assert [s.index for s in stats] == [0, 1, 3]
    assert [r.getMessage() for r in caplog.records] == [
        "GPU 2 left out: NVML could not read its stats (NVMLError_GpuIsLost: GPU is lost)"
    ]
    assert read_local_inventory().warnings == (
        "GPU 2 left out: NVML could not read its stats (NVMLError_GpuIsLost: GPU is lost)",
    )


def test_no_driver_raises_a_clear_error(nvml_library_missing):
    with pytest.raises(NvmlUnavailableError, match="NVML Shared Library Not Found.*no NVIDIA driver") as info:
        read_local_inventory()
    assert isinstance(info.value, RuntimeError)


def test_missing_pynvml_says_what_to_install(pynvml_missing):
    with pytest.raises(NvmlUnavailableError, match="pip install nvidia-ml-py"):
        read_local_gpu_stats()
