"""GPU inventory through NVML, and the choice of idle GPUs.

Two layers:

* the NVML edge: ``read_local_inventory``/``read_local_gpu_stats`` (typed ``GpuStats``) and the seed's
  ``GPUInfo`` class (Ultralytics ``autodevice.py``: ``gpu_stats`` dicts, ``print_status``,
  ``select_idle_gpu``);
* a pure layer on ``GpuStats`` that the planner reuses for simulated nodes: ``select_gpus`` (thresholds,
  ``all`` / ``-1,-1`` / ``0,2`` specs, a reason for every GPU left out) and ``rank_idle_gpus`` (the
  seed's idle order).

``pynvml`` (package ``nvidia-ml-py``) is imported inside the functions that talk to NVML, so importing this
module neither loads nor initialises NVML, and ``planner`` can use the pure layer without torch or a driver.

Differences from the seed's ``GPUInfo`` (deliberate):

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
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from torchkit.errors import ConfigError

LOGGER = logging.getLogger(__name__)

GIB = 2**30
MIB = 2**20

# a relative tolerance for fraction comparisons: 80% utilisation leaves 20% free, and 1 - 0.8 < 0.2 in floats
_EPS = 1e-9


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
    """NVML index (PCI bus order; not necessarily torch's index, see ``torchkit.device.parse_device``)"""
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

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form used by ``batchplan devices --json`` (``utilization`` is the 0..1 fraction)."""
        return {
            "index": self.index,
            "name": self.name,
            "uuid": self.uuid,
            "pci_bus_id": self.pci_bus_id,
            "memory_total_bytes": self.memory_total_bytes,
            "memory_used_bytes": self.memory_used_bytes,
            "memory_free_bytes": self.memory_free_bytes,
            "utilization": self.utilization_fraction,
            "temperature_c": self.temperature_c,
            "power_w": self.power_w,
            "power_limit_w": self.power_limit_w,
            "processes": [p.to_dict() for p in self.processes],
        }


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


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailableError(
            f"the pynvml module is not importable ({exc}); install it with 'pip install nvidia-ml-py'"
        ) from exc
    return pynvml


def _init_nvml(pynvml: Any) -> None:
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


def _shutdown_nvml(pynvml: Any) -> None:
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


def _read_gpus(pynvml: Any) -> tuple[list[GpuStats], list[str]]:
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
    pynvml = _import_pynvml()
    _init_nvml(pynvml)
    try:
        gpus, warnings = _read_gpus(pynvml)
        return NvmlInventory(
            driver_version=_text(_optional(pynvml, pynvml.nvmlSystemGetDriverVersion) or "") or None,
            nvml_version=_text(_optional(pynvml, pynvml.nvmlSystemGetNVMLVersion) or "") or None,
            cuda_driver_version=_cuda_version_text(_optional(pynvml, pynvml.nvmlSystemGetCudaDriverVersion)),
            gpus=tuple(gpus),
            warnings=tuple(warnings),
        )
    finally:
        _shutdown_nvml(pynvml)


def read_local_gpu_stats() -> list[GpuStats]:
    """Stats of every readable GPU on this machine (NVML order); each unreadable GPU is logged as a warning.

    Raises:
        NvmlUnavailableError: pynvml is missing, or NVML cannot start (no driver, driver not loaded).
    """
    inventory = read_local_inventory()
    for warning in inventory.warnings:
        LOGGER.warning(warning)
    return list(inventory.gpus)


# ------------------------------------------------------------------------------------------------ seed ranking


def _check_fraction(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{name} must be a fraction in [0, 1], got {value!r} (e.g. 0.2 for 20%)")


def rank_idle_gpus(
    stats: Sequence[GpuStats],
    count: int,
    *,
    min_memory_fraction: float = 0.0,
    min_util_fraction: float = 0.0,
    indices: Iterable[int] | None = None,
    tie_break: Callable[[], float] = random.random,
) -> list[int]:
    """The seed's idle choice, pure: up to ``count`` GPU indices, most idle first.

    Eligible: index in ``indices`` (when given), free/total memory >= ``min_memory_fraction`` and free
    utilisation (1 - utilisation) >= ``min_util_fraction``. Order: utilisation ascending, then free memory
    descending, then ``tie_break()`` (random by default, so jobs launched together spread out). A GPU with
    unknown utilisation ranks after every GPU whose utilisation is known, and is eligible only when
    ``min_util_fraction`` is 0.
    """
    allowed = None if indices is None else set(indices)
    eligible = [
        s
        for s in stats
        if (allowed is None or s.index in allowed)
        and s.memory_free_fraction >= min_memory_fraction - _EPS
        and (
            min_util_fraction <= 0.0
            if s.utilization_fraction is None
            else 1.0 - s.utilization_fraction >= min_util_fraction - _EPS
        )
    ]
    eligible.sort(
        key=lambda s: (
            s.utilization_fraction is None,
            s.utilization_fraction or 0.0,
            -s.memory_free_bytes,
            tie_break(),
        )
    )
    return [s.index for s in eligible[: max(0, count)]]


# ------------------------------------------------------------------------------------------------ GPUInfo


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
            pynvml = _import_pynvml()
            _init_nvml(pynvml)
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
            _shutdown_nvml(self.pynvml)
            self.nvml_available = False

    def refresh_stats(self) -> None:
        """Re-read every GPU; unreadable GPUs are left out with a warning each."""
        self.stats, self.gpu_stats = [], []
        if not self.nvml_available:
            return
        try:
            gpus, warnings = _read_gpus(self.pynvml)
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
        _check_fraction("min_memory_fraction", min_memory_fraction)
        _check_fraction("min_util_fraction", min_util_fraction)
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


# ------------------------------------------------------------------------------------------------ planner layer


@dataclass(frozen=True, kw_only=True)
class SelectSpec:
    """A parsed GPU selection: ``all``, or explicit indices plus a number of idle picks (``0,-1,-1``)."""

    text: str
    """the spec as given, normalised (lower case, no spaces)"""
    select_all: bool = False
    """``all``: every GPU meeting the thresholds"""
    explicit_indices: tuple[int, ...] = ()
    """indices named in the spec, in order"""
    idle_count: int = 0
    """number of ``-1`` tokens: that many most-idle GPUs among the rest"""


_SPEC_HELP = "use 'all', '-1' for the most idle GPU, '-1,-1' for the two most idle, or indices like '0,2'"


def parse_select_spec(spec: str) -> SelectSpec:
    """Parse a GPU selection (``all``, ``-1,-1``, ``0,2``, ``0,-1``).

    Raises:
        ConfigError: empty spec, a token that is neither an index nor -1, or an index named twice.
    """
    text = str(spec).strip().lower().replace(" ", "")
    if text == "all":
        return SelectSpec(text=text, select_all=True)
    if not text:
        raise ConfigError(f"empty GPU selection ({_SPEC_HELP})")
    explicit: list[int] = []
    idle_count = 0
    for token in text.split(","):
        if token == "-1":
            idle_count += 1
        elif token.isdigit():
            index = int(token)
            if index in explicit:
                raise ConfigError(f"GPU selection {spec!r} names GPU {index} twice ({_SPEC_HELP})")
            explicit.append(index)
        else:
            raise ConfigError(f"GPU selection {spec!r}: {token!r} is not a GPU index or -1 ({_SPEC_HELP})")
    return SelectSpec(text=text, explicit_indices=tuple(explicit), idle_count=idle_count)


@dataclass(frozen=True, kw_only=True)
class GpuSelection:
    """The GPUs a node will use and why the others are left out."""

    selected: tuple[int, ...]
    """chosen GPU indices: explicit ones in the order given, then idle picks most idle first (``all``:
    ascending)"""
    skipped: tuple[tuple[int, str], ...]
    """(index, reason) for every GPU not selected, ascending by index"""
    warnings: tuple[str, ...] = ()
    """explicitly requested GPUs that are used although they breach a threshold"""


class InsufficientGpusError(ConfigError):
    """Fewer GPUs meet the thresholds than the selection asks for.

    ``eligible``: the GPUs that could be picked; ``skipped``: (index, reason) for each GPU that breaches a
    threshold (GPUs named explicitly in the spec are in neither)."""

    def __init__(
        self, message: str, *, requested: int, eligible: tuple[int, ...], skipped: tuple[tuple[int, str], ...]
    ):
        super().__init__(message)
        self.requested = requested
        """number of idle GPUs asked for"""
        self.eligible = eligible
        """indices that met the thresholds (and were not named explicitly)"""
        self.skipped = skipped
        """(index, reason) for every GPU that breaches a threshold"""


def threshold_breaches(
    stats: GpuStats, *, min_free_memory_fraction: float = 0.0, max_utilization_fraction: float = 1.0
) -> list[str]:
    """Why a GPU fails the thresholds (empty when it meets them), e.g. ``busy: 85% utilisation > 50%``."""
    reasons: list[str] = []
    if stats.utilization_fraction is None:
        if max_utilization_fraction < 1.0:
            reasons.append(f"utilisation unknown (limit {max_utilization_fraction:.0%})")
    elif stats.utilization_fraction > max_utilization_fraction + _EPS:
        reasons.append(f"busy: {stats.utilization_fraction:.0%} utilisation > {max_utilization_fraction:.0%}")
    if min_free_memory_fraction > 0.0 and stats.memory_free_fraction < min_free_memory_fraction - _EPS:
        reasons.append(
            f"only {stats.memory_free_bytes / GIB:.1f} GiB of {stats.memory_total_bytes / GIB:.1f} GiB free "
            f"(< {min_free_memory_fraction:.0%})"
        )
    return reasons


def _idle_order(stats: GpuStats) -> tuple[bool, int, float, int]:
    # most free memory first (the planner's budget is memory), then lowest utilisation; unknown utilisation
    # ranks after every known one; the index makes the order deterministic
    return (
        stats.utilization_fraction is None,
        -stats.memory_free_bytes,
        stats.utilization_fraction or 0.0,
        stats.index,
    )


def select_gpus(
    stats: Sequence[GpuStats],
    spec: str = "all",
    *,
    min_free_memory_fraction: float = 0.0,
    max_utilization_fraction: float = 1.0,
) -> GpuSelection:
    """Choose a node's GPUs from their stats. Pure and deterministic (no NVML, no randomness).

    Specs:
      * ``all``: every GPU that meets the thresholds (none meeting them is a valid, empty answer);
      * ``-1`` repeated (``-1,-1``): that many most-idle GPUs meeting the thresholds: most free memory
        first, then lowest utilisation; a GPU with unknown utilisation ranks last;
      * indices (``0,2``): those GPUs, as given. A named GPU that breaches a threshold is still used (the
        user asked for it by name) and the breach is reported in ``warnings``;
      * a mix (``0,-1``): the named GPUs plus that many idle ones among the others.

    Thresholds: free memory / total >= ``min_free_memory_fraction`` and utilisation <=
    ``max_utilization_fraction``; an unknown utilisation fails a limit below 1.

    Raises:
        ConfigError: malformed spec, a fraction outside [0, 1], or a named index the node does not have.
        InsufficientGpusError (a ConfigError): fewer eligible GPUs than ``-1`` tokens; the message names what
            was asked, what is available and why each other GPU was left out.
    """
    _check_fraction("min_free_memory_fraction", min_free_memory_fraction)
    _check_fraction("max_utilization_fraction", max_utilization_fraction)
    request = parse_select_spec(spec)
    by_index = {s.index: s for s in stats}
    if len(by_index) != len(stats):
        raise ValueError(f"GPU indices are not unique: {[s.index for s in stats]}")
    breaches = {
        s.index: threshold_breaches(
            s,
            min_free_memory_fraction=min_free_memory_fraction,
            max_utilization_fraction=max_utilization_fraction,
        )
        for s in stats
    }
    missing = [i for i in request.explicit_indices if i not in by_index]
    if missing:
        have = ", ".join(str(i) for i in sorted(by_index)) or "none"
        raise ConfigError(
            f"GPU selection {spec!r} names GPU {missing[0]}, but this node's GPUs are: {have} "
            "(use indices listed by 'batchplan devices')"
        )

    selected = list(request.explicit_indices)
    warnings = [
        f"GPU {i} is used as requested although it does not meet the thresholds: {'; '.join(breaches[i])}"
        for i in request.explicit_indices
        if breaches[i]
    ]
    if request.select_all:
        selected = [s.index for s in sorted(stats, key=lambda s: s.index) if not breaches[s.index]]
    elif request.idle_count:
        candidates = sorted(
            (s for s in stats if not breaches[s.index] and s.index not in request.explicit_indices),
            key=_idle_order,
        )
        if len(candidates) < request.idle_count:
            skipped = tuple(
                (s.index, "; ".join(breaches[s.index]))
                for s in sorted(stats, key=lambda s: s.index)
                if breaches[s.index] and s.index not in request.explicit_indices
            )
            raise InsufficientGpusError(
                _shortfall_message(
                    spec,
                    request,
                    stats,
                    candidates,
                    skipped,
                    min_free_memory_fraction,
                    max_utilization_fraction,
                ),
                requested=request.idle_count,
                eligible=tuple(s.index for s in candidates),
                skipped=skipped,
            )
        selected += [s.index for s in candidates[: request.idle_count]]

    chosen = set(selected)
    skipped_list: list[tuple[int, str]] = []
    for s in sorted(stats, key=lambda s: s.index):
        if s.index in chosen:
            continue
        if not request.select_all and not request.idle_count:
            reason = "not requested"
        elif breaches[s.index]:
            reason = "; ".join(breaches[s.index])
        else:
            reason = "less idle than the GPUs picked"
        skipped_list.append((s.index, reason))
    return GpuSelection(selected=tuple(selected), skipped=tuple(skipped_list), warnings=tuple(warnings))


def _shortfall_message(
    spec: str,
    request: SelectSpec,
    stats: Sequence[GpuStats],
    candidates: Sequence[GpuStats],
    skipped: Sequence[tuple[int, str]],
    min_free_memory_fraction: float,
    max_utilization_fraction: float,
) -> str:
    asked = f"{request.idle_count} idle GPU{'s' if request.idle_count != 1 else ''}"
    if not stats:
        return f"GPU selection {spec!r} asks for {asked}, but this node has no GPUs"
    available = ", ".join(str(s.index) for s in candidates) or "none"
    explicit = (
        f" besides the named GPU(s) {', '.join(str(i) for i in request.explicit_indices)}"
        if request.explicit_indices
        else ""
    )
    reasons = "".join(f"; GPU {i}: {reason}" for i, reason in skipped)
    return (
        f"GPU selection {spec!r} asks for {asked}{explicit}, but only {len(candidates)} of the node's "
        f"{len(stats)} GPUs can be picked ({available}) with free memory >= {min_free_memory_fraction:.0%} and "
        f"utilisation <= {max_utilization_fraction:.0%}{reasons} (ask for fewer GPUs or relax the thresholds)"
    )


def select_gpus_or_none(
    stats: Sequence[GpuStats],
    spec: str = "all",
    *,
    min_free_memory_fraction: float = 0.0,
    max_utilization_fraction: float = 1.0,
) -> GpuSelection:
    """``select_gpus`` for one node of many: a selection the node cannot meet is not an error but an empty
    selection, every GPU skipped with its reason, and the error's message as a warning.

    Raises:
        ConfigError: a malformed spec or thresholds, or an index the node does not have.
    """
    try:
        return select_gpus(
            stats,
            spec,
            min_free_memory_fraction=min_free_memory_fraction,
            max_utilization_fraction=max_utilization_fraction,
        )
    except InsufficientGpusError as exc:
        reasons = dict(exc.skipped)
        return GpuSelection(
            selected=(),
            skipped=tuple(
                (g.index, reasons.get(g.index, f"not used: selection {spec!r} cannot be met"))
                for g in sorted(stats, key=lambda g: g.index)
            ),
            warnings=(str(exc),),
        )
