"""Heterogeneous AutoBatch inside a running DDP job (no Ray): every rank ends up with its own batch and loss
weight, from one plan that all ranks compute identically.

Steps, inside an initialised process group:
1. every rank says who it is: node, local rank, GPU type, memory available (``all_gather_object``);
2. under ``torch_distributed_zero_first(local_rank)`` the first rank of each node profiles each GPU type
   on its node (or finds the profile in the node's profile cache) while the others wait; then the others
   read the cached profile (they profile only if the cache is unusable);
3. every rank's profiles are gathered to all ranks;
4. every rank runs the same deterministic allocation (``planner.plan.build.build_plan``) on the same data with rank
   0's timestamp, so all ranks hold the identical plan (typed, never written to be read back), and takes its
   own entry.

Works with gloo on CPU (pass ``gpu=`` to simulate a GPU type per rank: the profile is then estimated for
that catalog type) and with NCCL on GPUs (the GPU type comes from the device's name; ``method="auto"``
measures it). A trainer with a memory probe of its own (Ultralytics' AutoBatch probes, with its loss
simulation: ``planner.integrations.ultralytics``) passes it as ``profiler``: step 2 is then made by the first
rank of each GPU type on each node, on its own device, and the profiles travel by the gather of step 3 only.

Known limitations: every rank must fit the minimum batch (a DDP job cannot leave a rank out once started:
relaunch without it); ranks must be numbered node by node, as torchrun does.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from planner.errors import InfeasiblePlanError
from planner.job import JobSpec
from planner.obtain.request import Profiled
from planner.plan.build import build_plan
from planner.plan.sections import ProbingInfo
from planner.plan.types import Plan, RankSlot
from planner.profiles.profile import DeviceProfile
from torchkit.hardware.catalog import ADD_GPU_TYPE_FIX, GpuSpec

#: ``profiler(gpu, device_index)``: this rank's GPU type profiled on its own CUDA device (see ``autobatch_ddp``)
Profiler = Callable[[GpuSpec, int], DeviceProfile]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class DdpAutobatch:
    """What ``autobatch_ddp`` gives each rank."""

    rank_plan: Any
    """this rank's ``planner.runtime.RankPlan`` (batch, loss weight, ...)"""
    plan: Plan
    """the whole plan (identical on every rank); ``planner.plan.io.write_plan`` saves it as plan.json"""
    profiled_here: tuple[str, ...]
    """GPU types this rank profiled itself (not from the cache)"""

    def rebalancer(self, sampler: Any, ddp: Any, **options: Any) -> Any:
        """A ``planner.runtime.Rebalancer`` for this plan: the job then corrects the estimate it started from
        with its own measured compute times (options as ``Rebalancer``'s: ``policy``, ``simulate``, ...)."""
        from planner.runtime.rebalance import Rebalancer

        return Rebalancer.from_plan(self.plan, sampler, ddp, **options)


def _node_name(env: Mapping[str, str]) -> str:
    """This rank's node: the host name, with torchrun's GROUP_RANK (several 'nodes' may share a host)."""
    group = env.get("GROUP_RANK")
    host = socket.gethostname()
    return f"{host}-g{group}" if group is not None else host


def _local_device_info(device_index: int, gpu: str | None, catalog) -> tuple[str, int, int, str]:
    """(GPU type, total bytes, available bytes, visible id) of this rank's device."""
    if gpu is not None:
        spec = catalog.get(gpu)
        return spec.name, spec.memory_bytes, spec.memory_bytes, str(device_index)
    import torch

    if not torch.cuda.is_available():
        raise InfeasiblePlanError(
            "autobatch_ddp: no CUDA device on this rank and no gpu= given (pass gpu='T4' etc. to simulate one)"
        )
    name = torch.cuda.get_device_name(device_index)
    spec = catalog.resolve(name)
    if spec is None:
        raise InfeasiblePlanError(f"GPU '{name}' is not in the GPU catalog ({ADD_GPU_TYPE_FIX})")
    free, total = torch.cuda.mem_get_info(device_index)
    # available to this process = driver-free + what it already holds (DESIGN.md, Profiles)
    available = int(free) + int(torch.cuda.memory_reserved(device_index))
    return spec.name, int(total), available, str(device_index)


