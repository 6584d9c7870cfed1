"""GPU inventory through NVML: typed ``GpuStats``.

The NVML edge: ``read_local_inventory``/``read_local_gpu_stats`` (typed ``GpuStats``); the seed's
``GPUInfo`` class built on it is ``torchkit.seed_api.gpu_info``. The pure choice of GPUs from their stats (``select_gpus``, ``rank_idle_gpus``) is
in ``torchkit.hardware.gpu_select``.

``pynvml`` (package ``nvidia-ml-py``) is imported inside the functions that talk to NVML, so importing this
module neither loads nor initialises NVML, and ``planner`` can use ``GpuStats`` and the pure layer without
torch or a driver.

Differences from the seed's NVML reading (deliberate, also seen through ``GPUInfo``):

* a GPU whose stats cannot be read is left out with a warning; the seed emptied the whole list;
* an unknown utilisation never ranks a GPU as most idle (the seed's ``-1`` sorted first) and fails any
  active utilisation threshold (an unknown value cannot be shown to meet it);
* memory comes from NVML's v2 memory info where the driver has it (``used`` then excludes the memory the
  driver reserves for itself), falling back to v1 on older drivers;
* the processes on each GPU (pid, memory, name via psutil) are reported where NVML gives them;
* negative threshold fractions are rejected, not silently accepted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

LOGGER = logging.getLogger(__name__)


class NvmlUnavailableError(RuntimeError):
    """NVML cannot be used on this machine (no pynvml, no NVIDIA driver, driver not loaded); the message says
    why and what to do."""


# ------------------------------------------------------------------------------------------------ data


@dataclass(frozen=True, kw_only=True)
class GpuProcess:
    """A process holding memory on a GPU."""

    pid: int
    """process id as NVML reports it (the host's pid namespace)"""
    name: str | None = None
    """process name via psutil; None where the pid is not visible here (another container, gone)"""
    used_memory_bytes: int | None = None
    """GPU memory the process holds; None where NVML cannot tell (e.g. some containers, Windows WDDM)"""

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "name": self.name, "used_memory_bytes": self.used_memory_bytes}


@dataclass(frozen=True, kw_only=True)
class GpuStats:
    """One GPU's identity and current load. Built from NVML on real nodes, from the config on simulated ones."""

    index: int
    """NVML index (PCI bus order; not necessarily torch's index, see ``torchkit.seed_api.device.parse_device``)"""
    name: str
    """product name as NVML reports it, e.g. ``NVIDIA A100-SXM4-80GB``"""
    uuid: str = ""
    """``GPU-xxxxxxxx-...``; empty when unknown"""
    pci_bus_id: str = ""
    """``domain:bus:device.function``, e.g. ``00000000:3B:00.0``; empty when unknown"""
    memory_total_bytes: int
    """total device memory"""
    memory_used_bytes: int
    """memory in use by processes"""
    memory_free_bytes: int
    """memory free for a new allocation"""
    utilization_fraction: float | None = None
    """share of the last sample period a kernel was running, 0..1; None when unknown"""
    temperature_c: int | None = None
    """GPU core temperature, °C; None when unknown"""
    power_w: float | None = None
    """power draw, W; None when unknown"""
    power_limit_w: float | None = None
    """enforced power limit, W; None when unknown"""
    processes: tuple[GpuProcess, ...] = ()
    """processes holding memory on this GPU (compute and graphics)"""

    def __post_init__(self) -> None:
        if min(self.memory_total_bytes, self.memory_used_bytes, self.memory_free_bytes) < 0:
            raise ValueError(f"GPU {self.index}: memory figures must be >= 0 bytes")
        if self.utilization_fraction is not None and not 0.0 <= self.utilization_fraction <= 1.0:
            raise ValueError(
                f"GPU {self.index}: utilization_fraction {self.utilization_fraction} is not in [0, 1]"
            )

    @property
    def memory_free_fraction(self) -> float:
        """free / total; 0 when the total is unknown (0)."""
        return self.memory_free_bytes / self.memory_total_bytes if self.memory_total_bytes > 0 else 0.0


@dataclass(frozen=True, kw_only=True)
class NvmlInventory:
    """What NVML says about this machine: driver versions and every readable GPU."""

    driver_version: str | None = None
    """NVIDIA driver version, e.g. ``550.54.15``"""
    nvml_version: str | None = None
    """NVML library version"""
    cuda_driver_version: str | None = None
    """highest CUDA version the driver supports, e.g. ``12.4``"""
    gpus: tuple[GpuStats, ...] = ()
    """readable GPUs in NVML index order"""
    warnings: tuple[str, ...] = ()
    """GPUs left out (unreadable) and other problems, one sentence each"""


# ------------------------------------------------------------------------------------------------ NVML edge


def import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailableError(
            f"the pynvml module is not importable ({exc}); install it with 'pip install nvidia-ml-py'"
        ) from exc
    return pynvml


def init_nvml(pynvml: Any) -> None:
    """``nvmlInit`` with a message that says why it failed."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        name = type(exc).__name__
        if name == "NVMLError_LibraryNotFound":
            why = "libnvidia-ml.so is missing, so no NVIDIA driver is installed here; a container needs the NVIDIA container toolkit"
        elif name == "NVMLError_DriverNotLoaded":
            why = "the NVIDIA kernel driver is not loaded; check 'nvidia-smi'"
        elif name == "NVMLError_NoPermission":
            why = "no permission to open the NVIDIA device files /dev/nvidia*"
        else:
            why = "the NVIDIA driver did not answer; check 'nvidia-smi'"
        raise NvmlUnavailableError(f"NVML could not start ({exc}): {why}") from exc


def shutdown_nvml(pynvml: Any) -> None:
    try:
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as exc:  # nothing to do about it; the stats were read
        LOGGER.debug("nvmlShutdown failed: %s", exc)


def _text(value: Any) -> str:
    """NVML strings come back as bytes from older nvidia-ml-py versions and some struct fields."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _optional(pynvml: Any, read: Callable[[], Any]) -> Any:
    """A value NVML may not support on this GPU (temperature on vGPU, power on some boards): None then."""
    try:
        return read()
    except pynvml.NVMLError:
        return None


