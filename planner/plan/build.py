"""Building a plan from devices, profiles and the allocation (``planner.plan.io`` writes and reads it; field
meanings are in DESIGN.md, "Interfaces").

Ranks are numbered the way ``torchrun``'s static rendezvous numbers them: node by node (``--node-rank``),
local ranks in order, so rank r of the plan is global rank r of the job. Each node's ``CUDA_VISIBLE_DEVICES``
lists the planned devices in local-rank order with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so that CUDA's device
numbering matches NVML's (the one the probe reported).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone

from planner.allocate.allocation import Allocation, allocate
from planner.allocate.uncertainty import balance_efficiency_range
from planner.errors import InfeasiblePlanError, NoGpuError
from planner.job import JobSpec
from planner.plan.comm import SyncInputs, plan_comm_fields, sync_model
from planner.plan.derived import loss_weight_of, rank_time_fit
from planner.plan.launch import DEFAULT_MASTER_PORT, DEFAULT_PLAN_PATH, DEFAULT_SCRIPT, NodeLaunch
from planner.plan.types import (
    SCHEMA,
    ExcludedDevice,
    ExclusionKind,
    LaunchInfo,
    NodeEntry,
    Plan,
    RankEntry,
    RankSlot,
)
from planner.profiles.profile import MAX_PLANNED_BATCH, DeviceProfile
from torchkit.step.fit import AffineTimeFit


def build_plan(
    job: JobSpec,
    slots: Sequence[RankSlot],
    profiles: Mapping[str, DeviceProfile],
    *,
    excluded: Sequence[ExcludedDevice] = (),
    warnings: Sequence[str] = (),
    notes: Sequence[str] = (),
    node_addresses: Mapping[str, str] | None = None,
    master_port: int = DEFAULT_MASTER_PORT,
    script: str = DEFAULT_SCRIPT,
    plan_path: str = DEFAULT_PLAN_PATH,
    cluster: str | None = None,
    sync: SyncInputs | None = None,
) -> Plan:
    """Allocate per-rank batches over ``slots`` and assemble the plan.

    Args:
        slots, profiles: candidate devices in node order (the nodes' ``--node-rank`` order); every profile they name.
        excluded, warnings, notes: said upstream (devices left out with reasons); the plan adds its own.
        node_addresses: host name or IP per node for ``--master-addr`` (default: the node name).
        script, plan_path: the training script and the plan file the launch lines name (``--plan``).
        cluster: what the plan is made for (a config's name, a Ray address), e.g. for a plot's title.
        sync: the gradient synchronisation's inputs (``planner.plan.comm``); None: the step is compute only.

    Raises:
        InfeasiblePlanError: no device fits the minimum batch, or the global batch is unreachable.
    """
    slots = _node_ordered(slots, excluded)
    caps = [profiles[s.profile].max_batch(s.memory_budget_bytes, job.multiple_of) for s in slots]
    # each rank's own curve
    fits = [rank_time_fit(profiles[s.profile].time_fit, s.speed_factor) for s in slots]
    allocation = _allocate(job, slots, fits, caps, sync)
    efficiency_range = _expected_balance_range(slots, profiles, fits, caps, allocation, job.multiple_of)
    all_excluded = list(excluded) + _below_min_batch(slots, allocation)
    included = [slots[i] for i in range(len(slots)) if allocation.included[i]]
    ranks = _included_rank_entries(slots, caps, fits, allocation, profiles)
    addresses = dict(node_addresses or {})
    master_addr = addresses.get(ranks[0].node, ranks[0].node)
    used_profiles = sorted({s.profile for s in slots})
    comm, comm_warnings, comm_notes = plan_comm_fields(included, allocation, sync)
    # the notes of the profiles the ranks use: a GPU type left out whole (below --min-batch) warns of nothing
    rank_profiles = [profiles[k] for k in sorted({s.profile for s in included})]
    return Plan(
        schema=SCHEMA,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        job=job,
        world_size=len(ranks),
        global_batch=int(allocation.global_batch),
        accumulate=int(allocation.accumulate),
        step_batch=int(allocation.step_batch),
        predicted_step_time_s=float(allocation.step_time_s),
        throughput_samples_per_s=float(allocation.throughput_samples_per_s),
        balance_efficiency=float(allocation.balance_efficiency),
        balance_efficiency_range=(float(efficiency_range[0]), float(efficiency_range[1])),
        mode=job.mode,
        alternatives={k: float(v) for k, v in allocation.alternatives.items()},
        ranks=tuple(ranks),
        nodes=_node_entries(ranks, included, addresses, master_addr, master_port, script, plan_path),
        launch=LaunchInfo(
            master_addr=master_addr, master_port=master_port, script=script, plan_path=plan_path
        ),
        excluded=tuple(all_excluded),
        profiles={key: profiles[key] for key in used_profiles},
        warnings=tuple(_plan_warnings([*warnings, *comm_warnings], rank_profiles, allocation, caps)),
        notes=(*notes, *allocation.notes, *comm_notes),
        advice=allocation.advice,
        predicted_comm_time_s=allocation.sync_time_s if comm is not None else None,
        comm=comm,
        cluster=cluster,
    )


def _node_ordered(slots: Sequence[RankSlot], excluded: Sequence[ExcludedDevice]) -> list[RankSlot]:
    """``slots`` with each node's devices together, nodes in the order they first appear: torchrun's static
    rendezvous numbers ranks node by node."""
    first_seen = {node: i for i, node in reversed(list(enumerate(s.node for s in slots)))}
    ordered = sorted(slots, key=lambda s: first_seen[s.node])
    if not ordered:
        if not excluded:
            raise NoGpuError("no usable GPU to plan on (no GPUs found)")
        reasons = "; ".join(f"{e.node}[{e.device_index}]: {e.reason}" for e in excluded)
        raise InfeasiblePlanError(f"no usable GPU to plan on ({reasons})")
    return ordered


def _allocate(
    job: JobSpec,
    slots: Sequence[RankSlot],
    fits: Sequence[AffineTimeFit],
    caps: Sequence[int],
    sync: SyncInputs | None = None,
) -> Allocation:
    """The job's allocation over ``slots``, each device at its own time curve ``fits``, plus the gradient
    synchronisation of the ranks taking part."""
    return allocate(
        caps,
        [fit.intercept_s for fit in fits],
        [fit.s_per_sample for fit in fits],
        mode=job.mode,
        global_batch=job.global_batch,
        multiple_of=job.multiple_of,
        min_batch=job.min_batch,
        groups=[s.group for s in slots],  # advice names GPU types, never profile keys
        sync=sync_model(slots, sync) if sync is not None else None,
    )


def _expected_balance_range(
    slots: Sequence[RankSlot],
    profiles: Mapping[str, DeviceProfile],
    fits: Sequence[AffineTimeFit],
    caps: Sequence[int],
    allocation: Allocation,
    multiple_of: int,
) -> tuple[float, float]:
    """The allocation's balance efficiency when each GPU type's step time is off by ±1σ of its profile's time
    model (``planner.allocate.uncertainty``), every device at its own curve ``fits`` (the one the allocation
    used); caps rounded down to ``multiple_of`` as the bound is."""
    return balance_efficiency_range(
        [fit.intercept_s for fit in fits],
        [fit.s_per_sample for fit in fits],
        [cap // multiple_of * multiple_of for cap in caps],
        allocation.batches,
        allocation.included,
        [profiles[s.profile].time_log_sigma for s in slots],
        [profiles[s.profile].gpu for s in slots],
        sync_s=allocation.sync_time_s,
        accumulate=allocation.accumulate,
    )


def _below_min_batch(slots: Sequence[RankSlot], allocation: Allocation) -> list[ExcludedDevice]:
    """The devices the allocation left out (a cap below the minimum batch), each with its reason."""
    return [
        ExcludedDevice(
            node=slots[i].node,
            device_index=slots[i].device_index,
            gpu=slots[i].gpu,
            reason=reason,
            kind=ExclusionKind.BELOW_MIN_BATCH,
        )
        for i, reason in sorted(allocation.excluded_reasons.items())
    ]


def _included_rank_entries(
    slots: Sequence[RankSlot],
    caps: Sequence[int],
    fits: Sequence[AffineTimeFit],
    allocation: Allocation,
    profiles: Mapping[str, DeviceProfile],
) -> list[RankEntry]:
    """The rank entries of the slots the allocation included (``_rank_entries``), from the per-slot ``caps``
    and ``fits`` and the allocation's per-slot batches and idle fractions."""
    included = [slots[i] for i in range(len(slots)) if allocation.included[i]]
    return _rank_entries(
        included,
        [caps[i] for i in range(len(slots)) if allocation.included[i]],
        [fits[i] for i in range(len(slots)) if allocation.included[i]],
        [int(b) for b, inc in zip(allocation.batches, allocation.included, strict=True) if inc],
        [float(f) for f, inc in zip(allocation.idle_fraction, allocation.included, strict=True) if inc],
        profiles,
        allocation.step_batch,
    )


def _rank_entries(
    slots: Sequence[RankSlot],
    caps: Sequence[int],
    fits: Sequence[AffineTimeFit],
    batches: Sequence[int],
    idle_fractions: Sequence[float],
    profiles: Mapping[str, DeviceProfile],
    step_batch: int,
) -> list[RankEntry]:
    """One entry per included slot, numbered as torchrun will: node by node, local ranks in order."""
    node_order = list(dict.fromkeys(s.node for s in slots))
    world_size = len(slots)
    local_counts: dict[str, int] = {}
    ranks = []
    node_ranks = {node: i for i, node in enumerate(node_order)}
    for rank, (slot, cap, fit, batch, idle) in enumerate(
        zip(slots, caps, fits, batches, idle_fractions, strict=True)
    ):
        profile = profiles[slot.profile]
        local_rank = local_counts.get(slot.node, 0)
        local_counts[slot.node] = local_rank + 1
        ranks.append(
            RankEntry(
                rank=rank,
                node=slot.node,
                node_rank=node_ranks[slot.node],
                local_rank=local_rank,
                device_index=slot.device_index,
                gpu=slot.gpu,
                profile=slot.profile,
                batch=batch,
                max_batch=int(cap),
                loss_weight=loss_weight_of(batch, world_size, step_batch),
                predicted_memory_bytes=profile.memory_bytes(batch),
                memory_budget_bytes=int(slot.memory_budget_bytes),
                total_memory_bytes=int(slot.total_memory_bytes),
                predicted_step_time_s=fit.predict_s(batch),
                idle_fraction=idle,
                speed_factor=float(slot.speed_factor),
            )
        )
    return ranks


def _node_entries(
    ranks: Sequence[RankEntry],
    slots: Sequence[RankSlot],
    addresses: Mapping[str, str],
    master_addr: str,
    master_port: int,
    script: str,
    plan_path: str,
) -> tuple[NodeEntry, ...]:
    """Each node with its CUDA_VISIBLE_DEVICES (its ranks' devices in local-rank order), its torchrun line and
    its environment, built from checked values (``planner.plan.launch.NodeLaunch``)."""
    devices: dict[
        str, list[str]
    ] = {}  # node -> its ranks' devices in local-rank order (dicts keep node order)
    for r in ranks:
        devices.setdefault(r.node, []).append(slots[r.rank].visible_id or str(r.device_index))
    nodes = []
    for node_rank, (name, node_devices) in enumerate(devices.items()):
        launch = NodeLaunch(
            nnodes=len(devices),
            node_rank=node_rank,
            nproc_per_node=len(node_devices),
            master_addr=master_addr,
            master_port=master_port,
            cuda_visible_devices=",".join(node_devices),
            script=script,
            plan_path=plan_path,
        )
        nodes.append(
            NodeEntry(
                name=name,
                node_rank=node_rank,
                address=addresses.get(name, name),
                cuda_visible_devices=launch.cuda_visible_devices,
                nproc_per_node=launch.nproc_per_node,
                torchrun=launch.torchrun_line(),
                env=launch.env(),
            )
        )
    return tuple(nodes)


def _plan_warnings(
    warnings: Sequence[str],
    used_profiles: Sequence[DeviceProfile],
    allocation: Allocation,
    caps: Sequence[int],
) -> list[str]:
    """The caller's warnings, the profiles' notes (once each), the allocation's advice, the batch bound."""
    all_warnings = list(warnings)
    for profile in used_profiles:
        all_warnings.extend(n for n in profile.notes if n not in all_warnings)
    all_warnings.extend(allocation.advice)
    if any(cap >= MAX_PLANNED_BATCH for cap in caps):
        all_warnings.append(
            f"some caps reach {MAX_PLANNED_BATCH}, the largest per-rank batch batchplan plans: the model is tiny "
            "for these GPUs, and the plan is limited by that bound rather than by memory"
        )
    return all_warnings
