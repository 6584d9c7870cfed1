"""The sections a plan gains after its standard fields, declared once (``planner.codec`` reads and writes them):

- ``comm`` (:class:`CommSection`): the gradient synchronisation the plan priced (``planner.plan.comm``): the
  model's gradient bytes and DDP buckets, the ring's links with their sources, the exposed time and its range;
- ``probing`` (:class:`ProbingInfo`): how the plan was made (backend, probes, timings), for people;
- ``measured`` (:class:`MeasuredSection`): what a re-balanced run measured (``planner.runtime.rebalance``): its
  steps (:class:`StepMeasure`), its switches (:class:`Switch`), each rank's refitted curve, the exposed
  synchronisation it filed for the next plan (:class:`FiledSync`) and, in the re-balanced plan, what the plan
  had said of its own batches (:class:`PlannedFigures`).

A field added to a section is an edit to its dataclass here; a plan written before a section existed simply
lacks it (each is optional in ``planner.plan.types.Plan``). Pure Python: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from planner.codec import FLATTENED, NOT_WRITTEN, OMIT_DEFAULT, Meta
from planner.profiles.measured_sync import JobSync
from torchkit.step.fit import AffineTimeFit

Seconds = Annotated[float, Meta(ge=0)]
Count = Annotated[int, Meta(ge=0)]


@dataclass(frozen=True, kw_only=True)
class LinkHop:
    """A link class the ring crosses, with the figures the model priced it at."""

    hop: str
    """``intra <node>`` or ``network <node>``"""
    link: str
    """the link's name (``nvlink``, ``pcie4``, ``network``, ...)"""
    bus_bytes_per_s: Annotated[float, Meta(gt=0)]
    step_latency_s: Seconds
    source: str
    """where the figures come from: the config, the catalog, an assumed default, or measured"""


@dataclass(frozen=True, kw_only=True)
class CommSection:
    """plan.json's ``comm``: the gradient synchronisation of one optimizer step (``planner.plan.comm``)."""

    gradient_bytes: Count
    num_gradient_tensors: Count
    bucket_cap_mb: float | None
    """the job's ``bucket_cap_mb`` (None: DDP's default)"""
    bucket_bytes: tuple[int, ...]
    """DDP's buckets in launch order"""
    num_ranks: Count
    num_nodes: Count
    links: tuple[LinkHop, ...]
    bottleneck: str | None
    """the hop with the least bandwidth; None for one rank"""
    allreduce_s: Seconds
    exposed_s: Seconds
    """synchronisation the backward pass does not hide, per optimizer step"""
    exposed_range_s: tuple[Seconds, Seconds]
    """from full overlap (the model's figure) to none"""
    compute_s: Seconds
    exposed_share: Seconds
    backward_share: float
    backward_share_source: str
    gradients_source: str
    measured: str
    """what the probes measured of the links, or why nothing"""
    ring_shape: str
    """what a measured synchronisation must match to answer this ring (``planner.plan.comm.ring_shape``)"""
    slowdown: float
    """every all-reduce of the ring at this many times the links' time (1: the model's)"""
    exposed_source: str
    job_sync: JobSync | None
    """what a real run of this job on this ring measured, where one did"""


@dataclass(frozen=True, kw_only=True)
class ProbingInfo:
    """plan.json's ``probing``: how the plan was made; for people and tests, no program decides on it."""

    probes_imported_torch: int | None = field(default=None, metadata=OMIT_DEFAULT)
    backend: str
    """``local`` (in this process), ``ray`` or ``autobatch_ddp`` (in the running job)"""
    simulated: bool
    raylets: int | None = field(default=None, metadata=OMIT_DEFAULT)
    probe_processes: int | None = field(default=None, metadata=OMIT_DEFAULT)
    shared_probes: bool | None = field(default=None, metadata=OMIT_DEFAULT)
    profile_calls: int | None = field(default=None, metadata=OMIT_DEFAULT)
    timings_s: dict[str, float] | None = field(default=None, metadata=OMIT_DEFAULT)
    """seconds of each stage (probe, profile, allocate)"""


