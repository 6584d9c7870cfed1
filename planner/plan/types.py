"""The plan, typed: ``Plan`` with its ``RankEntry``/``NodeEntry``/``LaunchInfo`` parts, the devices that may
become ranks (``RankSlot``) and those left out (``ExcludedDevice`` with an ``ExclusionKind``).

Inside the program a plan is a ``Plan``; JSON exists only at the edges (``to_json``/``from_json``, used by
``planner.plan.io`` and the CLI's ``--json``). ``to_json`` writes ``batchplan/plan@1`` exactly as before:
the same fields in the same order. Two things are typed in the program only and not written (the schema is
unchanged): why a device was left out (``ExcludedDevice.kind``) and which warnings are the allocation's
advice (``Plan.advice``, whose sentences are also in ``warnings``). A plan read back from a file has
``kind=None`` and no ``advice``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from planner.allocate.advice import Advice
from planner.job import JobSpec, Mode
from planner.plan.derived import check_identities
from planner.profiles.profile import DeviceProfile


class ExclusionKind(Enum):
    """Why a device is not a rank of the plan."""

    SKIPPED_BY_SELECTION = "skipped_by_selection"
    """``--gpus`` and the idle thresholds left it out (``GpuSelection.skipped``)"""
    UNKNOWN_GPU_TYPE = "unknown_gpu_type"
    """its GPU type is not in the catalog"""
    PROBE_FAILED = "probe_failed"
    """its node's probe died or timed out"""
    NOT_PROFILED = "not_profiled"
    """its GPU type could not be profiled"""
    BELOW_MIN_BATCH = "below_min_batch"
    """its memory budget does not fit the minimum batch (the allocation left it out)"""


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
    """None when the whole node is left out"""
    gpu: str | None
    reason: str
    """one line for people; programs read ``kind``"""
    kind: ExclusionKind | None = None
    """None only for a plan read from a file (the file keeps the reason alone)"""

    def to_json(self) -> dict:
        return {"node": self.node, "device_index": self.device_index, "gpu": self.gpu, "reason": self.reason}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExcludedDevice:
        return cls(node=data["node"], device_index=data.get("device_index"), gpu=data.get("gpu"), reason=data["reason"])


@dataclass(frozen=True, kw_only=True)
class RankEntry:
    """One rank of the plan: where it runs and its share of every step."""

    rank: int
    node: str
    node_rank: int
    local_rank: int
    device_index: int
    gpu: str
    profile: str
    batch: int
    max_batch: int
    loss_weight: float
    predicted_memory_bytes: int
    memory_budget_bytes: int
    total_memory_bytes: int
    predicted_step_time_s: float
    idle_fraction: float | None = None
    """share of a step this rank waits for the slowest; None in plans written without it"""
    speed_factor: float = 1.0
    """share of the profiled speed the rank gets on its GPU (below 1 where other work keeps it busy:
    ``planner.probing.busy``); ``predicted_step_time_s`` is the profile's time divided by it"""

    def to_json(self) -> dict:
        data = {
            "rank": self.rank,
            "node": self.node,
            "node_rank": self.node_rank,
            "local_rank": self.local_rank,
            "device_index": self.device_index,
            "gpu": self.gpu,
            "profile": self.profile,
            "batch": self.batch,
            "max_batch": self.max_batch,
            "loss_weight": self.loss_weight,
            "predicted_memory_bytes": self.predicted_memory_bytes,
            "memory_budget_bytes": self.memory_budget_bytes,
            "total_memory_bytes": self.total_memory_bytes,
            "predicted_step_time_s": self.predicted_step_time_s,
        }
        if self.idle_fraction is not None:
            data["idle_fraction"] = self.idle_fraction
        data["speed_factor"] = self.speed_factor
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RankEntry:
        """The entry of a validated document (``planner.plan.validate.check_rank_fields`` checked its fields).

        Built without the dataclass ``__init__`` (which sets each of 16 fields through ``object.__setattr__``):
        a 65,536-rank plan has that many entries, and ``show`` must take seconds, not tens of seconds."""
        entry = object.__new__(cls)
        values = {name: data[name] for name in _RANK_REQUIRED}
        values.update(idle_fraction=data.get("idle_fraction"), speed_factor=data.get("speed_factor", 1.0))
        entry.__dict__.update(values)
        return entry


_RANK_REQUIRED = tuple(f for f in RankEntry.__dataclass_fields__ if f not in ("idle_fraction", "speed_factor"))


@dataclass(frozen=True, kw_only=True)
class NodeEntry:
    """One node of the plan and the line that starts its ranks."""

    name: str
    node_rank: int
    address: str | None
    """host name or IP for ``--master-addr``; None in plans written without it"""
    cuda_visible_devices: str
    nproc_per_node: int
    torchrun: str
    env: dict[str, str] | None = None
    """the node's launch environment (``--emit env``); None in plans written without it"""

    def to_json(self) -> dict:
        data: dict[str, Any] = {"name": self.name, "node_rank": self.node_rank}
        if self.address is not None:
            data["address"] = self.address
        data.update(cuda_visible_devices=self.cuda_visible_devices, nproc_per_node=self.nproc_per_node,
                    torchrun=self.torchrun)
        if self.env is not None:
            data["env"] = dict(self.env)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeEntry:
        return cls(name=data["name"], node_rank=data["node_rank"], address=data.get("address"),
                   cuda_visible_devices=data["cuda_visible_devices"], nproc_per_node=data["nproc_per_node"],
                   torchrun=data["torchrun"], env=dict(data["env"]) if data.get("env") is not None else None)


