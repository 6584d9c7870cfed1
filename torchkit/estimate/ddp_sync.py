"""DDP's gradient synchronisation: buckets as PyTorch builds them, an alpha-beta ring all-reduce per bucket
over the slowest link, and what of it the backward pass does not hide.

A DDP step ends with an all-reduce of every gradient. DDP groups the gradients into buckets and launches a
bucket's all-reduce as soon as its last gradient is ready, so most of it overlaps the rest of the backward
pass; what remains after the backward pass ends is the *exposed* synchronisation, the part a step pays.

Buckets (``ddp_buckets``, ``torch/nn/parallel/distributed.py`` and ``reducer.cpp``
``compute_bucket_assignment_by_size``): gradients in gradient-ready order, which DDP approximates by the
reverse of the parameter order (and, from the second iteration on, rebuilds in the order it observed: for a
feed-forward model the same). A bucket takes gradients until its size reaches its limit (the gradient that
crosses the limit is the bucket's last). Limits: the first bucket 1 MiB (``dist._DEFAULT_FIRST_BUCKET_BYTES``,
"so the first-defined parameters' gradients don't spill into a larger bucket") and the others
``bucket_cap_mb`` MiB (25 by default); with a ``bucket_cap_mb`` of the user's, the first bucket has that cap
too (torch ≥ 2.6 ``BucketCapacityConfig``).

All-reduce of ``s`` bytes over a ring of ``n`` ranks on ``N`` nodes (``RingCost``; nccl-tests
``doc/PERFORMANCE.md`` and NCCL's own tuner ``src/graph/tuning.cc``)::

    T(s) = alpha + (2(n-1)/n) · s / busbw
    alpha = base + (2(n-1) - n_inter) · alpha_intra + n_inter · alpha_net,   n_inter = 2(N-1)

``busbw`` is the slowest link the ring crosses (every link of a ring carries 2(n-1)/n · s): the intra-node
link of every node with two or more ranks and, with two or more nodes, every node's network link.
NCCL's constants are the prior (``torchkit.hardware.links``): base 8.4 µs, 3.4 µs per NVLink step, 5.7 µs per
PCIe step, 14 µs per network step; measured links replace them (``fit_link``). A running job's measured
exposed synchronisation gives the ring a ``slowdown`` k (``fit_slowdown``): every all-reduce takes k·T(s), the
one figure that makes the model's exposed time at the measured compute the measured one.

Overlap (``exposed_sync_s``): the slowest rank's backward runs from ``backward_start_s`` for ``backward_s``;
bucket k is ready on every rank when that rank has produced ``ready_share_k`` of the gradient bytes
(approximation: gradient bytes are produced at a constant rate through the backward pass). One
communication stream::

    ready_k = backward_start_s + backward_s · ready_share_k
    start_k = max(ready_k, end_{k-1}),   end_k = start_k + T(s_k)
    exposed = max(0, end_K - (backward_start_s + backward_s))

With gradient accumulation under ``no_sync()`` only the last micro-step of an optimizer step synchronises,
so the exposed time is paid once per optimizer step, not per micro-step.

Known limitations: gradients are assumed produced uniformly in backward time (a model whose last layers
hold most parameters, as VGG's classifier, releases them early and overlaps better than modelled); one
ring (NCCL's trees and multiple channels are not modelled, and busbw is what one ring reaches); the
optimizer step is not overlapped. Pure Python: no torch at import (``gradient_bytes_of`` imports it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torchkit.hardware.links import NCCL_BASE_LATENCY_S
from torchkit.units import MIB

DEFAULT_BUCKET_CAP_MIB = 25
"""DDP's ``bucket_cap_mb`` default (``torch/nn/parallel/distributed.py`` ``_DEFAULT_BUCKET_CAP_MB``)"""
FIRST_BUCKET_BYTES = 1 * MIB
"""``dist._DEFAULT_FIRST_BUCKET_BYTES``: the first (last-ready) bucket's limit with the default cap"""


@dataclass(frozen=True, kw_only=True)
class Bucket:
    """One DDP gradient bucket."""

    param_indices: tuple[int, ...]
    """indices of its parameters in registration order (``model.parameters()``), in the order they fill it"""
    size_bytes: int
    """gradient bytes it all-reduces"""
    ready_share: float
    """share of all gradient bytes produced when this bucket's last gradient is ready (in (0, 1])"""


