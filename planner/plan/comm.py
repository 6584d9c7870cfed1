"""The gradient synchronisation of a plan: the ring over its ranks' links, the sync model the allocation
optimises against, the plan's ``comm`` section and the advice the synchronisation changes.

A plan's step is ``max_i compute_i(b_i) + exposed sync`` (``torchkit.estimate.ddp_sync``). The ring crosses
the intra-node link of every node with two or more ranks and, with two or more nodes, every node's network
link (``planner.interconnect``: the config's, the catalog's, an assumed default, or measured); its slowest link
sets the bandwidth. Every figure carries where it comes from.

plan.json gains (as top-level fields after the standard ones; old plans without them still load):
``predicted_comm_time_s`` (exposed synchronisation per optimizer step, 0 for one GPU) and ``comm``, a
``planner.plan.sections.CommSection`` (the gradient bytes and DDP's buckets, the ring's links with their
sources, the exposed time and its range from full overlap to none, the backward share and where it comes from).

``exposed_source`` says where the exposed figure comes from: the links' model, or "measured in the job" where a
real run of this job on this ring (``ring_shape``) filed its measured exposed synchronisation
(``planner.profiles.measured_sync``); then every all-reduce of the ring takes ``slowdown`` times the links'
time, and ``job_sync`` holds what the run measured.

Pure Python + numpy: no torch, Ray or pynvml.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from planner.allocate.allocation import Allocation
from planner.interconnect import DEFAULT_NETWORK_GBPS, Interconnect
from planner.plan.sections import CommSection, LinkHop
from planner.plan.types import Plan, RankSlot
from planner.profiles.measured_sync import JobSync
from planner.profiles.profile import DeviceProfile
from torchkit.estimate.ddp_sync import Bucket, LinkCost, RingCost, ddp_buckets, exposed_sync_s, sync_timeline

DEFAULT_BACKWARD_SHARE = 2.0 / 3.0
"""share of a step's compute that is backward when nothing measured it: backward ≈ 2× forward in FLOPs for
convolutions and matmuls (a weight and an input gradient per forward product)"""
ASSUMED_BACKWARD_SHARE_SOURCE = "assumed: backward ≈ 2× forward FLOPs"
ADVISE_EXPOSED_SHARE = 0.30
"""an exposed synchronisation above this share of the step is worth advice (accumulate, bigger batch)"""
_ACCUMULATE_TRIALS = (2, 4, 8, 16)


@dataclass(frozen=True, kw_only=True)
class SyncInputs:
    """What the synchronisation model of a plan needs besides the ranks."""

    grad_bytes: tuple[int, ...]
    """gradient bytes of each parameter that requires grad, registration order"""
    gradients_source: str
    """where ``grad_bytes`` come from (the model's parameter shapes, a cache)"""
    bucket_cap_mb: float | None = None
    """the job's ``bucket_cap_mb`` (None: DDP's default)"""
    interconnect: Interconnect = field(default_factory=Interconnect)
    measured: Mapping[str, LinkCost] = field(default_factory=dict)
    """links measured by the probes or in the job: ``network`` and ``intra:<node>``; they replace the
    config's and the catalog's"""
    measured_note: str = ""
    """what was measured, or why nothing was (a simulated cluster)"""
    backward_share: float = DEFAULT_BACKWARD_SHARE
    backward_share_source: str = ASSUMED_BACKWARD_SHARE_SOURCE
    job_sync: Mapping[str, JobSync] = field(default_factory=dict)
    """ring shape (``ring_shape``) -> what a real run of this job on that ring measured of its synchronisation"""

    def buckets(self) -> tuple[Bucket, ...]:
        return ddp_buckets(self.grad_bytes, self.bucket_cap_mb)


def backward_share_of(profiles: Sequence[DeviceProfile]) -> tuple[float, str]:
    """(backward share, its source) for a plan over ranks with these profiles: the median of the shares the
    profiles know (per GPU type: the estimator's, or timed on the GPU by a measured profile), else
    ``DEFAULT_BACKWARD_SHARE`` as assumed."""
    known = sorted({(p.gpu, p.backward_share, p.method) for p in profiles if p.backward_share is not None})
    if not known:
        return DEFAULT_BACKWARD_SHARE, ASSUMED_BACKWARD_SHARE_SOURCE
    share = float(np.median([s for _, s, _ in known]))
    listed = ", ".join(f"{gpu} {s:.2f}" for gpu, s, _ in known)
    measured = sorted({gpu for gpu, _, method in known if method == "measure"})
    if not measured:
        return (
            share,
            f"estimated: the backward pass's kernels' share of the forward + backward roofline time ({listed})",
        )
    how = "measured" if len(measured) == len({gpu for gpu, _, _ in known}) else "measured and estimated"
    return (
        share,
        f"{how}: the backward pass's share of forward + backward, timed on {', '.join(measured)} ({listed})",
    )


@dataclass(frozen=True, kw_only=True)
class Hop:
    """A link class a ring crosses."""

    hop: str
    """``intra <node>`` or ``network <node>``"""
    link: LinkCost
    assumed: bool = False
    """the assumed default network (nothing stated or measured it)"""


def ring_shape(slots: Sequence[RankSlot], hops: Sequence[Hop]) -> str:
    """What a measured synchronisation must match to answer a ring: its nodes with their ranks, and each hop's
    link with its figures (another rank, node or network is another ring)."""
    counts: dict[str, int] = {}
    for slot in slots:
        counts[slot.node] = counts.get(slot.node, 0) + 1
    links = [
        f"{h.hop}={h.link.name}@{h.link.bus_bytes_per_s:.6g}B/s+{h.link.step_latency_s:.6g}s" for h in hops
    ]
    return ";".join([*(f"{node}x{count}" for node, count in counts.items()), *links])


def ring_hops(slots: Sequence[RankSlot], inputs: SyncInputs) -> tuple[RingCost, tuple[Hop, ...]]:
    """The ring over ``slots`` and the links it crosses (an intra hop per node with two or more ranks, a
    network hop per node when there are two or more nodes), slowed by what a real run of this job on this
    ring measured (``SyncInputs.job_sync``), if one did."""
    counts: dict[str, int] = {}
    gpu_of: dict[str, str] = {}
    for slot in slots:
        counts[slot.node] = counts.get(slot.node, 0) + 1
        gpu_of.setdefault(slot.node, slot.gpu)
    hops: list[Hop] = []
    for node, count in counts.items():
        if count > 1:
            link = inputs.measured.get(f"intra:{node}") or inputs.interconnect.intra_link(
                node, gpu_of[node], count
            )
            hops.append(Hop(hop=f"intra {node}", link=link))
    if len(counts) > 1:
        for node in counts:
            if "network" in inputs.measured:
                hops.append(Hop(hop=f"network {node}", link=inputs.measured["network"]))
                continue
            link, assumed = inputs.interconnect.network_link(node)
            hops.append(Hop(hop=f"network {node}", link=link, assumed=assumed))
    measured = inputs.job_sync.get(ring_shape(slots, hops))
    return _ring(len(slots), len(counts), hops, measured.slowdown if measured else 1.0), tuple(hops)


def _ring(num_ranks: int, num_nodes: int, hops: Sequence[Hop], slowdown: float) -> RingCost:
    intra = [h.link for h in hops if h.hop.startswith("intra")]
    net = [h.link for h in hops if h.hop.startswith("network")]
    return RingCost(
        num_ranks=num_ranks,
        num_nodes=num_nodes,
        intra=min(intra, key=lambda link: link.bus_bytes_per_s) if intra else None,
        network=min(net, key=lambda link: link.bus_bytes_per_s) if net else None,
        slowdown=slowdown,
    )


def section_ring(comm: CommSection) -> tuple[RingCost, tuple[Bucket, ...]]:
    """The ring of a plan's ``comm`` section at its links' own figures (slowdown 1) and its buckets (sizes in
    launch order, each ready when the bytes up to it are): what a running job checks its measured
    synchronisation against."""
    hops = [
        Hop(
            hop=h.hop,
            link=LinkCost(name=h.link, bus_bytes_per_s=h.bus_bytes_per_s, step_latency_s=h.step_latency_s),
        )
        for h in comm.links
    ]
    ring = _ring(comm.num_ranks, comm.num_nodes, hops, 1.0)
    sizes = list(comm.bucket_bytes)
    total, done, buckets = sum(sizes), 0, []
    for size in sizes:
        done += size
        buckets.append(Bucket(param_indices=(), size_bytes=size, ready_share=done / total if total else 1.0))
    return ring, tuple(buckets)


def sync_model(slots: Sequence[RankSlot], inputs: SyncInputs):
    """The allocation's ``SyncModel``: (ranks taking part, compute s) -> exposed sync per optimizer step."""
    buckets = inputs.buckets()
    rings: dict[tuple[int, ...], RingCost] = {}

    def exposed(ranks: np.ndarray, compute_s: float) -> float:
        key = tuple(sorted(int(r) for r in ranks))
        if key not in rings:
            rings[key] = ring_hops([slots[r] for r in key], inputs)[0]
        return exposed_sync_s(buckets, rings[key], compute_s=compute_s, backward_share=inputs.backward_share)

    return exposed


def comm_section(slots: Sequence[RankSlot], allocation: Allocation, inputs: SyncInputs) -> CommSection:
    """The plan's ``comm`` section for the ranks the allocation kept (``slots``, included only)."""
    ring, hops = ring_hops(slots, inputs)
    buckets = inputs.buckets()
    compute_s = allocation.compute_time_s
    backward_s = compute_s * inputs.backward_share
    timeline = sync_timeline(buckets, ring, backward_start_s=compute_s - backward_s, backward_s=backward_s)
    exposed = allocation.sync_time_s
    optimizer_step_s = allocation.accumulate * allocation.step_time_s
    bottleneck = min(hops, key=lambda h: h.link.bus_bytes_per_s) if hops else None
    shape = ring_shape(slots, hops)
    job_sync = inputs.job_sync.get(shape)
    return CommSection(
        gradient_bytes=int(sum(inputs.grad_bytes)),
        num_gradient_tensors=len(inputs.grad_bytes),
        bucket_cap_mb=inputs.bucket_cap_mb,
        bucket_bytes=tuple(b.size_bytes for b in buckets),
        num_ranks=ring.num_ranks,
        num_nodes=ring.num_nodes,
        links=tuple(
            LinkHop(
                hop=h.hop,
                link=h.link.name,
                bus_bytes_per_s=h.link.bus_bytes_per_s,
                step_latency_s=h.link.step_latency_s,
                source=h.link.source,
            )
            for h in hops
        ),
        bottleneck=bottleneck.hop if bottleneck is not None else None,
        allreduce_s=timeline.allreduce_total_s if ring.num_ranks > 1 else 0.0,
        exposed_s=exposed,
        # how sure: from full overlap (the model's figure) to none (every all-reduce after the backward pass,
        # as when the collective competes with the compute for the same units); PyTorch's published DDP
        # benchmark sits near the no-overlap end (bench/bench_comm.py)
        exposed_range_s=(
            exposed,
            exposed_sync_s(
                buckets,
                ring,
                compute_s=compute_s,
                backward_share=inputs.backward_share,
                overlap_efficiency=0.0,
            ),
        ),
        compute_s=compute_s,
        exposed_share=exposed / optimizer_step_s if optimizer_step_s > 0 else 0.0,
        backward_share=inputs.backward_share,
        backward_share_source=inputs.backward_share_source,
        gradients_source=inputs.gradients_source,
        measured=inputs.measured_note,
        ring_shape=shape,
        slowdown=ring.slowdown,
        exposed_source=job_sync.source
        if job_sync is not None
        else ("the links' model" if ring.num_ranks > 1 else "none: one rank"),
        job_sync=job_sync,
    )


def assumed_network_warning(slots: Sequence[RankSlot], inputs: SyncInputs) -> str | None:
    """One warning when the plan's ring crosses a network nobody stated or measured."""
    _, hops = ring_hops(slots, inputs)
    assumed = [h.hop.removeprefix("network ") for h in hops if h.assumed]
    if not assumed:
        return None
    return (
        f"the network between nodes is not stated: {DEFAULT_NETWORK_GBPS:g} Gb/s Ethernet assumed for "
        f"{', '.join(assumed)} in the gradient synchronisation (state it in the cluster config: a network: "
        "mapping with gbps: and latency_us:, per node where they differ)"
    )


def sync_advice(allocation: Allocation, section: CommSection) -> list[str]:
    """When the exposed synchronisation is over ``ADVISE_EXPOSED_SHARE`` of the step: accumulating more
    micro-steps under ``no_sync()`` (a larger global batch, the same per-rank batches) with its gain."""
    share = section.exposed_share
    if share <= ADVISE_EXPOSED_SHARE or allocation.sync_time_s <= 0:
        return []
    a, compute, sync = allocation.accumulate, allocation.compute_time_s, allocation.sync_time_s
    now = a * allocation.step_batch / (a * compute + sync)
    for k in _ACCUMULATE_TRIALS:
        new_share = sync / (k * a * compute + sync)
        if new_share <= ADVISE_EXPOSED_SHARE / 2 or k == _ACCUMULATE_TRIALS[-1]:
            break
    rate = k * a * allocation.step_batch / (k * a * compute + sync)
    return [
        f"gradient synchronisation is {share:.0%} of the step ({sync * 1e3:.1f} ms exposed per optimizer step "
        f"over {section.bottleneck}): accumulating {k * a} micro-steps under DDP's no_sync() (global batch "
        f"{k * a * allocation.step_batch}, the same per-rank batches) would give {rate:,.0f} samples/s, "
        f"{rate / now:.2f}× faster (sync {new_share:.0%} of the step); so would a faster network"
    ]


def plan_comm_fields(
    slots: Sequence[RankSlot], allocation: Allocation, inputs: SyncInputs | None
) -> tuple[CommSection | None, list[str], list[str]]:
    """(the ``comm`` section, warnings, notes) the synchronisation adds to a plan over the included ``slots``.
    Without ``inputs`` (the model's gradients unknown) nothing is added."""
    if inputs is None:
        return None, [], []
    section = comm_section(slots, allocation, inputs)
    warnings = [w for w in (assumed_network_warning(slots, inputs),) if w]
    warnings.extend(sync_advice(allocation, section))
    notes = [inputs.measured_note] if inputs.measured_note else []
    if section.job_sync is not None:
        notes.append(f"exposed gradient synchronisation {section.exposed_source}")
    return section, warnings, notes


def comm_summary(plan: Plan) -> str | None:
    """One line for people: compute and exposed synchronisation per optimizer step, its share, the link."""
    comm = plan.comm
    if comm is None:
        return None
    if comm.num_ranks <= 1:
        return "gradient sync: none (one GPU)"
    exposed_ms, allreduce_ms = comm.exposed_s * 1e3, comm.allreduce_s * 1e3
    slowest = next((link for link in comm.links if link.hop == comm.bottleneck), None)
    over = (
        f"{comm.bottleneck} ({slowest.link}, {slowest.bus_bytes_per_s / 1e9:.3g} GB/s, "
        f"{slowest.source.split(' (')[0]})"
        if slowest
        else "?"
    )
    slowed = (
        f"; measured in the job: all-reduces {comm.job_sync.slowdown:.3g}× the links' time"
        if comm.job_sync is not None
        else ""
    )
    return (
        f"gradient sync: {comm.gradient_bytes / 1e6:.1f} MB in {len(comm.bucket_bytes)} buckets; "
        f"compute {comm.compute_s * 1e3:.1f} ms + exposed sync {exposed_ms:.1f} ms per optimizer step "
        f"({comm.exposed_share:.0%} of it; all-reduce {allreduce_ms:.1f} ms, the rest overlaps "
        f"backward, up to {comm.exposed_range_s[1] * 1e3:.1f} ms without overlap) over {over}{slowed}"
    )
