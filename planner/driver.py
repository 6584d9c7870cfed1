"""The planning driver: probe every node, profile each distinct GPU type once, allocate, build the plan.

The same steps run over two backends (``planner.probing.backends``): ``RayBackend`` (one ``NodeProbe`` actor
per node, pinned with hard node affinity; a real cluster or a simulated one on 127.0.0.1) and
``LocalBackend`` (the same probe functions called in this process, for a cluster config; no Ray). Both give the same plan for the same
config and job; only the run metadata under ``probing`` differs.

Profiling policy: each distinct (model, input, amp, optimizer, GPU type, method) is profiled once for the
whole cluster and cached on disk. Estimates do not depend on which node runs them, and their fake passes
do not depend on the GPU type, so every GPU type to be estimated is sent to the same probe (it reuses its
fake passes); a type to be measured goes to a node that has a free GPU of that type. A probe that dies or
times out has its node excluded (with the reason) and its work re-sent to another live probe.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from planner.cluster import ClusterSpec
from planner.errors import InfeasiblePlanError
from planner.events import Event, EventSink, ignore_event
from planner.interconnect import Interconnect
from planner.job import JobSpec
from planner.plan.build import build_plan
from planner.plan.comm import SyncInputs
from planner.plan.launch import DEFAULT_MASTER_PORT, DEFAULT_PLAN_PATH
from planner.plan.types import ExcludedDevice, ExclusionKind, Plan, RankSlot
from planner.probing.backends import (
    DEFAULT_PROBE_TIMEOUT_S,
    DEFAULT_PROFILE_TIMEOUT_S,
    Backend,
    LocalBackend,
    ProbeFailure,
    ProfileRequest,
    RayBackend,
    probe_env,
)
from planner.probing.busy import busy_summary, is_shared, speed_factor
from planner.probing.inventory import NodeInventory
from planner.probing.make_profile import job_fingerprint, profile_key_inputs
from planner.profiles.cache import ProfileCache
from planner.profiles.key import key_of_inputs
from planner.profiles.measured import find_measured
from planner.profiles.profile import DeviceProfile
from torchkit.estimate.ddp_sync import LinkCost
from torchkit.hardware.catalog import GpuCatalog

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class DriverOptions:
    """How to probe: timeouts, strictness, the cache."""

    probe_timeout_s: float = DEFAULT_PROBE_TIMEOUT_S
    profile_timeout_s: float = DEFAULT_PROFILE_TIMEOUT_S
    require_all_nodes: bool = False
    """a node that cannot be probed fails the plan (exit 1) instead of being left out"""
    cache: ProfileCache | None = None
    """profile cache; None disables it"""
    workers_per_rank: int = 0
    """data-loader workers each rank will run; used to warn when a node's ranks oversubscribe its cores"""
    script: str = "train.py"
    master_port: int = DEFAULT_MASTER_PORT
    plan_path: str = DEFAULT_PLAN_PATH
    """the plan file the launch lines name (``--plan``): where the plan is written"""


@dataclass(kw_only=True)
class PlanOutcome:
    plan: Plan | None
    """the plan; None only when ``allow_infeasible`` was set and no plan exists (see ``error``)"""
    inventories: list[NodeInventory]
    timings_s: dict[str, float]
    profile_calls: int
    """profiles actually computed (cache hits excluded)"""
    failed_nodes: dict[str, str] = field(default_factory=dict)
    """nodes whose probe died or timed out, with the reason"""
    error: str | None = None
    """why no plan exists (with ``allow_infeasible``)"""
    expected_nodes: tuple[str, ...] = ()
    """the nodes a cluster config names (empty for a real cluster, whose nodes are whatever answers)"""


