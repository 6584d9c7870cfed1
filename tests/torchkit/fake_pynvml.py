"""A small fake of the ``pynvml`` module (package nvidia-ml-py): it stands in for the NVIDIA driver.

Tests install ``FakeNvml(...).module()`` as ``sys.modules["pynvml"]`` (see conftest.py), so our code runs
unchanged above the import boundary. It mirrors the parts of pynvml our code calls, with pynvml's shapes:
exceptions are ``NVMLError`` subclasses carrying ``value``; memory info has ``total/free/used`` (v2 adds
``reserved``, and ``used`` then excludes it); PCI ``busId`` is bytes (a ctypes char array); power is mW;
process infos have ``pid`` and ``usedGpuMemory`` (None when NVML cannot tell); calls before ``nvmlInit``
raise ``NVMLError_Uninitialized``.

Scenarios: ``mixed_load_gpus`` (4 GPUs of mixed load), ``pci_order_gpus`` (3 GPUs whose CUDA order differs
from their PCI order, with ``cuda_fastest_first`` giving torch's view).
"""

from __future__ import annotations

import os
import types
from dataclasses import dataclass, field
from typing import Any

from torchkit.units import GIB

NVML_TEMPERATURE_GPU = 0
nvmlMemory_v2 = 0x02000028  # pynvml's value: sizeof(c_nvmlMemory_v2_t) | (2 << 24)

# a pid no process has (above Linux's pid_max limit of 2^22): psutil cannot name it
MISSING_PID = 2**31 - 2


class NVMLError(Exception):
    value = 999
    message = "Unknown Error"

    def __init__(self, value: int | None = None):
        super().__init__()
        self.value = type(self).value if value is None else value

    def __str__(self) -> str:
        return self.message


def _error(name: str, value: int, message: str) -> type[NVMLError]:
    return type(name, (NVMLError,), {"value": value, "message": message})


NVMLError_Uninitialized = _error("NVMLError_Uninitialized", 1, "Uninitialized")
NVMLError_NotSupported = _error("NVMLError_NotSupported", 3, "Not Supported")
NVMLError_DriverNotLoaded = _error("NVMLError_DriverNotLoaded", 9, "Driver Not Loaded")
NVMLError_LibraryNotFound = _error("NVMLError_LibraryNotFound", 12, "NVML Shared Library Not Found")
NVMLError_FunctionNotFound = _error("NVMLError_FunctionNotFound", 13, "Function Not Found")
NVMLError_GpuIsLost = _error("NVMLError_GpuIsLost", 15, "GPU is lost")

ERRORS = (
    NVMLError,
    NVMLError_Uninitialized,
    NVMLError_NotSupported,
    NVMLError_DriverNotLoaded,
    NVMLError_LibraryNotFound,
    NVMLError_FunctionNotFound,
    NVMLError_GpuIsLost,
)


@dataclass
class FakeGpu:
    """One fake GPU. ``None`` for an optional reading means NVML answers NotSupported for it."""

    name: str
    uuid: str
    pci_bus_id: str
    memory_total_bytes: int = 16 * GIB
    memory_used_bytes: int = 0
    memory_reserved_bytes: int = GIB // 2
    utilization_percent: int | None = 0
    temperature_c: int | None = 40
    power_mw: int | None = 50_000
    power_limit_mw: int | None = 300_000
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    lost: bool = False
    """every call on this GPU raises NVMLError_GpuIsLost (an unreadable GPU)"""


@dataclass
class _Handle:
    index: int