def ddp_buckets(
    grad_bytes: Sequence[int], bucket_cap_mb: float | None = None, *, ready_order: Sequence[int] | None = None
) -> tuple[Bucket, ...]:
    """DDP's buckets, in the order their all-reduces launch, for parameters whose gradients have
    ``grad_bytes`` (registration order; parameters without a gradient left out by the caller).

    ``bucket_cap_mb``: DDP's argument (None: DDP's default, 25 MiB with a 1 MiB first bucket).
    ``ready_order``: the parameter indices in the order their gradients become ready, where known (DDP
    records it, ``prev_iteration_grad_ready_order_indices`` of ``_get_ddp_logging_data()``); default the
    reverse registration order. (Convolutions and norms release the weight's gradient before the bias's, so
    the observed order swaps those pairs; the bucket sizes move by a bias at a boundary.)
    Raises ValueError for a cap that is not positive or an order that is not a permutation.
    """
    if bucket_cap_mb is not None and not bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb must be > 0, got {bucket_cap_mb!r}")
    cap = int((DEFAULT_BUCKET_CAP_MIB if bucket_cap_mb is None else bucket_cap_mb) * MIB)
    limits = [FIRST_BUCKET_BYTES, cap] if bucket_cap_mb is None and cap > FIRST_BUCKET_BYTES else [cap]
    total = sum(grad_bytes)
    buckets: list[Bucket] = []
    indices: list[int] = []
    size = done = 0
    order = list(reversed(range(len(grad_bytes)))) if ready_order is None else [int(i) for i in ready_order]
    if sorted(order) != list(range(len(grad_bytes))):
        raise ValueError(f"ready_order must list each of the {len(grad_bytes)} parameter indices once")
    for index in order:
        indices.append(index)
        size += int(grad_bytes[index])
        done += int(grad_bytes[index])
        if size >= limits[min(len(buckets), len(limits) - 1)]:
            buckets.append(Bucket(param_indices=tuple(indices), size_bytes=size, ready_share=done / total))
            indices, size = [], 0
    if indices:
        buckets.append(Bucket(param_indices=tuple(indices), size_bytes=size, ready_share=1.0))
    return tuple(buckets)


@dataclass(frozen=True, kw_only=True)
class LinkCost:
    """One class of link a ring crosses, as the alpha-beta model sees it."""

    name: str
    """what it is, for people: ``nvlink``, ``pcie``, ``network``, ``loopback``, ..."""
    bus_bytes_per_s: float
    """bus bandwidth (nccl-tests' busbw), bytes/s: what a ring all-reduce sustains over this link"""
    step_latency_s: float
    """latency of one ring step over it, s"""
    source: str = ""
    """where the figures come from: the config, the catalog, an assumed default, a measurement"""

    def __post_init__(self) -> None:
        if not (self.bus_bytes_per_s > 0 and math.isfinite(self.bus_bytes_per_s)):
            raise ValueError(
                f"link {self.name}: bus bandwidth must be finite and > 0, got {self.bus_bytes_per_s!r}"
            )
        if not (self.step_latency_s >= 0 and math.isfinite(self.step_latency_s)):
            raise ValueError(
                f"link {self.name}: step latency must be finite and >= 0, got {self.step_latency_s!r}"
            )


@dataclass(frozen=True, kw_only=True)
class RingCost:
    """The alpha-beta cost of one ring all-reduce over ``num_ranks`` ranks on ``num_nodes`` nodes."""

    num_ranks: int
    num_nodes: int
    intra: LinkCost | None
    """the slowest intra-node link of the nodes with two or more ranks; None when every node has one rank"""
    network: LinkCost | None
    """the slowest network link of the nodes; None on one node"""
    base_latency_s: float = NCCL_BASE_LATENCY_S
    """fixed cost of one all-reduce (NCCL's base latency by default)"""
    slowdown: float = 1.0
    """how many times the links' alpha-beta time an all-reduce inside a DDP step takes, as measured in a
    running job (``fit_slowdown``); 1 where nothing measured it"""

    def __post_init__(self) -> None:
        if not (self.slowdown > 0 and math.isfinite(self.slowdown)):
            raise ValueError(f"ring slowdown must be finite and > 0, got {self.slowdown!r}")

    @property
    def bottleneck(self) -> LinkCost | None:
        """The slowest link the ring crosses (None for one rank)."""
        links = [link for link in (self.intra, self.network) if link is not None]
        return min(links, key=lambda link: link.bus_bytes_per_s) if links else None

    @property
    def alpha_s(self) -> float:
        """base + (2(n-1) - n_inter)·alpha_intra + n_inter·alpha_net, n_inter = 2(N-1); 0 for one rank."""
        if self.num_ranks <= 1:
            return 0.0
        steps = 2 * (self.num_ranks - 1)
        inter = 2 * (self.num_nodes - 1)
        intra_s = self.intra.step_latency_s if self.intra is not None else 0.0
        net_s = self.network.step_latency_s if self.network is not None else 0.0
        return self.base_latency_s + (steps - inter) * intra_s + inter * net_s

    def allreduce_s(self, size_bytes: float) -> float:
        """T(s) = slowdown·(alpha + (2(n-1)/n)·s/busbw) (0 for one rank)."""
        link = self.bottleneck
        if self.num_ranks <= 1 or link is None:
            return 0.0
        factor = 2.0 * (self.num_ranks - 1) / self.num_ranks
        return self.slowdown * (self.alpha_s + factor * size_bytes / link.bus_bytes_per_s)


