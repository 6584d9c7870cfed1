"""The document of ``batchplan devices --json`` (``batchplan/devices@1``), declared once: a node entry per node
(``NodeEntry``, built from a probe's ``NodeInventory`` or from a probe that failed), written and read by
``planner.codec`` like every other document. The table ``batchplan devices`` prints is rendered from the same
records, so the table and the JSON cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from planner.probing.inventory import HostInfo, NodeInventory
from torchkit.hardware.nvml import GpuProcess

SCHEMA = "batchplan/devices@1"


@dataclass(frozen=True, kw_only=True)
class DeviceEntry:
    """One GPU as NVML (or a simulated node's config) reports it, with its catalog type."""

    index: int
    """NVML index"""
    name: str
    uuid: str
    pci_bus_id: str
    memory_total_bytes: int
    memory_used_bytes: int
    memory_free_bytes: int
    utilization: float | None
    """share of the last sample period a kernel ran, 0..1 (``GpuStats.utilization_fraction``); None: unknown"""
    temperature_c: int | None
    power_w: float | None
    power_limit_w: float | None
    processes: tuple[GpuProcess, ...]
    gpu_type: str | None
    """the catalog type the planner plans it as; None for a GPU the catalog does not know"""


@dataclass(frozen=True, kw_only=True)
class SkippedDevice:
    device_index: int
    reason: str
    """why the selection leaves it out (busy, not asked for, less idle than those picked)"""


@dataclass(frozen=True, kw_only=True)
class NodeEntry:
    """One node: its host, its GPUs, which of them the selection picks and why the others are skipped."""

    name: str
    simulated: bool
    ray_node_id: str | None
    probe_pid: int | None
    driver: dict[str, str | None] | None
    """NVML, driver, CUDA and torch versions on a real node (``torch_cuda_version`` only where torch says)"""
    host: HostInfo | None
    """None for a node whose probe failed"""
    devices: tuple[DeviceEntry, ...]
    selected: tuple[int, ...]
    skipped: tuple[SkippedDevice, ...]
    warnings: tuple[str, ...]
    """the inventory's own warnings, then the selection's"""


@dataclass(frozen=True, kw_only=True)
class DevicesDocument:
    schema: Literal["batchplan/devices@1"] = SCHEMA
    nodes: tuple[NodeEntry, ...]


def node_entry(inventory: NodeInventory) -> NodeEntry:
    """The entry of a node whose probe answered."""
    devices = tuple(
        DeviceEntry(
            index=s.index,
            name=s.name,
            uuid=s.uuid,
            pci_bus_id=s.pci_bus_id,
            memory_total_bytes=s.memory_total_bytes,
            memory_used_bytes=s.memory_used_bytes,
            memory_free_bytes=s.memory_free_bytes,
            utilization=s.utilization_fraction,
            temperature_c=s.temperature_c,
            power_w=s.power_w,
            power_limit_w=s.power_limit_w,
            processes=s.processes,
            gpu_type=gpu_type,
        )
        for s, gpu_type in zip(inventory.devices, inventory.gpu_types, strict=True)
    )
    selection = inventory.selection
    return NodeEntry(
        name=inventory.name,
        simulated=inventory.simulated,
        ray_node_id=inventory.ray_node_id,
        probe_pid=inventory.probe_pid,
        driver=inventory.driver,
        host=inventory.host,
        devices=devices,
        selected=selection.selected,
        skipped=tuple(SkippedDevice(device_index=i, reason=r) for i, r in selection.skipped),
        warnings=(*inventory.warnings, *selection.warnings),
    )


def failed_node_entry(name: str, *, simulated: bool, reason: str) -> NodeEntry:
    """The entry of a node whose probe died or did not answer: no host, no devices, the reason as a warning."""
    return NodeEntry(
        name=name,
        simulated=simulated,
        ray_node_id=None,
        probe_pid=None,
        driver=None,
        host=None,
        devices=(),
        selected=(),
        skipped=(),
        warnings=(f"probe failed: {reason}",),
    )