class FakeNvml:
    """State of the fake driver; ``module()`` builds the ``pynvml`` module that talks to it."""

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        init_error: type[NVMLError] | None = None,
        memory_v2: bool = True,
        driver_version: str = "550.54.15",
        nvml_version: str = "12.550.54.15",
        cuda_driver_version: int = 12040,
    ):
        self.gpus = gpus
        self.init_error = init_error
        self.memory_v2 = memory_v2
        self.driver_version = driver_version
        self.nvml_version = nvml_version
        self.cuda_driver_version = cuda_driver_version
        self.init_calls = 0
        self.shutdown_calls = 0
        self.open_sessions = 0

    # -- driver side
    def _check_init(self) -> None:
        if self.open_sessions <= 0:
            raise NVMLError_Uninitialized()

    def _gpu(self, handle: _Handle) -> FakeGpu:
        self._check_init()
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise NVMLError_GpuIsLost()
        return gpu

    @staticmethod
    def _optional(value: Any) -> Any:
        if value is None:
            raise NVMLError_NotSupported()
        return value

    def module(self) -> types.ModuleType:
        fake = self
        m = types.ModuleType("pynvml")
        m.__file__ = __file__
        for error in ERRORS:
            setattr(m, error.__name__, error)
        m.NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
        m.nvmlMemory_v2 = nvmlMemory_v2

        def nvmlInit() -> None:
            fake.init_calls += 1
            if fake.init_error is not None:
                raise fake.init_error()
            fake.open_sessions += 1

        def nvmlShutdown() -> None:
            fake._check_init()
            fake.shutdown_calls += 1
            fake.open_sessions -= 1

        def nvmlDeviceGetCount() -> int:
            fake._check_init()
            return len(fake.gpus)

        def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
            fake._check_init()
            if not 0 <= index < len(fake.gpus):
                raise NVMLError(2)  # NVML_ERROR_INVALID_ARGUMENT
            return _Handle(index)

        def nvmlDeviceGetMemoryInfo(handle: _Handle, version: int | None = None) -> Any:
            gpu = fake._gpu(handle)
            reserved = gpu.memory_reserved_bytes
            free = gpu.memory_total_bytes - gpu.memory_used_bytes - reserved
            if version is None:  # v1: "used" includes what the driver reserves
                return types.SimpleNamespace(
                    total=gpu.memory_total_bytes, free=free, used=gpu.memory_used_bytes + reserved
                )
            if not fake.memory_v2 or version != nvmlMemory_v2:
                raise NVMLError_FunctionNotFound()
            return types.SimpleNamespace(
                version=version,
                total=gpu.memory_total_bytes,
                reserved=reserved,
                free=free,
                used=gpu.memory_used_bytes,
            )

        def nvmlDeviceGetName(handle: _Handle) -> str:
            return fake._gpu(handle).name

        def nvmlDeviceGetUUID(handle: _Handle) -> str:
            return fake._gpu(handle).uuid

        def nvmlDeviceGetPciInfo(handle: _Handle) -> Any:
            return types.SimpleNamespace(busId=fake._gpu(handle).pci_bus_id.encode())

        def nvmlDeviceGetUtilizationRates(handle: _Handle) -> Any:
            gpu = fake._gpu(handle)
            return types.SimpleNamespace(gpu=fake._optional(gpu.utilization_percent), memory=0)

        def nvmlDeviceGetTemperature(handle: _Handle, sensor: int) -> int:
            assert sensor == NVML_TEMPERATURE_GPU
            return fake._optional(fake._gpu(handle).temperature_c)

        def nvmlDeviceGetPowerUsage(handle: _Handle) -> int:
            return fake._optional(fake._gpu(handle).power_mw)

        def nvmlDeviceGetEnforcedPowerLimit(handle: _Handle) -> int:
            return fake._optional(fake._gpu(handle).power_limit_mw)

        def nvmlDeviceGetComputeRunningProcesses(handle: _Handle) -> list[Any]:
            gpu = fake._gpu(handle)
            return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu.processes]

        def nvmlDeviceGetGraphicsRunningProcesses(handle: _Handle) -> list[Any]:
            fake._gpu(handle)
            return []

        def nvmlSystemGetDriverVersion() -> str:
            fake._check_init()
            return fake.driver_version

        def nvmlSystemGetNVMLVersion() -> str:
            fake._check_init()
            return fake.nvml_version

        def nvmlSystemGetCudaDriverVersion() -> int:
            fake._check_init()
            return fake.cuda_driver_version

        for function in (
            nvmlInit,
            nvmlShutdown,
            nvmlDeviceGetCount,
            nvmlDeviceGetHandleByIndex,
            nvmlDeviceGetMemoryInfo,
            nvmlDeviceGetName,
            nvmlDeviceGetUUID,
            nvmlDeviceGetPciInfo,
            nvmlDeviceGetUtilizationRates,
            nvmlDeviceGetTemperature,
            nvmlDeviceGetPowerUsage,
            nvmlDeviceGetEnforcedPowerLimit,
            nvmlDeviceGetComputeRunningProcesses,
            nvmlDeviceGetGraphicsRunningProcesses,
            nvmlSystemGetDriverVersion,
            nvmlSystemGetNVMLVersion,
            nvmlSystemGetCudaDriverVersion,
        ):
            setattr(m, function.__name__, function)
        return m


