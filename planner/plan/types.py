"""The parts of a plan, typed: the devices that may become ranks (``RankSlot``) and those left out
(``ExcludedDevice``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class RankSlot:
    """A device that may become a rank: where it is, which profile describes it, and its memory budget."""

    node: str
    """node name (Ray node or simulated node)"""
    device_index: int
    """NVML index of the GPU on its node"""
    gpu: str
    """GPU type name"""
    profile: str
    """key of its DeviceProfile"""
    memory_budget_bytes: int
    """fraction × available memory: the most the plan may predict for this device"""
    total_memory_bytes: int
    """the device's total memory"""
    visible_id: str = ""
    """what CUDA_VISIBLE_DEVICES should name for it (UUID on real nodes; the index otherwise)"""
    speed_factor: float = 1.0
    """share of the profiled speed a rank gets here, in (0, 1]: below 1 on a GPU other work keeps busy
    (``planner.probing.busy``); its step time is the profile's divided by this"""

    @property
    def group(self) -> str:
        """How sentences name this device's kind: the GPU type, with its speed when it is shared."""
        return self.gpu if self.speed_factor >= 1.0 else f"{self.gpu} at {self.speed_factor:.0%} speed"


@dataclass(frozen=True, kw_only=True)
class ExcludedDevice:
    node: str
    device_index: int | None
    gpu: str | None
    reason: str

    def to_json(self) -> dict:
        return {"node": self.node, "device_index": self.device_index, "gpu": self.gpu, "reason": self.reason}
