"""torchkit.seed_api.gpu_info: the seed's GPUInfo over (fake) NVML."""

from __future__ import annotations

import logging

import pytest

from torchkit.errors import ConfigError
from torchkit.seed_api.gpu_info import GPUInfo


def test_gpuinfo_without_driver_warns_once_and_reports_nothing(nvml_library_missing, caplog):
    with caplog.at_level(logging.WARNING, logger="torchkit.seed_api.gpu_info"):
        info = GPUInfo()
        assert info.nvml_available is False
        assert info.gpu_stats == []
        messages = [r.getMessage() for r in caplog.records]
        assert len(messages) == 1
        assert messages[0].startswith("Failed to initialize pynvml, GPU stats disabled: NVML could not start")
        caplog.clear()
        assert info.select_idle_gpu(1) == []
    assert [r.getMessage() for r in caplog.records] == ["NVML stats unavailable."]


def test_gpuinfo_gpu_stats_keep_the_seed_fields(fake_nvml):
    info = GPUInfo()
    first, unknown = info.gpu_stats[0], info.gpu_stats[3]
    assert {k: first[k] for k in ("index", "utilization", "memory_used", "memory_total", "memory_free")} == {
        "index": 0,
        "utilization": 85,
        "memory_used": 12 * 1024,
        "memory_total": 16 * 1024,
        "memory_free": 3584,
    }
    assert (first["temperature"], first["power_draw"], first["power_limit"]) == (71, 250, 300)
    assert (unknown["utilization"], unknown["temperature"], unknown["power_draw"]) == (-1, -1, -1)
    info.shutdown()
    info.shutdown()
    assert fake_nvml.shutdown_calls == 1


def test_gpuinfo_keeps_the_readable_gpus_when_one_fails(fake_nvml_unreadable):
    assert [s["index"] for s in GPUInfo().gpu_stats] == [0, 1, 3]


def test_print_status_logs_a_table_with_na_for_unknowns(fake_nvml, caplog):
    with caplog.at_level(logging.INFO, logger="torchkit.seed_api.gpu_info"):
        GPUInfo().print_status()
    lines = caplog.records[-1].getMessage().splitlines()
    assert lines[1].split() == ["Idx", "Name", "Util", "Mem", "(MiB)", "Temp", "Pwr", "(W)"]
    assert lines[2].split() == ["0", "Tesla", "V100-SXM2-16GB", "85%", "12288/16384", "71C", "250/300"]
    assert lines[5].split()[:4] == ["3", "Tesla", "V100-SXM2-16GB", "N/A"]


def test_select_idle_gpu_orders_by_utilisation_then_free_memory(fake_nvml):
    info = GPUInfo()
    assert info.select_idle_gpu(1) == [1]
    assert info.select_idle_gpu(2) == [1, 2]
    # unknown utilisation (GPU 3) ranks last although it has the most free memory
    assert info.select_idle_gpu(4) == [1, 2, 0, 3]


def test_select_idle_gpu_applies_thresholds_and_indices(fake_nvml, caplog):
    info = GPUInfo()
    with caplog.at_level(logging.INFO, logger="torchkit.seed_api.gpu_info"):
        # 20% free utilisation drops GPU 0 (85% busy) and GPU 3 (unknown)
        assert info.select_idle_gpu(4, min_util_fraction=0.2) == [1, 2]
    messages = [r.getMessage() for r in caplog.records]
    assert "Searching for 4 idle GPUs with free memory >= 0.0% and free utilization >= 20.0%..." in messages
    assert "Requested 4 GPUs but only 2 met the idle criteria." in messages
    assert "Selected idle CUDA devices [1, 2]" in messages
    assert info.select_idle_gpu(2, min_memory_fraction=0.5) == [1, 2]  # GPU 0 has 22% free
    assert info.select_idle_gpu(2, indices=[0, 3]) == [0, 3]
    assert info.select_idle_gpu(0) == []


def test_select_idle_gpu_rejects_fractions_outside_0_1(fake_nvml):
    with pytest.raises(ConfigError, match="min_memory_fraction must be a fraction in \\[0, 1\\], got 1.5"):
        GPUInfo().select_idle_gpu(1, min_memory_fraction=1.5)
    with pytest.raises(ConfigError, match="min_util_fraction"):
        GPUInfo().select_idle_gpu(1, min_util_fraction=-0.1)