def _profile_requests(
    job: JobSpec, inventories: Sequence[NodeInventory], catalog: GpuCatalog, fingerprint: str, torch_version: str
) -> tuple[dict[str, ProfileRequest], dict[tuple[str, int], str], list[ExcludedDevice]]:
    """One request per distinct GPU type among the selected devices; each device's profile key."""
    requests: dict[str, ProfileRequest] = {}
    device_keys: dict[tuple[str, int], str] = {}
    excluded: list[ExcludedDevice] = []
    for inventory in inventories:
        for index in inventory.selection.selected:
            gpu_type = inventory.gpu_type(index)
            if gpu_type is None:
                excluded.append(
                    ExcludedDevice(
                        node=inventory.name,
                        device_index=index,
                        gpu=inventory.device(index).name,
                        reason="GPU type not in the catalog (add it under gpu_types: in a cluster config)",
                        kind=ExclusionKind.UNKNOWN_GPU_TYPE,
                    )
                )
                continue
            measure = job.method in ("measure", "auto") and not inventory.simulated
            method = "measure" if measure else "estimate"
            if job.method == "measure" and inventory.simulated:
                method = "estimate"  # a simulated GPU cannot be measured; the plan notes it below
            inputs = profile_key_inputs(job, catalog.get(gpu_type), method=method,
                                        identity=(fingerprint, torch_version))
            key = key_of_inputs(inputs)
            device_keys[(inventory.name, index)] = key
            if key not in requests:
                requests[key] = ProfileRequest(
                    key=key,
                    key_inputs=inputs,
                    gpu_type=gpu_type,
                    method=method,
                    node=inventory.name if method == "measure" else None,
                    device_index=index if method == "measure" else None,
                )
    return requests, device_keys, excluded


def _host_warnings(inventories: Sequence[NodeInventory], slots: Sequence[RankSlot], workers_per_rank: int) -> list[str]:
    warnings = []
    for inventory in inventories:
        ranks = sum(1 for s in slots if s.node == inventory.name)
        cores = inventory.host.cpu_count
        if ranks and cores and ranks * (1 + workers_per_rank) > cores:
            warnings.append(
                f"{inventory.name}: {ranks} ranks × (1 + {workers_per_rank} data-loader workers) = "
                f"{ranks * (1 + workers_per_rank)} processes on {cores} cores; lower --workers"
            )
        for stats in inventory.devices:
            if stats.index in inventory.selection.selected and stats.processes:
                holders = ", ".join(f"{p.name or '?'} (pid {p.pid})" for p in stats.processes)
                warnings.append(f"{inventory.name}: GPU {stats.index} is shared with {holders}")
    return warnings


def _probe(job: JobSpec, backend: Backend, options: DriverOptions, on_event: EventSink, expected: int):
    """Every node's inventory and the nodes whose probe failed ``{node: reason}``."""
    count = expected or backend.num_probes()
    on_event(Event(stage="probe", status="start", item=f"{count} node{'s' if count != 1 else ''}"))
    inventories, failed_nodes = backend.inventories(
        job.gpus, job.min_free_memory_fraction, job.max_utilization_fraction
    )
    on_event(Event(stage="probe", status="done", detail={"nodes": len(inventories), "failed": len(failed_nodes)}))
    if failed_nodes and options.require_all_nodes:
        reasons = "; ".join(f"{n}: {r}" for n, r in failed_nodes.items())
        raise InfeasiblePlanError(f"not every node could be probed ({reasons}); drop --require-all-nodes to plan without them")
    return inventories, failed_nodes


def _selection_exclusions(failed_nodes: dict[str, str], inventories: Sequence[NodeInventory]) -> list[ExcludedDevice]:
    """The nodes whose probe failed and the GPUs the selection skipped, with their reasons."""
    excluded = [
        ExcludedDevice(node=n, device_index=None, gpu=None, reason=r, kind=ExclusionKind.PROBE_FAILED)
        for n, r in failed_nodes.items()
    ]
    for inventory in inventories:
        for index, reason in inventory.selection.skipped:
            excluded.append(ExcludedDevice(node=inventory.name, device_index=index, gpu=inventory.gpu_type(index),
                                           reason=reason, kind=ExclusionKind.SKIPPED_BY_SELECTION))
    return excluded


