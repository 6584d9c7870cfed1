"""The planning driver: probe every node, profile each distinct GPU type once, allocate, build the plan.

The same steps run over two backends (``planner.probing.backends``): ``RayBackend`` (one ``NodeProbe`` actor
per node, pinned with hard node affinity; a real cluster or a simulated one on 127.0.0.1) and
``LocalBackend`` (the same probe functions called in this process, for a cluster config; no Ray). Both give the same plan for the same
config and job; only the run metadata under ``probing`` differs.

The pipeline (``run_plan``), each stage a function that returns what the next reads: probe
(``_probe``: inventories, failed nodes) → requests (``_profile_requests``) → profiles (``_profile_all``,
through ``planner.obtain.obtain_profile``) → rank slots (``_rank_slots``) and exclusions
(``_excluded_devices``, the one builder of ``excluded``) → warnings (``_warnings``) → ``build_plan``.

Profiling policy: each distinct (model, input, amp, optimizer, GPU type, method) is profiled once for the
whole cluster and cached on disk. Estimates do not depend on which node runs them, and their fake passes
do not depend on the GPU type, so every GPU type to be estimated is sent to the same probe (it reuses its
fake passes); a real node's GPU type is asked for with the job's method on a node that has a free GPU of
that type, and ``auto`` is decided there (``planner.obtain.method``: measured where CUDA can use it,
else estimated with a note). A probe that dies or times out has its node excluded (with the reason) and
its work re-sent to another live probe.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from planner.cluster import ClusterSpec, catalog_for
from planner.errors import InfeasiblePlanError, field_name, render_fields
from planner.events import Event, EventSink, ignore_event
from planner.interconnect import Interconnect
from planner.job import JobSpec
from planner.obtain import (
    Method,
    Profiled,
    ProfileOrigin,
    ProfileRequest,
    job_fingerprint,
    obtain_profile,
    planned_key,
    planned_method,
)
from planner.plan.build import build_plan
from planner.plan.comm import SyncInputs, backward_share_of
from planner.plan.launch import DEFAULT_MASTER_PORT, DEFAULT_PLAN_PATH
from planner.plan.sections import ProbingInfo
from planner.plan.types import ExcludedDevice, ExclusionKind, Plan, RankSlot
from planner.probing.backends import (
    DEFAULT_PROBE_TIMEOUT_S,
    DEFAULT_PROFILE_TIMEOUT_S,
    Backend,
    LocalBackend,
    ProbeFailure,
    RayBackend,
    probe_env,
)
from planner.probing.busy import busy_summary, is_shared, speed_factor
from planner.probing.inventory import NodeInventory
from planner.profiles.cache import ProfileCache
from planner.profiles.measured_sync import find_job_sync, sync_key_inputs
from planner.profiles.profile import DeviceProfile
from torchkit.estimate.ddp_sync import LinkCost
from torchkit.hardware.catalog import ADD_GPU_TYPE_FIX, GpuCatalog

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
    verify_cache: bool = False
    """hold every profile read from the cache against a fresh estimate (``planner.obtain.verify``)"""
    workers_per_rank: int = 0
    """data-loader workers each rank will run; used to warn when a node's ranks oversubscribe its cores"""
    script: str = "train.py"
    master_port: int = DEFAULT_MASTER_PORT
    plan_path: str = DEFAULT_PLAN_PATH
    """the plan file the launch lines name (``--plan``): where the plan is written"""
    name_of: Callable[[str], str] = field_name
    """how a message names a setting (a field of this or of ``JobSpec``): the CLI passes its flags"""


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


@dataclass(frozen=True, kw_only=True)
class _Requests:
    """What to profile: one request per distinct (GPU type, method, measuring node), and which one each selected
    device of a known type is planned with."""

    by_key: dict[str, ProfileRequest]
    """each request under the key it is looked up by (``planner.obtain.planned_key``)"""
    device_key: dict[tuple[str, int], str]
    """(node, device index) → the key of its request"""


