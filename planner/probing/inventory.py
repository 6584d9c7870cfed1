"""What a node reports about itself: its host (``HostInfo``) and GPUs with the selection applied
(``NodeInventory``), read from a cluster config entry (``simulated_inventory``) or from NVML on this host
(``real_inventory``, no torch); ``planner.probing.node_entry`` writes them as ``batchplan devices --json``'s
node entries. ``planner.probing.probe.NodeProbe`` runs these on each node over Ray;
``planner.probing.backends.LocalBackend`` runs them in-process.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass

from planner.cluster import NodeSpec
from torchkit.hardware.catalog import ADD_GPU_TYPE_FIX, GpuCatalog
from torchkit.hardware.gpu_select import GpuSelection, select_gpus_or_none
from torchkit.hardware.nvml import GpuStats

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class HostInfo:
    """The host a node's ranks share: data-loader workers compete for its cores and memory."""

    hostname: str
    cpu: str
    """CPU model"""
    cpu_count: int | None
    """logical cores; None when unknown (a simulated node that does not say)"""
    memory_total_bytes: int | None


@dataclass(frozen=True, kw_only=True)
class NodeInventory:
    """One node's GPUs, which of them the job may use, and why the others are skipped."""

    name: str
    simulated: bool
    devices: tuple[GpuStats, ...]
    gpu_types: tuple[str | None, ...]
    """catalog type of each device (same order as ``devices``); None for a GPU the catalog does not know"""
    selection: GpuSelection
    host: HostInfo
    driver: dict | None = None
    """NVML/driver/CUDA versions on a real node"""
    warnings: tuple[str, ...] = ()
    ray_node_id: str | None = None
    probe_pid: int | None = None

    def with_probe(self, *, ray_node_id: str | None, probe_pid: int | None) -> NodeInventory:
        from dataclasses import replace

        return replace(self, ray_node_id=ray_node_id, probe_pid=probe_pid)

    @property
    def torch_without_cuda(self) -> bool:
        """A real node whose torch is a build without CUDA (its probe read so, ``torch_cuda_build``): nothing
        can be measured there, so ``auto`` is planned as the estimate it will be."""
        driver = self.driver or {}
        return (
            not self.simulated
            and bool(driver.get("torch_version"))
            and "torch_cuda_version" in driver
            and driver["torch_cuda_version"] is None
        )

    def device(self, index: int) -> GpuStats:
        for stats in self.devices:
            if stats.index == index:
                return stats
        raise KeyError(index)

    def gpu_type(self, index: int) -> str | None:
        for stats, gpu_type in zip(self.devices, self.gpu_types, strict=True):
            if stats.index == index:
                return gpu_type
        raise KeyError(index)


def simulated_inventory(
    node: NodeSpec,
    *,
    select: str = "all",
    min_free_memory_fraction: float = 0.0,
    max_utilization_fraction: float = 1.0,
) -> NodeInventory:
    """The inventory of a simulated node, from its config entry (no NVML)."""
    devices = tuple(
        GpuStats(
            index=gpu.index,
            name=gpu.spec.name,
            uuid=f"GPU-sim-{node.name}-{gpu.index}",
            pci_bus_id="",
            memory_total_bytes=gpu.spec.memory_bytes,
            memory_used_bytes=gpu.used_memory_bytes,
            memory_free_bytes=gpu.spec.memory_bytes - gpu.used_memory_bytes,
            utilization_fraction=gpu.utilization_fraction,
            temperature_c=None,
            power_w=None,
            power_limit_w=None,
            processes=(),
        )
        for gpu in node.gpus
    )
    selection = select_gpus_or_none(
        devices,
        select,
        min_free_memory_fraction=min_free_memory_fraction,
        max_utilization_fraction=max_utilization_fraction,
    )
    return NodeInventory(
        name=node.name,
        simulated=True,
        devices=devices,
        gpu_types=tuple(gpu.spec.name for gpu in node.gpus),
        selection=selection,
        host=HostInfo(
            hostname=node.name,
            cpu="simulated",
            cpu_count=node.cpu_count,
            memory_total_bytes=node.host_memory_bytes,
        ),
    )