def _profile_one(
    job: JobSpec, backend: Backend, request: ProfileRequest, dead_nodes: set[str], failed_nodes: dict[str, str],
    options: DriverOptions, on_event: EventSink,
) -> DeviceProfile | None:
    """One profile, re-sent to another live probe when the one running it fails; None when none is left."""
    while True:
        try:
            profile, node = backend.profile(job, request, dead_nodes)
        except ProbeFailure as failure:
            if not failure.node or failure.node in dead_nodes:
                on_event(Event(stage="profile", status="failed", item=request.gpu_type, detail={"reason": failure.reason}))
                return None
            dead_nodes.add(failure.node)
            failed_nodes.setdefault(failure.node, failure.reason)
            on_event(Event(stage="profile", status="failed", item=request.gpu_type,
                           detail={"node": failure.node, "reason": failure.reason}))
            if options.require_all_nodes:
                raise InfeasiblePlanError(
                    f"probe of node {failure.node} failed: {failure.reason} (drop --require-all-nodes to plan without it)"
                ) from None
            if request.node is not None:  # measured on that node only
                return None
            continue
        on_event(Event(stage="profile", status="done", item=request.gpu_type, detail={"node": node}))
        return profile


def _profile_all(
    job: JobSpec, backend: Backend, catalog: GpuCatalog, requests: dict[str, ProfileRequest], dead_nodes: set[str],
    failed_nodes: dict[str, str], options: DriverOptions, on_event: EventSink, warnings: list[str],
) -> tuple[dict[str, DeviceProfile], int]:
    """Every requested profile (measured in a running job, or from the cache, where there is one) and how
    many were computed; says in ``warnings`` which ones a running job measured."""
    profiles: dict[str, DeviceProfile] = {}
    profile_calls = 0
    for key, request in requests.items():
        measured = _measured_in_job(job, request, catalog, options.cache)
        if measured is not None:
            profiles[key] = measured
            warnings.append(
                f"{request.gpu_type}: step time measured in a running job (profile method 'job', from the profile "
                f"cache); --method auto prefers it over the {request.method} profile"
            )
            on_event(Event(stage="profile", status="cached", item=request.gpu_type, detail={"measured_in_job": True}))
            continue
        cached = options.cache.get(key) if options.cache is not None else None
        if cached is not None:
            profiles[key] = cached
            on_event(Event(stage="profile", status="cached", item=request.gpu_type))
            continue
        profile = _profile_one(job, backend, request, dead_nodes, failed_nodes, options, on_event)
        if profile is None:
            continue
        profile_calls += 1
        profiles[key] = profile
        if options.cache is not None:
            options.cache.put(key, profile, inputs=request.key_inputs)
    return profiles, profile_calls


def _rank_slots(
    job: JobSpec, inventories: Sequence[NodeInventory], device_keys: dict[tuple[str, int], str],
    profiles: dict[str, DeviceProfile], dead_nodes: set[str], failed_nodes: dict[str, str],
) -> tuple[list[RankSlot], list[ExcludedDevice]]:
    """A slot for every selected, profiled device on a live node; the others excluded with their kind."""
    slots: list[RankSlot] = []
    excluded: list[ExcludedDevice] = []
    for inventory in inventories:
        if inventory.name in dead_nodes:
            excluded.extend(
                ExcludedDevice(node=inventory.name, device_index=i, gpu=inventory.gpu_type(i),
                               reason=f"probe failed: {failed_nodes[inventory.name]}", kind=ExclusionKind.PROBE_FAILED)
                for i in inventory.selection.selected
            )
            continue
        for index in inventory.selection.selected:
            key = device_keys.get((inventory.name, index))
            if key is None:
                continue  # excluded before profiling (unknown type)
            if key not in profiles:
                excluded.append(ExcludedDevice(node=inventory.name, device_index=index, gpu=inventory.gpu_type(index),
                                               reason="its GPU type could not be profiled (see warnings)",
                                               kind=ExclusionKind.NOT_PROFILED))
                continue
            stats = inventory.device(index)
            # budget = fraction × available; a fresh training process has the driver-free memory available,
            # and other processes' work leaves it a share of the GPU's time (planner.probing.busy)
            slots.append(
                RankSlot(
                    node=inventory.name,
                    device_index=index,
                    gpu=inventory.gpu_type(index) or stats.name,
                    profile=key,
                    memory_budget_bytes=job.memory_budget_bytes(stats.memory_free_bytes),
                    total_memory_bytes=stats.memory_total_bytes,
                    visible_id=stats.uuid if not inventory.simulated and stats.uuid else str(index),
                    speed_factor=speed_factor(stats),
                )
            )
    return slots, excluded


