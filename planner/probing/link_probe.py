"""The probes measure the network they can reach: a short timed all-reduce among the NodeProbe actors (one
per node), fitted to ``T(s) = alpha + (2(n-1)/n)·s/busbw`` (``torchkit.estimate.ddp_sync.fit_link``), cached per
cluster.

torch.distributed among the probes: gloo over TCP when the nodes have no CUDA, NCCL on GPUs when they do
(then the figure is the GPUs' own path, NIC included). Message sizes around DDP's buckets (1 MiB, its first;
8 MiB; 25 MiB, its cap), ``PROBE_WARMUPS`` untimed runs then ``PROBE_REPEATS`` timed ones per size, each after
a barrier; the median per size is what is fitted (nccl-tests-style, sized to seconds). The ring of the probes
crosses every node's network link once, so the fit is the slowest network link of the cluster. The fit is kept
in the cache directory per set of nodes (``planner.store``, namespace ``links``).

A simulated cluster measures nothing (its nodes share this machine's loopback): the plan says so.
"""

from __future__ import annotations

import dataclasses
import hashlib
import statistics
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta

from planner.codec import convert
from planner.errors import ConfigError
from planner.store import CacheStore, Namespace
from torchkit.estimate.ddp_sync import LinkCost, fit_link
from torchkit.units import MIB

PROBE_SIZES_BYTES = (1 * MIB, 8 * MIB, 25 * MIB)
PROBE_WARMUPS = 2
PROBE_REPEATS = 5
PROBE_TIMEOUT_S = 120.0
"""the process group's timeout: a probe that cannot reach the others fails within it"""


def timed_allreduce(
    rank: int,
    world: int,
    master_addr: str,
    master_port: int,
    sizes: Sequence[int] = PROBE_SIZES_BYTES,
    repeats: int = PROBE_REPEATS,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> list[float]:
    """Join a process group of ``world`` probes and time an all-reduce of each of ``sizes`` bytes; the
    median seconds per size (every rank returns its own; rank 0's is the one used)."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        init_method=f"tcp://{master_addr}:{master_port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )
    try:
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        medians = []
        for size in sizes:
            buffer = torch.ones(size // 4, device=device)
            runs = []
            for i in range(PROBE_WARMUPS + repeats):
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(buffer)
                if cuda:
                    torch.cuda.synchronize()
                if i >= PROBE_WARMUPS:
                    runs.append(time.perf_counter() - start)
            medians.append(statistics.median(runs))
        dist.barrier()
        return medians
    finally:
        dist.destroy_process_group()


def network_link(sizes: Sequence[int], times_s: Sequence[float], world: int, backend: str) -> LinkCost:
    """The measured network as the ring model's link: busbw from the fit, alpha spread over the ring's
    2(n-1) steps (the probes' ring crosses the network at every step)."""
    fit = fit_link(list(sizes), list(times_s), world)
    return LinkCost(
        name="network",
        bus_bytes_per_s=fit.bus_bytes_per_s,
        step_latency_s=fit.alpha_s / (2 * (world - 1)),
        source=f"measured by the probes ({backend} all-reduce among {world} nodes, "
        f"{fit.bus_bytes_per_s / 1e9:.3g} GB/s busbw, alpha {fit.alpha_s * 1e6:.0f} µs, "
        f"fit error {fit.rms_relative_error:.0%})",
    )


def _key(inputs: Mapping[str, str]) -> str:
    """The file name the release before the store gave a measured network (its entries keep theirs)."""
    return hashlib.sha256("\0".join(inputs["nodes"].split(",")).encode()).hexdigest()[:24]


def _legacy(document: object, where: str) -> tuple[LinkCost, None]:
    """An entry of the release before the store: the link's figures without its name."""
    if not isinstance(document, dict):
        raise ConfigError(f"{where} is not a JSON object")
    return convert(LinkCost, {"name": "network", **document}, where=where), None


LINKS: Namespace[LinkCost] = Namespace(
    what="measured network cache entry",
    folder="links",
    schema="batchplan/link-cache@1",
    payload="link",
    value_type=LinkCost,
    key_of=_key,
    redo="measuring it again",
    legacy=_legacy,
)


def cached_network(store: CacheStore | None, nodes: Sequence[str]) -> LinkCost | None:
    """The network measured earlier for these nodes, if cached."""
    link = store.read(LINKS, _key({"nodes": ",".join(sorted(nodes))})) if store is not None else None
    return dataclasses.replace(link, source=f"{link.source} (cached)") if link is not None else None


def store_network(store: CacheStore | None, nodes: Sequence[str], link: LinkCost) -> None:
    """Cache a measured network for these nodes; a failure costs a re-measure (said in ``problems``)."""
    if store is not None:
        try:
            store.write(LINKS, {"nodes": ",".join(sorted(nodes))}, link)
        except ConfigError as exc:
            store.problems.append(f"{exc}; the network is measured again next time")
