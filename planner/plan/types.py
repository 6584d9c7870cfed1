"""The plan, declared once: ``Plan`` (``batchplan/plan@1``) with its ``RankEntry``/``NodeEntry``/``LaunchInfo``/
``ExcludedDevice`` parts and its sections (``planner.plan.sections``), the devices that may become ranks
(``RankSlot``) and why one is left out (``ExclusionKind``).

The dataclasses are the document: ``planner.codec`` reads plan.json into them and writes them back, fields in
declared order, bounds and patterns from their annotations; a field added after the first release is omitted
while it holds its default, so older files read and write back as they were. Constructing a ``Plan`` checks
the identities between its fields (``planner.plan.derived.check_identities``), once, whoever constructs it:
the builder, the reader, the re-balancer. ``Plan.advice`` (the allocation's advice, typed; its sentences are
also in ``warnings``) is in the program only; ``Plan.extra`` keeps the top-level keys of a newer writer.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Annotated, Any, Literal

from planner.allocate.advice import Advice
from planner.codec import NOT_WRITTEN, OMIT_DEFAULT, UNKNOWN_KEYS, Meta
from planner.job import JobSpec, Mode
from planner.plan.derived import check_identities
from planner.plan.launch import HOST, NODE_NAME
from planner.plan.sections import CommSection, MeasuredSection, ProbingInfo
from planner.profiles.profile import DeviceProfile

SCHEMA = "batchplan/plan@1"
#: most ranks a plan may hold: 65,536 GPUs is beyond any job this planner is meant for, and bounds the
#: work a hostile plan can cause
MAX_PLAN_RANKS = 65_536
#: largest per-rank batch, accumulation or byte count a plan may hold (2^53: exact in a JSON double)
MAX_COUNT = 2**53
#: most options ``alternatives`` may compare, and most lines in ``warnings`` or ``notes``: far above what the
#: planner writes (5 options; a few dozen lines), a bound for hostile files
MAX_ALTERNATIVES = 64
MAX_LINES = 65_536

Count = Annotated[int, Meta(ge=0, le=MAX_COUNT)]
Positive = Annotated[int, Meta(ge=1, le=MAX_COUNT)]
NonNegative = Annotated[float, Meta(ge=0)]
Share = Annotated[float, Meta(ge=0, le=1)]
Line = Annotated[str, Meta(description="be a string")]
Lines = Annotated[tuple[Line, ...], Meta(max_length=MAX_LINES)]
NodeName = Annotated[
    str,
    Meta(
        pattern=rf"\A(?:{NODE_NAME.pattern})\Z",
        description=(
            "be a node name (letters, digits, '.', '_' and '-', starting with a letter or digit, at most 253 characters)"
        ),
    ),
]
Host = Annotated[str, Meta(pattern=rf"\A(?:{HOST.pattern})\Z", description="be a host name or IP address")]


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
    """A device (or a whole node) the plan leaves out, and why."""

    node: str
    device_index: int | None = None
    """None when the whole node is left out"""
    gpu: str | None = None
    reason: str
    """one line for people; programs read ``kind``"""
    kind: ExclusionKind | None = field(default=None, metadata=OMIT_DEFAULT)
    """what kind of reason; None in plans written without it"""


@dataclass(frozen=True, kw_only=True)
class RankEntry:
    """One rank of the plan: where it runs and its share of every step."""

    rank: Count
    node: NodeName
    node_rank: Count
    local_rank: Count
    device_index: Count
    gpu: str
    profile: str
    """key of its profile in ``Plan.profiles``"""
    batch: Positive
    max_batch: Count
    loss_weight: float
    """``batch · world_size / step_batch`` (``planner.plan.derived.loss_weight_of``)"""
    predicted_memory_bytes: Count
    memory_budget_bytes: Count
    total_memory_bytes: Count
    predicted_step_time_s: Annotated[float, Meta(gt=0)]
    idle_fraction: Annotated[float, Meta(ge=0, le=1, description="be a share in [0, 1]")] | None = field(
        default=None, metadata=OMIT_DEFAULT
    )
    """share of a step this rank waits for the slowest; None in plans written without it"""
    speed_factor: Annotated[
        float, Meta(gt=0, le=1, description="be a share of the profiled speed in (0, 1]")
    ] = 1.0
    """share of the profiled speed the rank gets on its GPU (below 1 where other work keeps it busy:
    ``planner.probing.busy``); ``predicted_step_time_s`` is the profile's time divided by it"""