@dataclass(frozen=True, kw_only=True)
class SyncTimeline:
    """When each bucket's all-reduce runs in one step, and what is left after the backward pass."""

    bucket_start_s: tuple[float, ...]
    bucket_end_s: tuple[float, ...]
    backward_end_s: float
    allreduce_total_s: float
    """Σ T(s_k): the all-reduce time if nothing overlapped"""
    exposed_s: float
    """max(0, end_K - backward end): what the step pays"""


def sync_timeline(
    buckets: Sequence[Bucket],
    ring: RingCost,
    *,
    backward_start_s: float,
    backward_s: float,
    overlap_efficiency: float = 1.0,
) -> SyncTimeline:
    """The bucket schedule on one communication stream (module docstring, "Overlap").

    ``overlap_efficiency`` e in [0, 1]: the speed of the communication while the backward pass still runs,
    as a share of its speed alone. 1 where the all-reduce has its own engines (GPUs: NCCL kernels and the
    NIC, beside the compute); below 1 where it competes with the compute for the same resource (gloo on a
    CPU host runs the reduction on the cores the backward pass keeps busy: e = the share of the
    backward's time its cores are idle). An all-reduce of T(s) started at t before the backward ends at
    b progresses e·(b - t) by then and finishes the rest at full speed."""
    if not 0.0 <= overlap_efficiency <= 1.0:
        raise ValueError(f"overlap_efficiency must be in [0, 1], got {overlap_efficiency!r}")
    backward_end = backward_start_s + backward_s
    end = backward_start_s
    starts, ends = [], []
    total = 0.0
    for bucket in buckets:
        start = max(backward_start_s + backward_s * bucket.ready_share, end)
        work = ring.allreduce_s(bucket.size_bytes)
        total += work
        during = overlap_efficiency * max(0.0, backward_end - start)
        if overlap_efficiency > 0 and during >= work:  # done while the backward runs, at e of its speed
            end = start + work / overlap_efficiency
        else:
            end = max(start, backward_end) + work - during
        starts.append(start)
        ends.append(end)
    exposed = max(0.0, (ends[-1] if ends else backward_end) - backward_end)
    return SyncTimeline(
        bucket_start_s=tuple(starts),
        bucket_end_s=tuple(ends),
        backward_end_s=backward_end,
        allreduce_total_s=total,
        exposed_s=exposed,
    )


def exposed_sync_s(
    buckets: Sequence[Bucket],
    ring: RingCost,
    *,
    compute_s: float,
    backward_share: float,
    overlap_efficiency: float = 1.0,
) -> float:
    """Exposed synchronisation of a step whose slowest rank computes for ``compute_s`` (forward + backward),
    ``backward_share`` of it backward (``sync_timeline`` for ``overlap_efficiency``)."""
    if ring.num_ranks <= 1 or not buckets:
        return 0.0
    backward_s = compute_s * backward_share
    return sync_timeline(
        buckets,
        ring,
        backward_start_s=compute_s - backward_s,
        backward_s=backward_s,
        overlap_efficiency=overlap_efficiency,
    ).exposed_s


SLOWDOWN_RANGE = (1e-3, 1e4)
"""the slowdowns ``fit_slowdown`` searches: a measurement that needs more is clamped to the range's end"""