def _profile_requests(
    job: JobSpec, inventories: Sequence[NodeInventory], catalog: GpuCatalog, identity: tuple[str, str]
) -> _Requests:
    """One request per distinct GPU type among the selected devices (of a known type), and each device's key.

    A simulated GPU has no device to measure on: it is estimated (``measure`` too: the plan warns). A real
    node's GPU is asked for with the job's method, on that node, where ``auto`` is decided (in its probe);
    with ``auto`` on a node whose probe read a torch built without CUDA, as the estimate it will be (a plan
    warning says why, ``_warnings``), so its key is the estimate's and a second plan finds it cached."""
    by_key: dict[str, ProfileRequest] = {}
    device_key: dict[tuple[str, int], str] = {}
    for inventory in inventories:
        for index in inventory.selection.selected:
            gpu_type = inventory.gpu_type(index)
            if gpu_type is None:
                continue  # excluded (_excluded_devices)
            simulated = inventory.simulated
            method = Method.ESTIMATE if simulated and job.method is Method.MEASURE else job.method
            # auto on a node whose torch has no CUDA will estimate: looked up (and found next run) as one
            device_index = (
                None if simulated or (inventory.torch_without_cuda and method is Method.AUTO) else index
            )
            measured = planned_method(method, device_index) is Method.MEASURE
            request = ProfileRequest(
                job=job,
                gpu=catalog.get(gpu_type),
                method=method,
                device_index=device_index if measured else None,
                node=inventory.name if measured else None,
            )
            key = planned_key(request, identity)
            device_key[(inventory.name, index)] = key
            by_key.setdefault(key, request)
    return _Requests(by_key=by_key, device_key=device_key)