# ------------------------------------------------------------------------------------------------ scenarios


def mixed_load_gpus() -> list[FakeGpu]:
    """Four 16 GiB V100s (0.5 GiB driver-reserved each):

    0: busy (85%, 12 GiB used by this test process), 1: idle (0%, 0.5 GiB), 2: medium (30%, 4 GiB, held by a
    pid psutil cannot name, memory figure unavailable), 3: utilisation/temperature/power not supported,
    almost empty (0.1 GiB used).
    """
    name = "Tesla V100-SXM2-16GB"
    return [
        FakeGpu(
            name=name,
            uuid="GPU-00000000-0000-0000-0000-000000000000",
            pci_bus_id="00000000:1A:00.0",
            memory_used_bytes=12 * GIB,
            utilization_percent=85,
            temperature_c=71,
            power_mw=250_000,
            processes=[(os.getpid(), 12 * GIB)],
        ),
        FakeGpu(
            name=name,
            uuid="GPU-11111111-1111-1111-1111-111111111111",
            pci_bus_id="00000000:1B:00.0",
            memory_used_bytes=GIB // 2,
            utilization_percent=0,
            temperature_c=35,
            power_mw=40_000,
        ),
        FakeGpu(
            name=name,
            uuid="GPU-22222222-2222-2222-2222-222222222222",
            pci_bus_id="00000000:3D:00.0",
            memory_used_bytes=4 * GIB,
            utilization_percent=30,
            temperature_c=55,
            power_mw=120_000,
            processes=[(MISSING_PID, None)],
        ),
        FakeGpu(
            name=name,
            uuid="GPU-33333333-3333-3333-3333-333333333333",
            pci_bus_id="00000000:3E:00.0",
            memory_used_bytes=GIB // 10,
            utilization_percent=None,
            temperature_c=None,
            power_mw=None,
            power_limit_mw=None,
        ),
    ]


def pci_order_gpus() -> list[FakeGpu]:
    """NVML (PCI bus) order: 0 = busy T4 on bus 1A, 1 = idle A100 on bus 3B, 2 = half-busy T4 on bus 5E."""
    return [
        FakeGpu(
            name="Tesla T4",
            uuid="GPU-aaaaaaaa-0000-0000-0000-00000000001a",
            pci_bus_id="00000000:1A:00.0",
            memory_total_bytes=15 * GIB,
            memory_used_bytes=10 * GIB,
            utilization_percent=90,
        ),
        FakeGpu(
            name="NVIDIA A100-SXM4-80GB",
            uuid="GPU-bbbbbbbb-0000-0000-0000-00000000003b",
            pci_bus_id="00000000:3B:00.0",
            memory_total_bytes=80 * GIB,
            memory_used_bytes=GIB,
            utilization_percent=0,
        ),
        FakeGpu(
            name="Tesla T4",
            uuid="GPU-cccccccc-0000-0000-0000-00000000005e",
            pci_bus_id="00000000:5E:00.0",
            memory_total_bytes=15 * GIB,
            memory_used_bytes=2 * GIB,
            utilization_percent=50,
        ),
    ]


def cuda_properties(gpu: FakeGpu, *, with_ids: bool = True) -> types.SimpleNamespace:
    """What ``torch.cuda.get_device_properties`` reports for a GPU: UUID without the ``GPU-`` prefix, PCI
    domain/bus/device as ints. ``with_ids=False``: an older torch without those fields."""
    props = types.SimpleNamespace(name=gpu.name, total_memory=gpu.memory_total_bytes, major=8, minor=0)
    if with_ids:
        domain, bus, rest = gpu.pci_bus_id.split(":")
        props.uuid = gpu.uuid.removeprefix("GPU-")
        props.pci_domain_id = int(domain, 16)
        props.pci_bus_id = int(bus, 16)
        props.pci_device_id = int(rest.split(".")[0], 16)
    return props


def cuda_fastest_first(gpus: list[FakeGpu]) -> list[FakeGpu]:
    """CUDA's default order (CUDA_DEVICE_ORDER=FASTEST_FIRST) for ``pci_order_gpus``: the A100 first."""
    return sorted(gpus, key=lambda g: (not g.name.startswith("NVIDIA A100"), g.pci_bus_id))