@dataclass(frozen=True, kw_only=True)
class NodeEntry:
    """One node of the plan and the line that starts its ranks."""

    name: NodeName
    node_rank: Count
    address: Host | None = field(default=None, metadata=OMIT_DEFAULT)
    """host name or IP for ``--master-addr``; None in plans written without it (then the node's name)"""
    cuda_visible_devices: str
    nproc_per_node: Annotated[int, Meta(ge=1, le=MAX_PLAN_RANKS)]
    torchrun: str
    env: Annotated[dict[str, str], Meta(description="map names to strings")] | None = field(
        default=None, metadata=OMIT_DEFAULT
    )
    """the node's launch environment (``--emit env``); None in plans written without it"""


@dataclass(frozen=True, kw_only=True)
class LaunchInfo:
    """What every node's torchrun line shares."""

    master_addr: Host
    master_port: int
    script: str
    plan_path: str | None = field(default=None, metadata=OMIT_DEFAULT)
    """the plan file the lines name (``--plan``); None in plans written without it (then ``plan.json``)"""


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A whole plan (``batchplan/plan@1``); the field meanings are in DESIGN.md, "Interfaces"."""

    schema: Annotated[
        Literal["batchplan/plan@1"], Meta(description=f"be {SCHEMA!r} (is it a batchplan plan?)")
    ]
    created: str
    """ISO 8601 UTC time the plan was made"""
    job: JobSpec
    world_size: Annotated[int, Meta(ge=1, le=MAX_PLAN_RANKS)]
    global_batch: Annotated[int, Meta(le=MAX_COUNT)]
    """``step_batch × accumulate`` (so >= 0: ``planner.plan.derived``); a bad ``accumulate`` is named, not it"""
    accumulate: Annotated[
        int, Meta(ge=1, le=MAX_COUNT, description="be >= 1 (micro-steps per optimizer step)")
    ]
    step_batch: Count
    predicted_step_time_s: NonNegative
    """the slowest rank's compute plus the exposed synchronisation per optimizer step, shared over its micro-steps"""
    throughput_samples_per_s: NonNegative
    balance_efficiency: NonNegative
    balance_efficiency_range: (
        Annotated[tuple[Share, Share], Meta(description="be [low, high] with 0 <= low <= high <= 1")] | None
    ) = field(default=None, metadata=OMIT_DEFAULT)
    """(low, high) balance efficiency to expect at real speed: each GPU type's step time off by ±1σ of the
    calibrated time model (``planner.allocate.uncertainty``); None in plans written without it"""
    mode: Mode
    alternatives: (
        Annotated[
            dict[
                str, Annotated[float, Meta(ge=0, description="be a throughput in samples/s (a number >= 0)")]
            ],
            Meta(max_length=MAX_ALTERNATIVES),
        ]
        | None
    ) = field(default=None, metadata=OMIT_DEFAULT)
    """throughput of the options the advice compared; None in plans written without it"""
    ranks: tuple[RankEntry, ...]
    nodes: tuple[NodeEntry, ...]
    launch: LaunchInfo
    excluded: tuple[ExcludedDevice, ...]
    profiles: dict[str, DeviceProfile]
    warnings: Lines
    """every warning, the advice sentences included"""
    notes: Lines = ()
    """information, not warnings: the comparison with plain DDP, an option not compared and why, what the
    balance efficiency means (``planner.allocate.advice.NOTE_KINDS``); empty in plans written without it"""
    predicted_comm_time_s: NonNegative | None = field(default=None, metadata=OMIT_DEFAULT)
    """exposed gradient synchronisation per optimizer step (``comm``); None in plans written without the model"""
    comm: CommSection | None = field(default=None, metadata=OMIT_DEFAULT)
    cluster: str | None = field(default=None, metadata=OMIT_DEFAULT)
    """what the plan was made for: the config's name, or the Ray address"""
    probing: ProbingInfo | None = field(default=None, metadata=OMIT_DEFAULT)
    measured: MeasuredSection | None = field(default=None, metadata=OMIT_DEFAULT)
    """what a re-balanced run of the plan measured; its ranks' times are then the measured ones"""
    advice: tuple[Advice, ...] = field(default=(), metadata=NOT_WRITTEN)
    """the allocation's advice, typed (also in ``warnings``); empty in a plan read from a file"""
    extra: dict[str, Any] = field(default_factory=dict, metadata=UNKNOWN_KEYS)
    """top-level keys a newer batchplan wrote and this one does not know: kept, and written back"""

    def __post_init__(self) -> None:
        check_identities(self)

    def replace(self, **changes: Any) -> Plan:
        """This plan with ``changes`` (its identities checked again)."""
        return replace(self, **changes)