def _host_warnings(
    inventories: Sequence[NodeInventory], slots: Sequence[RankSlot], workers_per_rank: int
) -> list[str]:
    warnings = []
    ranks_on = Counter(s.node for s in slots)  # counted once: 16,384 nodes × 65,536 slots took minutes
    for inventory in inventories:
        ranks = ranks_on[inventory.name]
        cores = inventory.host.cpu_count
        if ranks and cores and ranks * (1 + workers_per_rank) > cores:
            warnings.append(
                f"{inventory.name}: {ranks} ranks × (1 + {workers_per_rank} data-loader workers) = "
                f"{ranks * (1 + workers_per_rank)} processes on {cores} cores; lower `workers_per_rank`"
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
    on_event(
        Event(stage="probe", status="done", detail={"nodes": len(inventories), "failed": len(failed_nodes)})
    )
    if failed_nodes and options.require_all_nodes:
        reasons = "; ".join(f"{n}: {r}" for n, r in failed_nodes.items())
        raise InfeasiblePlanError(
            f"not every node could be probed ({reasons}); drop "
            f"{options.name_of('require_all_nodes')} to plan without them"
        )
    return inventories, failed_nodes


@dataclass(frozen=True, kw_only=True)
class _Profiling:
    """What the profile stage found: every profile obtained, and the probes that failed on the way."""

    profiled: dict[str, Profiled]
    """by the key of its request (``_Requests.by_key``)"""
    calls: int
    """profiles actually made (cache hits and measured-in-job profiles excluded)"""
    failed_nodes: dict[str, str]
    """nodes whose probe died or timed out while profiling, with the reason"""


def _profile_one(
    backend: Backend,
    request: ProfileRequest,
    avoid: frozenset[str],
    options: DriverOptions,
    on_event: EventSink,
) -> tuple[DeviceProfile | None, dict[str, str]]:
    """One profile, re-sent to another live probe when the one running it fails (None when none is left),
    and the nodes whose probe failed meanwhile."""
    failed: dict[str, str] = {}
    gpu_type = request.gpu.name
    while True:
        try:
            profile, node = backend.profile(request, avoid | set(failed))
        except ProbeFailure as failure:
            if not failure.node or failure.node in avoid or failure.node in failed:
                on_event(
                    Event(stage="profile", status="failed", item=gpu_type, detail={"reason": failure.reason})
                )
                return None, failed
            failed[failure.node] = failure.reason
            on_event(
                Event(
                    stage="profile",
                    status="failed",
                    item=gpu_type,
                    detail={"node": failure.node, "reason": failure.reason},
                )
            )
            if options.require_all_nodes:
                raise InfeasiblePlanError(
                    f"probe of node {failure.node} failed: {failure.reason} (drop "
                    f"{options.name_of('require_all_nodes')} to plan without it)"
                ) from None
            if request.node is not None:  # measured on that node only
                return None, failed
            continue
        on_event(Event(stage="profile", status="done", item=gpu_type, detail={"node": node}))
        return profile, failed


def _profile_all(
    backend: Backend,
    requests: _Requests,
    identity: tuple[str, str],
    failed_at_probe: dict[str, str],
    options: DriverOptions,
    on_event: EventSink,
) -> _Profiling:
    """Every requested profile through ``planner.obtain.obtain_profile`` (measured in a running job, cached,
    or made by a live probe)."""
    profiled: dict[str, Profiled] = {}
    failed: dict[str, str] = {}
    calls = 0
    for key, request in requests.by_key.items():

        def make(request: ProfileRequest) -> DeviceProfile | None:
            profile, newly_failed = _profile_one(
                backend, request, frozenset({*failed_at_probe, *failed}), options, on_event
            )
            for node, reason in newly_failed.items():
                failed.setdefault(node, reason)
            return profile

        result = obtain_profile(
            request, make, cache=options.cache, identity=identity, verify=options.verify_cache
        )
        if result is None:
            continue
        if result.origin is ProfileOrigin.MADE:
            calls += 1
        else:
            detail = {"measured_in_job": True} if result.origin is ProfileOrigin.MEASURED_IN_JOB else None
            on_event(
                Event(
                    stage="profile",
                    status="cached",
                    item=request.gpu.name,
                    **({"detail": detail} if detail else {}),
                )
            )
        profiled[key] = result
    return _Profiling(profiled=profiled, calls=calls, failed_nodes=failed)


def _probe_failed(
    node: str, reason: str, *, index: int | None = None, gpu: str | None = None
) -> ExcludedDevice:
    """A device (or, without ``index``, a whole node) left out because its node's probe failed."""
    return ExcludedDevice(
        node=node, device_index=index, gpu=gpu, reason=reason, kind=ExclusionKind.PROBE_FAILED
    )


def _excluded_devices(
    inventories: Sequence[NodeInventory],
    failed_at_probe: dict[str, str],
    requests: _Requests,
    profiling: _Profiling,
) -> list[ExcludedDevice]:
    """Every device (or node) that is not a rank, with its kind and reason, in one order: nodes whose probe
    failed, GPUs the selection skipped, GPU types the catalog lacks, then per node the devices whose probe
    failed while profiling or whose type could not be profiled."""
    excluded = [_probe_failed(node, reason) for node, reason in failed_at_probe.items()]
    for inventory in inventories:
        for index, reason in inventory.selection.skipped:
            excluded.append(
                ExcludedDevice(
                    node=inventory.name,
                    device_index=index,
                    gpu=inventory.gpu_type(index),
                    reason=reason,
                    kind=ExclusionKind.SKIPPED_BY_SELECTION,
                )
            )
    for inventory in inventories:
        for index in inventory.selection.selected:
            if inventory.gpu_type(index) is None:
                excluded.append(
                    ExcludedDevice(
                        node=inventory.name,
                        device_index=index,
                        gpu=inventory.device(index).name,
                        reason=f"GPU type not in the catalog ({ADD_GPU_TYPE_FIX})",
                        kind=ExclusionKind.UNKNOWN_GPU_TYPE,
                    )
                )
    failed = {**failed_at_probe, **profiling.failed_nodes}
    for inventory in inventories:
        if inventory.name in failed:
            excluded.extend(
                _probe_failed(
                    inventory.name,
                    f"probe failed: {failed[inventory.name]}",
                    index=i,
                    gpu=inventory.gpu_type(i),
                )
                for i in inventory.selection.selected
            )
            continue
        for index in inventory.selection.selected:
            key = requests.device_key.get((inventory.name, index))
            if key is not None and key not in profiling.profiled:
                excluded.append(
                    ExcludedDevice(
                        node=inventory.name,
                        device_index=index,
                        gpu=inventory.gpu_type(index),
                        reason="its GPU type could not be profiled (see warnings)",
                        kind=ExclusionKind.NOT_PROFILED,
                    )
                )
    excluded.extend(
        _probe_failed(node, f"probe failed: {reason}")
        for node, reason in profiling.failed_nodes.items()
        if not any(e.node == node for e in excluded)
    )
    return excluded


def _rank_slots(
    job: JobSpec,
    inventories: Sequence[NodeInventory],
    requests: _Requests,
    profiling: _Profiling,
    failed_at_probe: dict[str, str],
) -> list[RankSlot]:
    """A slot for every selected, profiled device on a live node (``_excluded_devices`` says why the others
    are not)."""
    slots: list[RankSlot] = []
    for inventory in inventories:
        if inventory.name in failed_at_probe or inventory.name in profiling.failed_nodes:
            continue
        for index in inventory.selection.selected:
            key = requests.device_key.get((inventory.name, index))
            if key is None or key not in profiling.profiled:
                continue
            stats = inventory.device(index)
            # budget = fraction × available; a fresh training process has the driver-free memory available,
            # and other processes' work leaves it a share of the GPU's time (planner.probing.busy)
            slots.append(
                RankSlot(
                    node=inventory.name,
                    device_index=index,
                    gpu=inventory.gpu_type(index) or stats.name,
                    profile=profiling.profiled[key].key,
                    memory_budget_bytes=job.memory_budget_bytes(stats.memory_free_bytes),
                    total_memory_bytes=stats.memory_total_bytes,
                    visible_id=stats.uuid if not inventory.simulated and stats.uuid else str(index),
                    speed_factor=speed_factor(stats),
                )
            )
    return slots


def _shared_gpus_line(
    job: JobSpec, inventories: Sequence[NodeInventory], slots: Sequence[RankSlot]
) -> str | None:
    """What the busy-GPU policy did (planner.probing.busy): the shared GPUs skipped and those derated."""
    by_node = {inv.name: inv for inv in inventories}
    skipped = [
        (inv.name, inv.device(i), reason)
        for inv in inventories
        for i, reason in inv.selection.skipped
        if i in inv.selection.busy and is_shared(inv.device(i))
    ]
    derated = [
        (s.node, by_node[s.node].device(s.device_index), s.memory_budget_bytes)
        for s in slots
        if is_shared(by_node[s.node].device(s.device_index))
    ]
    return busy_summary(
        skipped,
        derated,
        min_free_memory_fraction=job.min_free_memory_fraction,
        max_utilization_fraction=job.max_utilization_fraction,
    )


def _warnings(
    job: JobSpec,
    inventories: Sequence[NodeInventory],
    profiling: _Profiling,
    slots: Sequence[RankSlot],
    extra: Sequence[str],
    options: DriverOptions,
) -> list[str]:
    """The plan's warnings, in order: the caller's, the probes', simulated measuring, profiles measured in a
    running job, corrupt cache entries, oversubscribed hosts and shared GPUs. Settings are named by
    ``options.name_of``."""
    warnings = [*extra, *(w for inventory in inventories for w in inventory.warnings)]
    if job.method is Method.MEASURE and any(inv.simulated for inv in inventories):
        warnings.append("simulated GPUs cannot be measured: their profiles are estimated")
    if job.method is Method.AUTO:
        warnings.extend(
            f"{inv.name}: torch {(inv.driver or {}).get('torch_version')} there is a build without CUDA: its GPUs are "
            f"estimated, not measured (install a CUDA build of torch on it to measure)"
            for inv in inventories
            if inv.torch_without_cuda and inv.selection.selected
        )
    warnings.extend(
        render_fields(note, options.name_of) for p in profiling.profiled.values() for note in p.notes
    )
    if options.cache is not None:
        warnings.extend(options.cache.problems)
    warnings.extend(
        render_fields(w, options.name_of)
        for w in _host_warnings(inventories, slots, options.workers_per_rank)
    )
    shared = _shared_gpus_line(job, inventories, slots)
    if shared:
        warnings.append(render_fields(shared, options.name_of))
    return warnings


def _sync_inputs(
    job: JobSpec,
    backend: Backend,
    inventories: Sequence[NodeInventory],
    identity: tuple[str, str],
    options: DriverOptions,
    interconnect: Interconnect | None,
    warnings: list[str],
) -> SyncInputs | None:
    """What the gradient synchronisation model needs (``planner.plan.comm``); None, with a warning, when the
    model's gradients cannot be laid out. The cache entries it reads that are refused are said in ``warnings``."""
    from planner.obtain.gradients import gradient_layout

    seen = len(options.cache.problems) if options.cache is not None else 0

    try:
        grad_bytes, source = gradient_layout(job, identity, options.cache)
    except (
        Exception
    ) as exc:  # a model that cannot be built at all (nor its parameters counted): plan compute only
        warnings.append(
            f"gradient synchronisation not modelled: the model's gradients could not be laid out "
            f"({type(exc).__name__}: {exc}); the step times are compute only"
        )
        warnings.extend(options.cache.problems[seen:] if options.cache is not None else ())
        return None
    measured, note = _measured_network(
        backend, inventories, options, warnings, interconnect or Interconnect()
    )
    job_sync = {}
    if (
        job.method is Method.AUTO
    ):  # as the profiles measured in a running job: found where measurements may answer
        inputs = sync_key_inputs(
            job, fingerprint=identity[0], gradient_bytes=sum(grad_bytes), bucket_cap_mb=job.bucket_cap_mb
        )
        job_sync = find_job_sync(options.cache, inputs)
    warnings.extend(options.cache.problems[seen:] if options.cache is not None else ())
    return SyncInputs(
        grad_bytes=grad_bytes,
        gradients_source=source,
        bucket_cap_mb=job.bucket_cap_mb,
        interconnect=interconnect or Interconnect(),
        measured=measured,
        measured_note=note,
        job_sync=job_sync,
    )


def _measured_network(
    backend: Backend,
    inventories: Sequence[NodeInventory],
    options: DriverOptions,
    warnings: list[str],
    interconnect: Interconnect,
) -> tuple[dict[str, LinkCost], str]:
    """The network the probes measure among the nodes with GPUs to plan on (``planner.probing.link_probe``),
    cached per cluster; nothing on a simulated cluster or one node. (links, what the plan says about it)"""
    from planner.probing import link_probe

    nodes = sorted(inv.name for inv in inventories if inv.selection.selected)
    if any(inv.simulated for inv in inventories):
        assumed = len(nodes) > 1 and any(interconnect.network_link(node)[1] for node in nodes)
        return {}, (
            "simulated cluster: no link measured; the synchronisation is priced from the config's links "
            "and the catalog's" + (", and the assumed network" if assumed else "")
        )
    measure = getattr(backend, "measure_network", None)
    if len(nodes) < 2 or measure is None:
        return {}, ""
    link = link_probe.cached_network(options.cache, nodes)
    if link is None:
        try:
            times, world = measure(
                link_probe.PROBE_SIZES_BYTES, link_probe.PROBE_REPEATS, link_probe.PROBE_TIMEOUT_S
            )
            link = link_probe.network_link(link_probe.PROBE_SIZES_BYTES, times, world, "torch.distributed")
        except (ProbeFailure, ValueError) as exc:
            warnings.append(
                f"the network between nodes could not be measured ({exc}); the synchronisation is "
                "priced from the config's or the assumed network"
            )
            return {}, ""
        link_probe.store_network(options.cache, nodes, link)
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
    """Probe, profile, allocate over ``backend``: a pipeline of stages, each returning what the next reads
    (see the module docstring for the policy).

    ``interconnect``: the links a cluster config states (None: none stated; catalog defaults and an assumed
    network price the gradient synchronisation).

    With ``allow_infeasible`` an infeasible job returns an outcome with ``plan=None`` and ``error`` (for
    preflight, which reports it as a failed check) instead of raising InfeasiblePlanError.
    """
    timings = dict(timings_s or {})
    start = time.monotonic()
    inventories, failed_at_probe = _probe(job, backend, options, on_event, len(expected_nodes))
    timings["probe_s"] = time.monotonic() - start

    start = time.monotonic()
    any_selected = any(inv.selection.selected for inv in inventories)
    identity = job_fingerprint(job) if any_selected else ("", "")
    requests = _profile_requests(job, inventories, catalog, identity)
    profiling = _profile_all(backend, requests, identity, failed_at_probe, options, on_event)
    timings["profile_s"] = time.monotonic() - start

    start = time.monotonic()
    slots = _rank_slots(job, inventories, requests, profiling, failed_at_probe)
    excluded = _excluded_devices(inventories, failed_at_probe, requests, profiling)
    warnings = _warnings(job, inventories, profiling, slots, extra_warnings, options)
    failed_nodes = {
        **failed_at_probe,
        **{n: r for n, r in profiling.failed_nodes.items() if n not in failed_at_probe},
    }
    on_event(Event(stage="allocate", status="start", item=f"{len(slots)} devices"))
    outcome = PlanOutcome(
        plan=None,
        inventories=inventories,
        timings_s=timings,
        profile_calls=profiling.calls,
        failed_nodes=failed_nodes,
        expected_nodes=tuple(expected_nodes),
    )
    profiles = {p.key: p.profile for p in profiling.profiled.values()}
    sync = (
        _sync_inputs(job, backend, inventories, identity, options, interconnect, warnings)
        if any_selected
        else None
    )
    if sync is not None:
        share, share_source = backward_share_of([profiles[s.profile] for s in slots])
        sync = replace(sync, backward_share=share, backward_share_source=share_source)
    try:
        plan = _build_plan(
            job, slots, profiles, inventories, options, sync, excluded=excluded, warnings=warnings
        )
    except InfeasiblePlanError as exc:
        if not allow_infeasible:
            raise
        timings["allocate_s"] = time.monotonic() - start
        outcome.error = str(exc)
        return outcome
    timings["allocate_s"] = time.monotonic() - start
    on_event(Event(stage="allocate", status="done"))
    outcome.plan = _with_run_facts(plan, cluster_label, backend, profiling.calls, timings)
    return outcome


def _build_plan(
    job: JobSpec,
    slots: Sequence[RankSlot],
    profiles: dict[str, DeviceProfile],
    inventories: Sequence[NodeInventory],
    options: DriverOptions,
    sync: SyncInputs | None,
    *,
    excluded: Sequence[ExcludedDevice],
    warnings: Sequence[str],
) -> Plan:
    """``build_plan`` with the launch settings of ``options`` and the host names of the nodes that are not
    simulated (the launch lines' ``--master-addr``; a simulated node goes by its name)."""
    return build_plan(
        job,
        slots,
        profiles,
        excluded=excluded,
        warnings=warnings,
        node_addresses={inv.name: inv.host.hostname for inv in inventories if not inv.simulated},
        master_port=options.master_port,
        script=options.script,
        plan_path=options.plan_path,
        sync=sync,
    )


def _with_run_facts(
    plan: Plan, cluster_label: str, backend: Backend, profile_calls: int, timings_s: dict[str, float]
) -> Plan:
    """The plan with what it was made for (``cluster``: the config's name, or the Ray address, e.g. in a plot's
    title) and how it was probed (``probing``: the backend's metadata, profile calls, stage times)."""
    return plan.replace(
        cluster=cluster_label,
        probing=ProbingInfo(
            **backend.probing_metadata(),
            profile_calls=profile_calls,
            timings_s={k: round(v, 3) for k, v in timings_s.items()},
        ),
    )


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
    return {"local": "this machine", "existing": "the connected Ray cluster"}.get(
        address, f"Ray at {address}"
    )


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

    options = options or DriverOptions()
    catalog = catalog_for(cluster) if cluster is not None or catalog is None else catalog
    start = time.monotonic()
    on_event(Event(stage="ray", status="start", item=address or ("simulated" if cluster else "local")))
    with ray_session(
        address=address if cluster is None else None,
        num_simulated_nodes=len(cluster.nodes) if cluster is not None else 0,
        raylet_cap=raylet_cap,
        worker_env=probe_env(job.model),
    ) as session:
        backend = RayBackend(
            session,
            catalog,
            cluster=cluster,
            on_event=on_event,
            model=job.model,
            probe_timeout_s=options.probe_timeout_s,
            profile_timeout_s=options.profile_timeout_s,
        )
        timings = {"ray_start_s": time.monotonic() - start}
        on_event(Event(stage="ray", status="done", detail={"raylets": len(session.nodes)}))
        if cluster is not None and len(backend.actors) < len(cluster.nodes):
            # run metadata, not part of the plan (the same whatever the raylets): said with the progress
            log.info(
                "%d simulated nodes share %d probe process(es) on %d raylet(s) (%s; BATCHPLAN_RAYLET_CAP)",
                len(cluster.nodes),
                len(backend.actors),
                len(session.nodes),
                options.name_of("raylet_cap"),
            )
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
