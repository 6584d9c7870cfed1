"""The seed's ``GPUInfo`` (Ultralytics ``ultralytics.utils.autodevice.GPUInfo``): NVML-backed GPU stats,
a status table and the idle-GPU choice, on top of ``torchkit.hardware.nvml`` (reading) and
``torchkit.hardware.gpu_select`` (choosing). What differs from the seed is listed in ``torchkit.hardware.nvml``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from torchkit.hardware.gpu_select import check_fraction, rank_idle_gpus
from torchkit.hardware.nvml import (
    GpuStats,
    NvmlUnavailableError,
    import_pynvml,
    init_nvml,
    read_gpus,
    shutdown_nvml,
)

LOGGER = logging.getLogger(__name__)


def _seed_dict(stats: GpuStats) -> dict[str, Any]:
    """The seed's ``gpu_stats`` entry (MiB, %, W as ints; -1 for unknown), plus uuid, PCI bus id, processes."""

    def known(value: float | None) -> int:
        return -1 if value is None else int(value)

    return {
        "index": stats.index,
        "name": stats.name,
        "utilization": -1 if stats.utilization_fraction is None else round(stats.utilization_fraction * 100),
        "memory_used": stats.memory_used_bytes >> 20,
        "memory_total": stats.memory_total_bytes >> 20,
        "memory_free": stats.memory_free_bytes >> 20,
        "temperature": known(stats.temperature_c),
        "power_draw": known(stats.power_w),
        "power_limit": known(stats.power_limit_w),
        "uuid": stats.uuid,
        "pci_bus_id": stats.pci_bus_id,
        "processes": [p.to_dict() for p in stats.processes],
    }


class GPUInfo:
    """NVML-backed GPU stats and idle-GPU choice (the seed's ``ultralytics.utils.autodevice.GPUInfo``).

    Never raises on a machine without NVML: it logs one warning and reports no GPUs. ``gpu_stats`` holds the
    seed's dicts; ``stats`` holds the same GPUs as ``GpuStats``. See the module docstring for what differs
    from the seed.
    """

    def __init__(self) -> None:
        self.pynvml: Any = None
        self.nvml_available = False
        self.unavailable_reason: str | None = None
        self.stats: list[GpuStats] = []
        self.gpu_stats: list[dict[str, Any]] = []
        try:
            pynvml = import_pynvml()
            init_nvml(pynvml)
        except NvmlUnavailableError as exc:
            self.unavailable_reason = str(exc)
            LOGGER.warning("Failed to initialize pynvml, GPU stats disabled: %s", exc)
            return
        self.pynvml = pynvml
        self.nvml_available = True
        self.refresh_stats()

    def __del__(self) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        """Release NVML (once; errors ignored)."""
        if getattr(self, "nvml_available", False):
            shutdown_nvml(self.pynvml)
            self.nvml_available = False

    def refresh_stats(self) -> None:
        """Re-read every GPU; unreadable GPUs are left out with a warning each."""
        self.stats, self.gpu_stats = [], []
        if not self.nvml_available:
            return
        try:
            gpus, warnings = read_gpus(self.pynvml)
        except NvmlUnavailableError as exc:
            LOGGER.warning("Error during device query: %s", exc)
            return
        for warning in warnings:
            LOGGER.warning(warning)
        self.stats = gpus
        self.gpu_stats = [_seed_dict(s) for s in gpus]

    def print_status(self) -> None:
        """Log a table of every GPU (index, name, utilisation, memory MiB, temperature, power)."""
        self.refresh_stats()
        if not self.gpu_stats:
            LOGGER.warning("No GPU stats available.")
            return
        name_width = max(len("Name"), *(len(s["name"]) for s in self.gpu_stats))
        lines = [
            f"{'Idx':<3} {'Name':<{name_width}} {'Util':>6} {'Mem (MiB)':>15} {'Temp':>5} {'Pwr (W)':>10}"
        ]
        for s in self.gpu_stats:
            util = f"{s['utilization']:>5}%" if s["utilization"] >= 0 else " N/A "
            memory = (
                f"{s['memory_used']:>6}/{s['memory_total']:<6}" if s["memory_total"] > 0 else " N/A / N/A "
            )
            temp = f"{s['temperature']}C" if s["temperature"] >= 0 else " N/A "
            power = f"{s['power_draw']:>3}/{s['power_limit']:<3}" if s["power_draw"] >= 0 else " N/A "
            lines.append(
                f"{s['index']:<3d} {s['name']:<{name_width}} {util:>6} {memory:>15} {temp:>5} {power:>10}"
            )
        LOGGER.info("\n".join(["", *lines]))

    def select_idle_gpu(
        self,
        count: int = 1,
        min_memory_fraction: float = 0,
        min_util_fraction: float = 0,
        indices: Iterable[int] | None = None,
    ) -> list[int]:
        """Up to ``count`` NVML indices of the most idle GPUs (see ``rank_idle_gpus``), restricted to
        ``indices`` when given; logs what it searched for and what it found, warns on a shortfall.

        Raises:
            ConfigError: a fraction outside [0, 1].
        """
        check_fraction("min_memory_fraction", min_memory_fraction)
        check_fraction("min_util_fraction", min_util_fraction)
        LOGGER.info(
            "Searching for %d idle GPUs with free memory >= %.1f%% and free utilization >= %.1f%%...",
            count,
            min_memory_fraction * 100,
            min_util_fraction * 100,
        )
        if count <= 0:
            return []
        self.refresh_stats()
        if not self.stats:
            LOGGER.warning("NVML stats unavailable.")
            return []
        selected = rank_idle_gpus(
            self.stats,
            count,
            min_memory_fraction=min_memory_fraction,
            min_util_fraction=min_util_fraction,
            indices=indices,
        )
        if len(selected) < count:
            LOGGER.warning("Requested %d GPUs but only %d met the idle criteria.", count, len(selected))
        if selected:
            LOGGER.info("Selected idle CUDA devices %s", selected)
        else:
            LOGGER.warning(
                "No GPUs met criteria (free memory >= %.1f%%, free utilization >= %.1f%%).",
                min_memory_fraction * 100,
                min_util_fraction * 100,
            )
        return selected