def autobatch_ddp(
    job: JobSpec,
    *,
    gpu: str | None = None,
    device_index: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    catalog=None,
    env: Mapping[str, str] | None = None,
    profiler: Profiler | None = None,
) -> DdpAutobatch:
    """Plan this job's per-rank batches from inside the running process group and return this rank's share.

    Args:
        job: what to plan (model, input, amp, optimizer, fraction, mode, global batch, ...).
        gpu: simulate this catalog GPU type for this rank (CPU/gloo tests); default: this rank's CUDA device.
        device_index: CUDA device of this rank (default ``LOCAL_RANK``).
        cache_dir: the node's profile cache (default ``~/.cache/batchplan/profiles``).
        env: where RANK/LOCAL_RANK/GROUP_RANK come from (default ``os.environ``).
        profiler: profile a GPU type here instead of by the job's method through the profile cache: the first
            rank of each GPU type on each node calls ``profiler(gpu_spec, device_index)`` on its own device
            while the others go on to the gather, where they receive it. Such profiles are named by their
            content and not cached (they depend on the caller's model and data, which the job does not name).

    Raises:
        InfeasiblePlanError: a rank cannot fit the minimum batch, or the global batch is unreachable.
    """
    import torch.distributed as dist

    from planner.cluster import catalog_for
    from planner.runtime.rank_plan import load_rank_plan

    if not dist.is_available() or not dist.is_initialized():
        raise InfeasiblePlanError(
            "autobatch_ddp needs an initialised process group (call it inside torchrun)"
        )
    environ = os.environ if env is None else env
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(environ.get("LOCAL_RANK", 0))
    device_index = local_rank if device_index is None else device_index
    catalog = catalog or catalog_for(None)

    gpu_type, total_bytes, available_bytes, visible_id = _local_device_info(device_index, gpu, catalog)
    me = {
        "rank": rank,
        "node": _node_name(environ),
        "local_rank": local_rank,
        "device_index": device_index,
        "gpu": gpu_type,
        "total": total_bytes,
        "available": available_bytes,
        "visible_id": visible_id,
    }
    everyone: list[Any] = [None] * world_size
    dist.all_gather_object(everyone, me)

    gathered, profiled_here = _gathered_profiles(
        job, me, everyone, catalog, profiler=profiler, simulated=gpu is not None, cache_dir=cache_dir
    )
    all_profiles = {k: v for entry in gathered for k, v in entry["profiles"].items()}

    def key_of_rank(p: dict) -> str:
        # the key of the profile the first rank of the rank's (node, GPU type) obtained: with the node's cache
        # every rank of the node has it, with a profiler only that first rank does
        first = min(q["rank"] for q in everyone if q["node"] == p["node"] and q["gpu"] == p["gpu"])
        return gathered[first]["keys"][p["gpu"]]

    plan = _stamped_as_rank_0(
        _every_rank_plan(job, everyone, key_of_rank, all_profiles), simulated=gpu is not None
    )
    rank_plan = load_rank_plan(plan, rank=rank, env={"WORLD_SIZE": str(world_size)})
    return DdpAutobatch(rank_plan=rank_plan, plan=plan, profiled_here=tuple(profiled_here))


def _gathered_profiles(
    job: JobSpec,
    me: dict,
    everyone: list[dict],
    catalog,
    *,
    profiler: Profiler | None,
    simulated: bool,
    cache_dir,
) -> tuple[list[dict], list[str]]:
    """Steps 2 and 3: the profiles this rank obtained (its node's, through the node's cache; or its own, with
    ``profiler``), gathered from every rank. Returns, per rank, ``{"keys": GPU type -> profile key, "profiles":
    key -> profile}``, and the GPU types this rank profiled itself.

    Raises:
        InfeasiblePlanError: profiling failed on a rank (every rank raises the same message).
    """
    import torch.distributed as dist

    from planner.obtain import job_fingerprint

    if profiler is None:
        profiled, profiled_here = _node_profiles(
            job,
            me,
            everyone,
            catalog,
            identity=job_fingerprint(job),
            simulated=simulated,
            cache_dir=cache_dir,
        )
        mine = {
            "keys": {name: p.key for name, p in profiled.items()},
            "profiles": {p.key: p.profile for p in profiled.values()},
        }
    else:
        mine, profiled_here = _own_profile(me, everyone, catalog, profiler)
    gathered: list[Any] = [None] * len(everyone)
    dist.all_gather_object(gathered, mine)
    failed = [f"rank {r}: {entry['error']}" for r, entry in enumerate(gathered) if entry.get("error")]
    if failed:  # every rank stops with the same message, none waits for a profile that will not come
        raise InfeasiblePlanError("autobatch_ddp: profiling failed on " + "; ".join(failed))
    return gathered, profiled_here


def _stamped_as_rank_0(plan: Plan, *, simulated: bool) -> Plan:
    """The plan with rank 0's timestamp, so that the plans of all ranks are identical byte for byte, and with
    how it was made (``probing``: this backend, simulated GPU types or not)."""
    import torch.distributed as dist

    stamp: list[Any] = [plan.created]
    dist.broadcast_object_list(stamp, src=0)
    return plan.replace(created=stamp[0], probing=ProbingInfo(backend="autobatch_ddp", simulated=simulated))