def _shared_gpus_line(job: JobSpec, inventories: Sequence[NodeInventory], slots: Sequence[RankSlot]) -> str | None:
    """What the busy-GPU policy did (planner.probing.busy): the shared GPUs skipped and those derated."""
    by_node = {inv.name: inv for inv in inventories}
    skipped = [(inv.name, inv.device(i), reason) for inv in inventories for i, reason in inv.selection.skipped
               if i in inv.selection.busy and is_shared(inv.device(i))]
    derated = [(s.node, by_node[s.node].device(s.device_index), s.memory_budget_bytes) for s in slots
               if is_shared(by_node[s.node].device(s.device_index))]
    return busy_summary(skipped, derated, min_free_memory_fraction=job.min_free_memory_fraction,
                        max_utilization_fraction=job.max_utilization_fraction)


def _measured_in_job(job: JobSpec, request: ProfileRequest, catalog: GpuCatalog, cache: ProfileCache | None):
    """With ``--method auto``: the profile a re-balanced job measured for this GPU type, if cached."""
    if job.method != "auto" or cache is None:
        return None
    return find_measured(cache, job.to_json(), request.gpu_type, job.amp_for(catalog.get(request.gpu_type)))


def _sync_inputs(job: JobSpec, backend: Backend, inventories: Sequence[NodeInventory], identity: tuple[str, str],
                 options: DriverOptions, interconnect: Interconnect | None, warnings: list[str]) -> SyncInputs | None:
    """What the gradient synchronisation model needs (``planner.plan.comm``); None, with a warning, when the
    model's gradients cannot be laid out."""
    from planner.probing.gradients import gradient_layout

    try:
        grad_bytes, source = gradient_layout(job, identity, options.cache.directory if options.cache else None)
    except Exception as exc:  # a user model that cannot be built on the meta device: plan compute only
        warnings.append(f"gradient synchronisation not modelled: the model's gradients could not be laid out "
                        f"({type(exc).__name__}: {exc}); the step times are compute only")
        return None
    measured, note = _measured_network(backend, inventories, options, warnings)
    return SyncInputs(grad_bytes=grad_bytes, gradients_source=source, bucket_cap_mb=job.bucket_cap_mb,
                      interconnect=interconnect or Interconnect(), measured=measured, measured_note=note)


def _measured_network(backend: Backend, inventories: Sequence[NodeInventory], options: DriverOptions,
                      warnings: list[str]) -> tuple[dict[str, LinkCost], str]:
    """The network the probes measure among the nodes with GPUs to plan on (``planner.probing.link_probe``),
    cached per cluster; nothing on a simulated cluster or one node. (links, what the plan says about it)"""
    from planner.probing import link_probe

    if any(inv.simulated for inv in inventories):
        return {}, ("simulated cluster: no link measured; the synchronisation is priced from the config's links, "
                    "the catalog's and the assumed network")
    nodes = sorted(inv.name for inv in inventories if inv.selection.selected)
    measure = getattr(backend, "measure_network", None)
    if len(nodes) < 2 or measure is None:
        return {}, ""
    cache_dir = options.cache.directory if options.cache is not None else None
    link = link_probe.cached_network(cache_dir, nodes)
    if link is None:
        try:
            times, world = measure(link_probe.PROBE_SIZES_BYTES, link_probe.PROBE_REPEATS, link_probe.PROBE_TIMEOUT_S)
            link = link_probe.network_link(link_probe.PROBE_SIZES_BYTES, times, world, "torch.distributed")
        except (ProbeFailure, ValueError) as exc:
            warnings.append(f"the network between nodes could not be measured ({exc}); the synchronisation is "
                            "priced from the config's or the assumed network")
            return {}, ""
        link_probe.store_network(cache_dir, nodes, link)
    return {"network": link}, f"network between nodes {link.source}"


