"""plan.json (``batchplan/plan@1``): building a plan from devices, profiles and the allocation; writing it
atomically; reading it back with validation. Field meanings are in DESIGN.md, "Interfaces".

Ranks are numbered the way ``torchrun``'s static rendezvous numbers them: node by node (``--node-rank``),
local ranks in order, so rank r of the plan is global rank r of the job. Each node's ``CUDA_VISIBLE_DEVICES``
lists the planned devices in local-rank order with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so that CUDA's device
numbering matches NVML's (the one the probe reported).
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from planner.allocate import allocate
from planner.job import JobSpec
from planner.profile import DeviceProfile
from torchkit.errors import ConfigError

SCHEMA = "batchplan/plan@1"
DEFAULT_MASTER_PORT = 29500


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
    (``planner.busy``); its step time is the profile's divided by this"""

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
    from planner.profile import MAX_PLANNED_BATCH

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


def torchrun_command(
    *,
    nnodes: int,
    node_rank: int,
    nproc_per_node: int,
    master_addr: str,
    master_port: int,
    cuda_visible_devices: str,
    script: str,
) -> str:
    """The line to run on one node. Static rendezvous (``--node-rank`` with a master address) keeps the
    plan's rank numbering: global rank = ranks of the nodes before + local rank."""
    return (
        f"CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={cuda_visible_devices} "
        f"torchrun --nnodes {nnodes} --node-rank {node_rank} --nproc-per-node {nproc_per_node} "
        f"--master-addr {shlex.quote(master_addr)} --master-port {master_port} "
        f"{script} --plan plan.json"
    )


def write_plan(plan: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Write ``plan`` as JSON to ``path`` atomically (temporary file in the same directory, then rename)."""
    validate_plan(plan, where="plan to write")
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise ConfigError(f"cannot write the plan to {target}: {exc.strerror or exc} (choose another -o path)") from exc
    try:
        # mkstemp makes the file 0600; a plan is shared with the scheduler and the nodes: the usual 0666 & ~umask
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w") as handle:
            json.dump(plan, handle, indent=2)
            handle.write("\n")
        os.replace(tmp, target)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise ConfigError(f"cannot write the plan to {target}: {exc.strerror or exc} (choose another -o path)") from exc
        raise
    return target


def read_plan(path: str | os.PathLike) -> dict:
    """Read and validate a plan.json.

    Raises:
        ConfigError: missing file, not JSON, wrong schema, missing or mistyped fields.
    """
    source = Path(path)
    if not source.is_file():
        raise ConfigError(f"plan file {source} does not exist (create one with: batchplan plan ... -o {source})")
    try:
        plan = json.loads(source.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source} is not valid JSON: {exc} (regenerate it with batchplan plan -o {source})") from exc
    validate_plan(plan, where=str(source))
    return plan


_TOP_FIELDS: dict[str, type | tuple[type, ...]] = {
    "schema": str,
    "created": str,
    "job": dict,
    "world_size": int,
    "global_batch": int,
    "accumulate": int,
    "step_batch": int,
    "predicted_step_time_s": (int, float),
    "throughput_samples_per_s": (int, float),
    "balance_efficiency": (int, float),
    "mode": str,
    "ranks": list,
    "nodes": list,
    "excluded": list,
    "profiles": dict,
    "warnings": list,
}
_RANK_FIELDS: dict[str, type | tuple[type, ...]] = {
    "rank": int,
    "node": str,
    "node_rank": int,
    "local_rank": int,
    "device_index": int,
    "gpu": str,
    "profile": str,
    "batch": int,
    "max_batch": int,
    "loss_weight": (int, float),
    "predicted_memory_bytes": int,
    "memory_budget_bytes": int,
    "total_memory_bytes": int,
    "predicted_step_time_s": (int, float),
}
_NODE_FIELDS: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "node_rank": int,
    "cuda_visible_devices": str,
    "nproc_per_node": int,
    "torchrun": str,
}


def _check_fields(obj: Any, fields: Mapping[str, type | tuple[type, ...]], where: str) -> None:
    if not isinstance(obj, dict):
        raise ConfigError(f"{where} must be an object, got {type(obj).__name__}")
    for name, kind in fields.items():
        if name not in obj:
            raise ConfigError(f"{where} lacks the field '{name}' (regenerate the plan with batchplan plan)")
        value = obj[name]
        if isinstance(value, bool) or not isinstance(value, kind):
            expected = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
            raise ConfigError(f"{where}.{name} must be {expected}, got {value!r}")


def validate_plan(plan: Any, where: str = "plan") -> None:
    """Check the schema and the fields a scheduler and the runtime read, and their consistency."""
    if not isinstance(plan, dict):
        raise ConfigError(f"{where} must be a JSON object, got {type(plan).__name__}")
    if plan.get("schema") != SCHEMA:
        raise ConfigError(
            f"{where} has schema {plan.get('schema')!r}, expected {SCHEMA!r} (is it a batchplan plan?)"
        )
    _check_fields(plan, _TOP_FIELDS, where)
    for i, rank in enumerate(plan["ranks"]):
        _check_fields(rank, _RANK_FIELDS, f"{where}: ranks[{i}]")
        if rank["rank"] != i:
            raise ConfigError(f"{where}: ranks[{i}].rank is {rank['rank']}, expected {i} (ranks must be in order)")
        if rank["profile"] not in plan["profiles"]:
            raise ConfigError(f"{where}: ranks[{i}].profile {rank['profile']!r} is not a key of profiles")
        if rank["batch"] < 1:
            raise ConfigError(f"{where}: ranks[{i}].batch must be >= 1, got {rank['batch']}")
    for i, node in enumerate(plan["nodes"]):
        _check_fields(node, _NODE_FIELDS, f"{where}: nodes[{i}]")
    if plan["world_size"] != len(plan["ranks"]):
        raise ConfigError(f"{where}: world_size {plan['world_size']} != number of ranks {len(plan['ranks'])}")
    step = sum(r["batch"] for r in plan["ranks"])
    if step != plan["step_batch"]:
        raise ConfigError(f"{where}: step_batch {plan['step_batch']} != sum of rank batches {step}")
    if plan["global_batch"] != plan["step_batch"] * plan["accumulate"]:
        raise ConfigError(f"{where}: global_batch != step_batch × accumulate")
    if sum(n["nproc_per_node"] for n in plan["nodes"]) != plan["world_size"]:
        raise ConfigError(f"{where}: nodes' nproc_per_node do not add up to world_size")
    for key, profile in plan["profiles"].items():
        DeviceProfile.from_json(profile, where=f"{where}: profiles[{key!r}]")