def fit_slowdown(
    buckets: Sequence[Bucket],
    ring: RingCost,
    *,
    compute_s: float,
    backward_share: float,
    exposed_s: float,
    resolution_s: float = 1e-4,
) -> float:
    """The ring slowdown k (``RingCost.slowdown``, relative to ``ring``'s own) with which the model's exposed
    synchronisation at the measured ``compute_s`` and ``backward_share`` equals the measured ``exposed_s``.

    The exposed time grows with k (slower all-reduces finish later), so k is found by bisection on log k
    within ``SLOWDOWN_RANGE``. A measurement below ``resolution_s`` (what a step's timers tell from nothing)
    only says "at most that": k is 1 where the model exposes no more, else the k at which it exposes
    ``resolution_s``. Raises ValueError for one rank (nothing to synchronise) or a negative measurement."""
    if ring.num_ranks <= 1 or not buckets:
        raise ValueError("a slowdown needs a ring of two or more ranks and gradients to synchronise")
    if not (exposed_s >= 0 and math.isfinite(exposed_s)):
        raise ValueError(f"measured exposed synchronisation must be finite and >= 0, got {exposed_s!r}")
    target_s = max(exposed_s, resolution_s)

    def gap(k: float) -> float:
        scaled = RingCost(
            num_ranks=ring.num_ranks,
            num_nodes=ring.num_nodes,
            intra=ring.intra,
            network=ring.network,
            base_latency_s=ring.base_latency_s,
            slowdown=ring.slowdown * k,
        )
        return exposed_sync_s(buckets, scaled, compute_s=compute_s, backward_share=backward_share) - target_s

    if exposed_s < resolution_s and gap(1.0) <= 0:
        return 1.0
    low, high = (math.log(k) for k in SLOWDOWN_RANGE)
    if gap(math.exp(high)) <= 0:
        return SLOWDOWN_RANGE[1]
    if gap(math.exp(low)) > 0:
        return SLOWDOWN_RANGE[0]
    for _ in range(60):  # 2^-60 of the log range: far below any measurement's noise
        mid = (low + high) / 2
        low, high = (mid, high) if gap(math.exp(mid)) <= 0 else (low, mid)
    return math.exp((low + high) / 2)


@dataclass(frozen=True, kw_only=True)
class LinkFit:
    """alpha and busbw of one link class, fitted from timed all-reduces."""

    alpha_s: float
    """fixed time of one all-reduce, s (intercept)"""
    bus_bytes_per_s: float
    """bus bandwidth: (2(n-1)/n) / slope"""
    num_ranks: int
    rms_relative_error: float
    """root-mean-square of (fit - measured) / measured over the points"""


def fit_link(sizes_bytes: Sequence[float], times_s: Sequence[float], num_ranks: int) -> LinkFit:
    """Least-squares T(s) = alpha + (2(n-1)/n)·s/busbw through timed all-reduces of ``sizes_bytes``, weighted
    by 1/T (relative errors: small and large messages count alike).

    Raises ValueError with fewer than two distinct sizes, fewer than two ranks or a slope ≤ 0."""
    if num_ranks < 2:
        raise ValueError("an all-reduce fit needs at least 2 ranks")
    if len(sizes_bytes) != len(times_s) or len(set(sizes_bytes)) < 2:
        raise ValueError("an all-reduce fit needs times at two or more distinct message sizes")
    w = [1.0 / t for t in times_s]
    sw = sum(wi * wi for wi in w)
    sx = sum(wi * wi * x for wi, x in zip(w, sizes_bytes, strict=True))
    sy = sum(wi * wi * y for wi, y in zip(w, times_s, strict=True))
    sxx = sum(wi * wi * x * x for wi, x in zip(w, sizes_bytes, strict=True))
    sxy = sum(wi * wi * x * y for wi, x, y in zip(w, sizes_bytes, times_s, strict=True))
    slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    if not slope > 0:
        raise ValueError(f"all-reduce times do not grow with the message size (slope {slope:.3g} s/B)")
    alpha = max(0.0, (sy - slope * sx) / sw)
    errors = [(alpha + slope * x - y) / y for x, y in zip(sizes_bytes, times_s, strict=True)]
    rms = math.sqrt(sum(e * e for e in errors) / len(errors))
    factor = 2.0 * (num_ranks - 1) / num_ranks
    return LinkFit(alpha_s=alpha, bus_bytes_per_s=factor / slope, num_ranks=num_ranks, rms_relative_error=rms)


def gradient_bytes_of(model: Any) -> tuple[int, ...]:
    """Gradient bytes of each parameter that requires grad, in registration order (``model.parameters()``,
    each shared parameter once, as DDP sees them). A gradient has its parameter's dtype: fp32 under AMP,
    whose autocast casts activations, not parameters."""
    return tuple(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