def run_plan(
    job: JobSpec,
    backend: Backend,
    catalog: GpuCatalog,
    *,
    options: DriverOptions,
    on_event: EventSink = ignore_event,
    expected_nodes: Sequence[str] = (),
    timings_s: dict[str, float] | None = None,
    extra_warnings: Sequence[str] = (),
    allow_infeasible: bool = False,
    cluster_label: str = "",
    interconnect: Interconnect | None = None,
) -> PlanOutcome:
    """Probe, profile, allocate over ``backend``. See the module docstring for the policy.

    ``interconnect``: the links a cluster config states (None: none stated; catalog defaults and an assumed
    network price the gradient synchronisation).

    With ``allow_infeasible`` an infeasible job returns an outcome with ``plan=None`` and ``error`` (for
    preflight, which reports it as a failed check) instead of raising InfeasiblePlanError.
    """
    timings = dict(timings_s or {})
    start = time.monotonic()
    inventories, failed_nodes = _probe(job, backend, options, on_event, len(expected_nodes))
    timings["probe_s"] = time.monotonic() - start
    warnings = [*extra_warnings, *(w for inventory in inventories for w in inventory.warnings)]
    excluded = _selection_exclusions(failed_nodes, inventories)
    if job.method == "measure" and any(inv.simulated for inv in inventories):
        warnings.append("simulated GPUs cannot be measured: their profiles are estimated")

    start = time.monotonic()
    any_selected = any(inv.selection.selected for inv in inventories)
    fingerprint, torch_version = job_fingerprint(job) if any_selected else ("", "")
    requests, device_keys, unknown = _profile_requests(job, inventories, catalog, fingerprint, torch_version)
    excluded.extend(unknown)
    dead_nodes: set[str] = set(failed_nodes)
    profiles, profile_calls = _profile_all(job, backend, catalog, requests, dead_nodes, failed_nodes, options,
                                           on_event, warnings)
    timings["profile_s"] = time.monotonic() - start
    if options.cache is not None:
        warnings.extend(options.cache.problems)

    start = time.monotonic()
    slots, unusable = _rank_slots(job, inventories, device_keys, profiles, dead_nodes, failed_nodes)
    excluded.extend(unusable)
    excluded.extend(
        ExcludedDevice(node=node, device_index=None, gpu=None, reason=f"probe failed: {failed_nodes.get(node)}",
                       kind=ExclusionKind.PROBE_FAILED)
        for node in dead_nodes if not any(e.node == node for e in excluded)
    )
    warnings.extend(_host_warnings(inventories, slots, options.workers_per_rank))
    shared = _shared_gpus_line(job, inventories, slots)
    if shared:
        warnings.append(shared)
    on_event(Event(stage="allocate", status="start", item=f"{len(slots)} devices"))
    outcome = PlanOutcome(plan=None, inventories=inventories, timings_s=timings, profile_calls=profile_calls,
                          failed_nodes=failed_nodes, expected_nodes=tuple(expected_nodes))
    sync = _sync_inputs(job, backend, inventories, (fingerprint, torch_version), options, interconnect,
                        warnings) if any_selected else None
    try:
        plan = build_plan(
            job, slots, profiles, excluded=excluded, warnings=warnings,
            node_addresses={inv.name: inv.host.hostname for inv in inventories if not inv.simulated},
            master_port=options.master_port, script=options.script, plan_path=options.plan_path, sync=sync,
        )
    except InfeasiblePlanError as exc:
        if not allow_infeasible:
            raise
        timings["allocate_s"] = time.monotonic() - start
        outcome.error = str(exc)
        return outcome
    timings["allocate_s"] = time.monotonic() - start
    on_event(Event(stage="allocate", status="done"))
    # cluster: what the plan was made for (the config's name, or the Ray address), e.g. in a plot's title
    outcome.plan = plan.with_extra(cluster=cluster_label,
                                   probing={**backend.probing_metadata(), "profile_calls": profile_calls,
                                            "timings_s": {k: round(v, 3) for k, v in timings.items()}})
    return outcome


