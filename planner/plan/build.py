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
from typing import Any

from planner.allocate.allocation import allocate
from planner.job import JobSpec
from planner.plan.io import SCHEMA
from planner.plan.launch import DEFAULT_MASTER_PORT, torchrun_command
from planner.plan.types import ExcludedDevice, RankSlot
from planner.profiles.profile import DeviceProfile


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
    script: str = "train.py",
    extra: Mapping[str, Any] | None = None,
) -> dict:
    """Allocate per-rank batches over ``slots`` and assemble the plan.json document.

    Args:
        slots: candidate devices in node order (the order nodes will get ``--node-rank``).
        profiles: every profile a slot names.
        excluded: devices already left out upstream (busy, probe failed), with reasons.
        warnings, notes: said upstream; the plan adds its own after them.
        node_addresses: host name or IP per node for ``--master-addr`` (default: the node name).
        extra: more top-level fields (e.g. ``cluster``), written after the standard ones.

    Raises:
        InfeasiblePlanError: no device fits the minimum batch, or the global batch is unreachable.
    """
    # torchrun's static rendezvous numbers ranks node by node: keep each node's devices together, nodes in
    # the order they first appear
    first_seen = {node: i for i, node in reversed(list(enumerate(s.node for s in slots)))}
    slots = sorted(slots, key=lambda s: first_seen[s.node])
    if not slots:
        from planner.errors import InfeasiblePlanError

        reasons = "; ".join(f"{e.node}[{e.device_index}]: {e.reason}" for e in excluded) or "no GPUs found"
        raise InfeasiblePlanError(f"no usable GPU to plan on ({reasons})")
    caps = [profiles[s.profile].max_batch(s.memory_budget_bytes, job.multiple_of) for s in slots]
    allocation = allocate(
        caps,
        [profiles[s.profile].time_fit.intercept_s / s.speed_factor for s in slots],
        [profiles[s.profile].time_fit.s_per_sample / s.speed_factor for s in slots],
        mode=job.mode,
        global_batch=job.global_batch,
        multiple_of=job.multiple_of,
        min_batch=job.min_batch,
        groups=[s.group for s in slots],  # advice names GPU types, never profile keys
    )
    all_excluded = [e.to_json() for e in excluded]
    for index, reason in sorted(allocation.excluded_reasons.items()):
        slot = slots[index]
        all_excluded.append(
            ExcludedDevice(node=slot.node, device_index=slot.device_index, gpu=slot.gpu, reason=reason).to_json()
        )

    included = [i for i in range(len(slots)) if allocation.included[i]]
    node_order: list[str] = []
    for i in included:
        if slots[i].node not in node_order:
            node_order.append(slots[i].node)
    world_size = len(included)
    ranks = []
    local_counts: dict[str, int] = {}
    for rank, i in enumerate(included):
        slot = slots[i]
        profile = profiles[slot.profile]
        batch = int(allocation.batches[i])
        local_rank = local_counts.get(slot.node, 0)
        local_counts[slot.node] = local_rank + 1
        ranks.append(
            {
                "rank": rank,
                "node": slot.node,
                "node_rank": node_order.index(slot.node),
                "local_rank": local_rank,
                "device_index": slot.device_index,
                "gpu": slot.gpu,
                "profile": slot.profile,
                "batch": batch,
                "max_batch": int(caps[i]),
                "loss_weight": batch * world_size / allocation.step_batch,
                "predicted_memory_bytes": profile.memory_bytes(batch),
                "memory_budget_bytes": int(slot.memory_budget_bytes),
                "total_memory_bytes": int(slot.total_memory_bytes),
                "predicted_step_time_s": profile.step_time_s(batch) / slot.speed_factor,
                "idle_fraction": float(allocation.idle_fraction[i]),
                "speed_factor": float(slot.speed_factor),
            }
        )

    addresses = dict(node_addresses or {})
    master_addr = addresses.get(node_order[0], node_order[0])
    nodes = []
    for node_rank, name in enumerate(node_order):
        node_ranks = [r for r in ranks if r["node"] == name]
        visible = [slots[included[r["rank"]]].visible_id or str(r["device_index"]) for r in node_ranks]
        nodes.append(
            {
                "name": name,
                "node_rank": node_rank,
                "address": addresses.get(name, name),
                "cuda_visible_devices": ",".join(visible),
                "nproc_per_node": len(node_ranks),
                "torchrun": torchrun_command(
                    nnodes=len(node_order),
                    node_rank=node_rank,
                    nproc_per_node=len(node_ranks),
                    master_addr=master_addr,
                    master_port=master_port,
                    cuda_visible_devices=",".join(visible),
                    script=script,
                ),
            }
        )

    used_profiles = {s.profile for s in slots}
    all_warnings = list(warnings)
    for key in sorted(used_profiles):
        all_warnings.extend(n for n in profiles[key].notes if n not in all_warnings)
    all_warnings.extend(allocation.advice)
    from planner.profiles.profile import MAX_PLANNED_BATCH

    if any(cap >= MAX_PLANNED_BATCH for cap in caps):
        all_warnings.append(
            f"some caps reach {MAX_PLANNED_BATCH}, the largest per-rank batch batchplan plans: the model is tiny "
            "for these GPUs, and the plan is limited by that bound rather than by memory"
        )
    plan = {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "job": job.to_json(),
        "world_size": world_size,
        "global_batch": int(allocation.global_batch),
        "accumulate": int(allocation.accumulate),
        "step_batch": int(allocation.step_batch),
        "predicted_step_time_s": float(allocation.step_time_s),
        "throughput_samples_per_s": float(allocation.throughput_samples_per_s),
        "balance_efficiency": float(allocation.balance_efficiency),
        "mode": job.mode,
        "alternatives": {k: float(v) for k, v in allocation.alternatives.items()},
        "ranks": ranks,
        "nodes": nodes,
        "launch": {"master_addr": master_addr, "master_port": master_port, "script": script},
        "excluded": all_excluded,
        "profiles": {key: profiles[key].to_json() for key in sorted(used_profiles)},
        "warnings": all_warnings,
        "notes": [*notes, *allocation.notes],
    }
    plan.update(extra or {})
    return plan