@dataclass(frozen=True, kw_only=True)
class LaunchInfo:
    """What every node's torchrun line shares."""

    master_addr: str | None
    master_port: int | None
    script: str | None
    plan_path: str | None = None
    """the plan file the lines name (``--plan``); None in plans written without it (then ``plan.json``)"""

    def to_json(self) -> dict:
        data: dict[str, Any] = {"master_addr": self.master_addr, "master_port": self.master_port, "script": self.script}
        if self.plan_path is not None:
            data["plan_path"] = self.plan_path
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LaunchInfo:
        return cls(master_addr=data.get("master_addr"), master_port=data.get("master_port"), script=data.get("script"),
                   plan_path=data.get("plan_path"))


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A whole plan (``batchplan/plan@1``); the field meanings are in DESIGN.md, "Interfaces"."""

    schema: str
    created: str
    """ISO 8601 UTC time the plan was made"""
    job: JobSpec
    world_size: int
    global_batch: int
    accumulate: int
    step_batch: int
    predicted_step_time_s: float
    throughput_samples_per_s: float
    balance_efficiency: float
    mode: Mode
    alternatives: dict[str, float] | None
    """throughput of the options the advice compared; None in plans written without it"""
    ranks: tuple[RankEntry, ...]
    nodes: tuple[NodeEntry, ...]
    launch: LaunchInfo | None
    excluded: tuple[ExcludedDevice, ...]
    profiles: dict[str, DeviceProfile]
    warnings: tuple[str, ...]
    """every warning, the advice sentences included"""
    balance_efficiency_range: tuple[float, float] | None = None
    """(low, high) balance efficiency to expect at real speed: each GPU type's step time off by ±1σ of the
    calibrated time model (``planner.allocate.uncertainty``); None in plans written without it"""
    notes: tuple[str, ...] = ()
    """information, not warnings: the comparison with plain DDP, an option not compared and why, what the
    balance efficiency means (``planner.allocate.advice.NOTE_KINDS``); empty in plans written without it"""
    advice: tuple[Advice, ...] = ()
    """the allocation's advice, typed (also in ``warnings``); not written to the file"""
    extra: dict[str, Any] = field(default_factory=dict)
    """further top-level fields, written after the standard ones: ``probing`` (how the plan was made),
    ``cluster``, ..."""

    def replace(self, **changes: Any) -> Plan:
        from dataclasses import replace

        return replace(self, **changes)

    def with_extra(self, **fields: Any) -> Plan:
        """This plan with more top-level fields (``probing=...``)."""
        return self.replace(extra={**self.extra, **fields})

    def to_json(self) -> dict:
        data: dict[str, Any] = {
            "schema": self.schema,
            "created": self.created,
            "job": self.job.to_json(),
            "world_size": self.world_size,
            "global_batch": self.global_batch,
            "accumulate": self.accumulate,
            "step_batch": self.step_batch,
            "predicted_step_time_s": self.predicted_step_time_s,
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "balance_efficiency": self.balance_efficiency,
        }
        if self.balance_efficiency_range is not None:
            data["balance_efficiency_range"] = list(self.balance_efficiency_range)
        data["mode"] = self.mode
        if self.alternatives is not None:
            data["alternatives"] = dict(self.alternatives)
        data["ranks"] = [r.to_json() for r in self.ranks]
        data["nodes"] = [n.to_json() for n in self.nodes]
        if self.launch is not None:
            data["launch"] = self.launch.to_json()
        data["excluded"] = [e.to_json() for e in self.excluded]
        data["profiles"] = {key: p.to_json() for key, p in self.profiles.items()}
        data["warnings"] = list(self.warnings)
        data["notes"] = list(self.notes)
        data.update(self.extra)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = "plan") -> Plan:
        """The plan of a document whose fields are of their types (``planner.plan.validate.validate_plan``
        checks them first), its identities checked (``planner.plan.derived.check_identities``).

        Raises:
            ConfigError: an identity between the fields is broken, naming ``where``.
        """
        launch = data.get("launch")
        plan = cls(
            **{name: data[name] for name in _PLAN_SCALARS},
            job=JobSpec.from_json(data["job"]),
            mode=Mode(data["mode"]),
            alternatives=dict(data["alternatives"]) if data.get("alternatives") is not None else None,
            balance_efficiency_range=(
                tuple(data["balance_efficiency_range"]) if data.get("balance_efficiency_range") is not None else None
            ),
            ranks=tuple(RankEntry.from_json(r) for r in data["ranks"]),
            nodes=tuple(NodeEntry.from_json(n) for n in data["nodes"]),
            launch=LaunchInfo.from_json(launch) if launch else None,
            excluded=tuple(ExcludedDevice.from_json(e) for e in data["excluded"]),
            profiles={k: DeviceProfile.from_json(p, where=f"{where}: profiles[{k!r}]") for k, p in data["profiles"].items()},
            warnings=tuple(data["warnings"]),
            notes=tuple(data.get("notes", ())),
            extra={k: v for k, v in data.items() if k not in _PLAN_FIELDS},
        )
        check_identities(plan, where)
        return plan


_PLAN_SCALARS = ("schema", "created", "world_size", "global_batch", "accumulate", "step_batch",
                 "predicted_step_time_s", "throughput_samples_per_s", "balance_efficiency")
_PLAN_FIELDS = frozenset(Plan.__dataclass_fields__) - {"advice", "extra"}