def plan_without_ray(
    job: JobSpec,
    cluster: ClusterSpec,
    *,
    options: DriverOptions | None = None,
    on_event: EventSink = ignore_event,
    allow_infeasible: bool = False,
) -> PlanOutcome:
    """Plan a cluster config in this process (no Ray): the reference the Ray path is checked against."""
    return run_plan(
        job,
        LocalBackend(cluster),
        cluster.catalog,
        options=options or DriverOptions(),
        on_event=on_event,
        expected_nodes=[n.name for n in cluster.nodes],
        allow_infeasible=allow_infeasible,
        cluster_label=cluster.name,
        interconnect=cluster.interconnect,
    )


def _session_label(address: str) -> str:
    """How a plot title names a real cluster: by its address (the session's ``address`` field)."""
    return {"local": "this machine", "existing": "the connected Ray cluster"}.get(address, f"Ray at {address}")


def plan_with_ray(
    job: JobSpec,
    *,
    cluster: ClusterSpec | None = None,
    address: str | None = None,
    catalog: GpuCatalog | None = None,
    options: DriverOptions | None = None,
    on_event: EventSink = ignore_event,
    raylet_cap: int | None = None,
    allow_infeasible: bool = False,
) -> PlanOutcome:
    """Plan over Ray: a cluster config simulated on 127.0.0.1, a cluster at ``address``, or embedded Ray."""
    from planner.probing.session import ray_session
    from torchkit.hardware.catalog import load_catalog

    options = options or DriverOptions()
    catalog = cluster.catalog if cluster is not None else (catalog or load_catalog())
    start = time.monotonic()
    on_event(Event(stage="ray", status="start", item=address or ("simulated" if cluster else "local")))
    with ray_session(
        address=address if cluster is None else None,
        num_simulated_nodes=len(cluster.nodes) if cluster is not None else 0,
        raylet_cap=raylet_cap,
        worker_env=probe_env(job.model),
    ) as session:
        backend = RayBackend(session, catalog, cluster=cluster, on_event=on_event, model=job.model,
                             probe_timeout_s=options.probe_timeout_s, profile_timeout_s=options.profile_timeout_s)
        timings = {"ray_start_s": time.monotonic() - start}
        on_event(Event(stage="ray", status="done", detail={"raylets": len(session.nodes)}))
        if cluster is not None and len(backend.actors) < len(cluster.nodes):
            # run metadata, not part of the plan (the same whatever the raylets): said with the progress
            log.info("%d simulated nodes share %d probe process(es) on %d raylet(s) (--raylet-cap; "
                     "BATCHPLAN_RAYLET_CAP)", len(cluster.nodes), len(backend.actors), len(session.nodes))
        return run_plan(
            job,
            backend,
            catalog,
            options=options,
            on_event=on_event,
            expected_nodes=[n.name for n in cluster.nodes] if cluster is not None else (),
            timings_s=timings,
            allow_infeasible=allow_infeasible,
            cluster_label=cluster.name if cluster is not None else _session_label(session.address),
            interconnect=cluster.interconnect if cluster is not None else None,
        )