@dataclass(frozen=True, kw_only=True)
class StepMeasure:
    """One measured optimizer step, gathered from all ranks (index = rank); ``measured.step_times`` lists them."""

    step: int
    """optimizer step number, from 1"""
    batches: tuple[int, ...]
    """samples each rank took in each micro-step of this step"""
    compute_s: tuple[float, ...]
    """each rank's own compute time for the step (forward+backward, without the all-reduce wait)"""
    sync_wait_s: tuple[float, ...] | None = None
    """each rank's synchronisation wait in the step: from its last gradient bucket being ready to the end of
    its backward (waiting for slower ranks, plus communication not hidden behind compute)"""
    peak_bytes: tuple[int, ...] | None = field(default=None, metadata=NOT_WRITTEN)
    """each rank's peak reserved device memory in the step (GPU only; in the file: ``measured.ranks``)"""


@dataclass(frozen=True, kw_only=True)
class Switch:
    """One change of the split: a re-balancing decision or the roll-back of one."""

    decided_at_step: int
    """optimizer step after which it was decided"""
    position: tuple[int, int] = field(default=(0, 0), metadata=NOT_WRITTEN)
    """(sampler pass, micro-step) from which the new split is used (in the running job only)"""
    batches: tuple[int, ...]
    predicted_step_s: float
    """step time of the new split: predicted (a decision), or as measured before (a roll-back)"""
    previous_step_s: float
    """step time of the old split: under the same curves (a decision), or as measured (a roll-back)"""
    kind: str = "refit"
    """``refit``, ``bounded step`` (``planner.runtime.rebalance_model.Decision.reason``) or ``rollback``"""


@dataclass(frozen=True, kw_only=True)
class MeasuredRank:
    """One rank's measured compute times and peaks, and the curve refitted to them."""

    rank: int
    gpu: str
    time_points: tuple[tuple[int, float], ...]
    """(batch, median compute seconds)"""
    time_fit: AffineTimeFit
    peak_reserved_points: tuple[tuple[int, int], ...]
    """(batch, peak reserved bytes); empty where nothing was measured (CPU)"""


@dataclass(frozen=True, kw_only=True)
class FiledSync:
    """``measured.sync``: the exposed synchronisation the run measured, filed for the next plan of the same
    job on the same ring, or why nothing was filed."""

    ring_shape: str | None
    """the ring the measurement answers; None: nothing filed"""
    why: str | None = field(default=None, metadata=OMIT_DEFAULT)
    """why nothing was filed (a simulated run, one rank, no comm section, no wait recorded)"""
    filed: JobSync | None = field(default=None, metadata=FLATTENED)
    """what was filed (its fields sit beside ``ring_shape``)"""


@dataclass(frozen=True, kw_only=True)
class PlannedFigures:
    """``measured.planned``: what the plan said of the batches it planned, before a re-balanced run replaced them
    (``planner.runtime.rebalance_feedback.updated_plan``); kept aside, not re-judged at the measured speeds."""

    batches: tuple[int, ...]
    balance_efficiency: float
    alternatives: dict[str, float] | None
    """throughput of the options the plan compared; None where it compared none"""
    notes: tuple[str, ...]
    warnings: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class MeasuredSection:
    """plan.json's ``measured``: what a re-balanced run measured (``planner.runtime.rebalance_feedback``)."""

    source: str
    """the module that wrote it"""
    created: str
    """ISO 8601 UTC time of the run's feedback"""
    steps: int
    measured_steps: int
    switches: tuple[Switch, ...]
    steps_to_balance: int
    batches_first: tuple[int, ...]
    batches_last: tuple[int, ...]
    max_idle_first: float | None
    max_idle_last: float | None
    step_time_first_s: float | None
    step_time_last_s: float | None
    rollbacks: int
    watch_overhead: float | None
    compute_s_last: tuple[float, ...] | None
    sync_wait_s_last: tuple[float, ...] | None
    simulated: str | None
    """what the run simulated (its times are then the simulation's), or None for a real run"""
    sync: FiledSync | None
    marks: dict[str, str]
    """what the run is marked with besides its key: the model, the software, the link"""
    ranks: tuple[MeasuredRank, ...]
    step_times: tuple[StepMeasure, ...]
    """the latest measured steps (``planner.runtime.rebalance_feedback.MAX_STEPS_LISTED``)"""
    planned: PlannedFigures | None = field(default=None, metadata=OMIT_DEFAULT)
    """what the plan said of its own batches, in a re-balanced plan; None in the run's section and in plans
    written without it"""