def local_host_info() -> HostInfo:
    import psutil

    from torchkit.hardware.host import get_cpu_info

    return HostInfo(
        hostname=socket.gethostname(),
        cpu=get_cpu_info(),
        cpu_count=os.cpu_count(),
        memory_total_bytes=int(psutil.virtual_memory().total),
    )


def _package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


#: torch records its build's CUDA version in ``torch/version.py`` (``cuda: Optional[str] = '12.1'``; None for
#: a CPU build), what ``torch.version.cuda`` says; read as text, since importing torch costs seconds
_TORCH_VERSION_FILE = ("torch", "version.py")


def torch_cuda_build(version_text: str | None = None) -> tuple[bool, str | None]:
    """``(known, cuda)``: whether this host's torch says which CUDA it is built for, and that version (None: a
    build without CUDA). ``version_text``: the file's text (default: read from the installed torch)."""
    import ast

    if version_text is None:
        import importlib.util
        from pathlib import Path

        spec = importlib.util.find_spec(_TORCH_VERSION_FILE[0])  # finds the package, imports nothing
        if spec is None or not spec.origin:
            return False, None
        try:
            version_text = (Path(spec.origin).parent / _TORCH_VERSION_FILE[1]).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return False, None
    try:
        tree = ast.parse(version_text)
    except (SyntaxError, ValueError):
        return False, None
    for node in tree.body:
        target = (
            node.target
            if isinstance(node, ast.AnnAssign)
            else (node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        )
        if isinstance(target, ast.Name) and target.id == "cuda" and isinstance(node.value, ast.Constant):
            value = node.value.value
            if value is None or isinstance(value, str):
                return True, value
    return False, None


def real_inventory(
    catalog: GpuCatalog,
    *,
    select: str = "all",
    min_free_memory_fraction: float = 0.0,
    max_utilization_fraction: float = 1.0,
) -> NodeInventory:
    """This host's GPUs over NVML (imports no torch). No NVML (no driver) is not an error: the node has no
    GPU, with one warning that says why."""
    from torchkit.hardware.nvml import NvmlUnavailableError, read_local_inventory

    warnings: list[str] = []
    driver = None
    devices: tuple[GpuStats, ...] = ()
    try:
        nvml = read_local_inventory()
    except NvmlUnavailableError as exc:
        warnings.append(f"no NVIDIA driver/NVML found, listing the host only: {exc}")
    else:
        devices = nvml.gpus
        warnings.extend(nvml.warnings)
        # versions preflight compares across nodes; torch's from package metadata (importing it costs seconds)
        driver = {
            "nvml_version": nvml.nvml_version,
            "driver_version": nvml.driver_version,
            "cuda_driver_version": nvml.cuda_driver_version,
            "torch_version": _package_version("torch"),
        }
        known, cuda = torch_cuda_build()
        if known:
            driver["torch_cuda_version"] = cuda
    gpu_types = []
    for stats in devices:
        spec = catalog.resolve(stats.name)
        if spec is None:
            warnings.append(
                f"GPU {stats.index} '{stats.name}' is not in the GPU catalog; {ADD_GPU_TYPE_FIX} to plan for it"
            )
        gpu_types.append(spec.name if spec else None)
    selection = (
        select_gpus_or_none(
            devices,
            select,
            min_free_memory_fraction=min_free_memory_fraction,
            max_utilization_fraction=max_utilization_fraction,
        )
        if devices
        else GpuSelection(selected=(), skipped=())
    )
    return NodeInventory(
        name=socket.gethostname(),
        simulated=False,
        devices=devices,
        gpu_types=tuple(gpu_types),
        selection=selection,
        host=local_host_info(),
        driver=driver,
        warnings=tuple(warnings),
    )