def _node_profiles(
    job: JobSpec,
    me: dict,
    everyone: list[dict],
    catalog,
    *,
    identity: tuple[str, str],
    simulated: bool,
    cache_dir,
) -> tuple[dict[str, Profiled], list[str]]:
    """The profile of every GPU type on this rank's node (``planner.obtain.obtain_profile``): the node's first
    rank makes (or finds) each one in the node's cache while the others wait, then the others read it there.
    A simulated GPU type (``gpu=``) is estimated; a real one is asked for with the job's method, decided here."""
    from planner.obtain import Method, ProfileRequest, make_profile, obtain_profile
    from planner.profiles.cache import ProfileCache
    from torchkit.process.zero_first import torch_distributed_zero_first

    cache = ProfileCache(cache_dir)
    node, local_rank = me["node"], me["local_rank"]
    profiled: dict[str, Profiled] = {}
    profiled_here: list[str] = []
    estimates: dict[
        Any, Any
    ] = {}  # fake passes do not depend on the GPU type: one set serves every type here

    def make(request: ProfileRequest) -> DeviceProfile:
        if local_rank != 0:
            log.warning(
                "rank %d: no cached profile of %s after the node's first rank; profiling",
                me["rank"],
                request.gpu.name,
            )
        profiled_here.append(request.gpu.name)
        return make_profile(
            request.job,
            request.gpu,
            method=request.method,
            device_index=request.device_index,
            estimates_cache=estimates,
        )

    with torch_distributed_zero_first(local_rank):
        for gpu_name in sorted({p["gpu"] for p in everyone if p["node"] == node}):
            local_index = next(
                p["device_index"] for p in everyone if p["node"] == node and p["gpu"] == gpu_name
            )
            request = ProfileRequest(
                job=job,
                gpu=catalog.get(gpu_name),
                method=Method.ESTIMATE if simulated else job.method,
                device_index=None if simulated else local_index,
            )
            result = obtain_profile(request, make, cache=cache, identity=identity)
            assert result is not None  # make raises rather than giving none
            profiled[gpu_name] = result
    return profiled, profiled_here


def _own_profile(me: dict, everyone: list[dict], catalog, profiler: Profiler) -> tuple[dict, list[str]]:
    """This rank's part of the gather when a ``profiler`` makes the profiles: the first rank of its (node, GPU
    type) profiles its own device; the others contribute nothing and wait at the gather. A profiler's error
    travels in the gather (``error``), so that every rank stops instead of waiting for it."""
    import hashlib
    import json

    from planner.codec import encode

    first = min(p["rank"] for p in everyone if p["node"] == me["node"] and p["gpu"] == me["gpu"])
    if me["rank"] != first:
        return {"keys": {}, "profiles": {}}, []
    try:
        profile = profiler(catalog.get(me["gpu"]), me["device_index"])
    except Exception as e:  # reported to every rank after the gather, then raised there
        log.error("rank %d: profiling %s failed: %s", me["rank"], me["gpu"], e)
        return {"keys": {}, "profiles": {}, "error": f"{me['gpu']} {type(e).__name__}: {e}"}, []
    digest = hashlib.sha256(json.dumps(encode(profile), sort_keys=True).encode()).hexdigest()[:16]
    key = f"{me['gpu']}-{digest}"  # by content: two nodes that measured the same type differently keep both
    return {"keys": {me["gpu"]: key}, "profiles": {key: profile}}, [me["gpu"]]


def _every_rank_plan(
    job: JobSpec, everyone: list[dict], key_of_rank: Callable[[dict], str], profiles: dict[str, DeviceProfile]
) -> Plan:
    """The plan over every rank of the process group, checked to keep each rank in and in torchrun's order."""
    slots = [
        RankSlot(
            node=p["node"],
            device_index=p["device_index"],
            gpu=p["gpu"],
            profile=key_of_rank(p),
            memory_budget_bytes=job.memory_budget_bytes(p["available"]),
            total_memory_bytes=p["total"],
            visible_id=p["visible_id"],
        )
        for p in sorted(everyone, key=lambda p: p["rank"])
    ]
    plan = build_plan(job, slots, profiles)
    if plan.excluded:
        reasons = "; ".join(f"{e.node} GPU {e.device_index} ({e.gpu}): {e.reason}" for e in plan.excluded)
        raise InfeasiblePlanError(
            f"every rank of a running job must take part, but some cannot: {reasons} "
            "(lower the job's min_batch or multiple_of, or relaunch without those GPUs)"
        )
    for entry in plan.ranks:
        if (entry.node, entry.local_rank) != (slots[entry.rank].node, everyone[entry.rank]["local_rank"]):
            raise InfeasiblePlanError(
                "ranks are not numbered node by node (as torchrun does): the plan's rank order would not match "
                "the process group's"
            )
    return plan