def _memory_info(pynvml: Any, handle: Any) -> Any:
    """v2 memory info (``used`` excludes driver-reserved memory) where the driver has it, else v1."""
    version = getattr(pynvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            return pynvml.nvmlDeviceGetMemoryInfo(handle, version=version)
        except pynvml.NVMLError:  # drivers before R510 lack nvmlDeviceGetMemoryInfo_v2
            pass
    return pynvml.nvmlDeviceGetMemoryInfo(handle)


def _process_name(pid: int) -> str | None:
    import psutil

    try:
        return psutil.Process(pid).name()
    except psutil.Error:  # gone, or in another pid namespace, or not ours to inspect
        return None


def _read_processes(pynvml: Any, handle: Any) -> tuple[GpuProcess, ...]:
    used_by_pid: dict[int, int | None] = {}
    for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        function = getattr(pynvml, getter, None)
        infos = _optional(pynvml, lambda f=function: f(handle)) if function is not None else None
        for info in infos or ():
            used = getattr(info, "usedGpuMemory", None)  # None: NVML_VALUE_NOT_AVAILABLE
            pid = int(info.pid)
            if used_by_pid.get(pid) is None:  # a process can be in both lists; keep a known figure
                used_by_pid[pid] = None if used is None else int(used)
    return tuple(
        GpuProcess(pid=pid, name=_process_name(pid), used_memory_bytes=used)
        for pid, used in sorted(used_by_pid.items())
    )


def _read_device(pynvml: Any, index: int) -> GpuStats:
    """One GPU's stats. Handle, memory and name are required (an NVMLError propagates); the rest is optional."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    memory = _memory_info(pynvml, handle)
    name = _text(pynvml.nvmlDeviceGetName(handle))
    utilization_percent = _optional(pynvml, lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    temperature = _optional(
        pynvml, lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
    )
    power_mw = _optional(pynvml, lambda: pynvml.nvmlDeviceGetPowerUsage(handle))
    power_limit_mw = _optional(pynvml, lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle))
    return GpuStats(
        index=index,
        name=name,
        uuid=_text(_optional(pynvml, lambda: pynvml.nvmlDeviceGetUUID(handle)) or ""),
        pci_bus_id=_text(_optional(pynvml, lambda: pynvml.nvmlDeviceGetPciInfo(handle).busId) or ""),
        memory_total_bytes=int(memory.total),
        memory_used_bytes=int(memory.used),
        memory_free_bytes=int(memory.free),
        utilization_fraction=None
        if utilization_percent is None
        else min(1.0, int(utilization_percent) / 100),
        temperature_c=None if temperature is None else int(temperature),
        power_w=None if power_mw is None else power_mw / 1000,  # NVML reports milliwatts
        power_limit_w=None if power_limit_mw is None else power_limit_mw / 1000,
        processes=_read_processes(pynvml, handle),
    )


def read_gpus(pynvml: Any) -> tuple[list[GpuStats], list[str]]:
    """Every readable GPU; an unreadable one is left out with a warning (not the whole list, as in the seed)."""
    try:
        count = int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError as exc:
        raise NvmlUnavailableError(f"NVML started but could not count the GPUs: {exc}") from exc
    gpus: list[GpuStats] = []
    warnings: list[str] = []
    for index in range(count):
        try:
            gpus.append(_read_device(pynvml, index))
        except pynvml.NVMLError as exc:
            warnings.append(
                f"GPU {index} left out: NVML could not read its stats ({type(exc).__name__}: {exc})"
            )
    return gpus, warnings


def _cuda_version_text(version: int | None) -> str | None:
    # NVML encodes CUDA 12.4 as 12040 (1000 * major + 10 * minor)
    return None if version is None else f"{version // 1000}.{version % 1000 // 10}"


def read_local_inventory() -> NvmlInventory:
    """Driver versions and the stats of every readable GPU on this machine, via NVML (init, read, shutdown).

    Does not log: the warnings are in the result for the caller to show.

    Raises:
        NvmlUnavailableError: pynvml is missing, or NVML cannot start (no driver, driver not loaded).
    """
    pynvml = import_pynvml()
    init_nvml(pynvml)
    try:
        gpus, warnings = read_gpus(pynvml)
        return NvmlInventory(
            driver_version=_text(_optional(pynvml, pynvml.nvmlSystemGetDriverVersion) or "") or None,
            nvml_version=_text(_optional(pynvml, pynvml.nvmlSystemGetNVMLVersion) or "") or None,
            cuda_driver_version=_cuda_version_text(_optional(pynvml, pynvml.nvmlSystemGetCudaDriverVersion)),
            gpus=tuple(gpus),
            warnings=tuple(warnings),
        )
    finally:
        shutdown_nvml(pynvml)


def read_local_gpu_stats() -> list[GpuStats]:
    """Stats of every readable GPU on this machine (NVML order); each unreadable GPU is logged as a warning.

    Raises:
        NvmlUnavailableError: pynvml is missing, or NVML cannot start (no driver, driver not loaded).
    """
    inventory = read_local_inventory()
    for warning in inventory.warnings:
        LOGGER.warning(warning)
    return list(inventory.gpus)
