"""The probes measure the network they can reach: a short timed all-reduce among the NodeProbe actors (one
per node), fitted to ``T(s) = alpha + (2(n-1)/n)·s/busbw`` (``torchkit.estimate.ddp_sync.fit_link``), cached per
cluster.

torch.distributed among the probes: gloo over TCP when the nodes have no CUDA, NCCL on GPUs when they do
(then the figure is the GPUs' own path, NIC included). Message sizes around DDP's buckets (1 MiB, its first;
8 MiB; 25 MiB, its cap), ``PROBE_WARMUPS`` untimed runs then ``PROBE_REPEATS`` timed ones per size, each after
a barrier; the median per size is what is fitted (nccl-tests-style, sized to seconds). The ring of the probes
crosses every node's network link once, so the fit is the slowest network link of the cluster.

A simulated cluster measures nothing (its nodes share this machine's loopback): the plan says so.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from planner.errors import ConfigError
from planner.profiles.cache import untrusted_cache_dir
from planner.trust import UntrustedPathError, read_trusted, write_trusted
from torchkit.estimate.ddp_sync import LinkCost, fit_link
from torchkit.units import MIB

log = logging.getLogger(__name__)

PROBE_SIZES_BYTES = (1 * MIB, 8 * MIB, 25 * MIB)
PROBE_WARMUPS = 2
PROBE_REPEATS = 5
PROBE_TIMEOUT_S = 120.0
"""the process group's timeout: a probe that cannot reach the others fails within it"""


def timed_allreduce(rank: int, world: int, master_addr: str, master_port: int,
                    sizes: Sequence[int] = PROBE_SIZES_BYTES, repeats: int = PROBE_REPEATS,
                    timeout_s: float = PROBE_TIMEOUT_S) -> list[float]:
    """Join a process group of ``world`` probes and time an all-reduce of each of ``sizes`` bytes; the
    median seconds per size (every rank returns its own; rank 0's is the one used)."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://{master_addr}:{master_port}",
                            rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
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
    return LinkCost(name="network", bus_bytes_per_s=fit.bus_bytes_per_s, step_latency_s=fit.alpha_s / (2 * (world - 1)),
                    source=f"measured by the probes ({backend} all-reduce among {world} nodes, "
                           f"{fit.bus_bytes_per_s / 1e9:.3g} GB/s busbw, alpha {fit.alpha_s * 1e6:.0f} µs, "
                           f"fit error {fit.rms_relative_error:.0%})")


def _cache_path(cache_dir: str | os.PathLike, nodes: Sequence[str]) -> Path:
    digest = hashlib.sha256("\0".join(sorted(nodes)).encode()).hexdigest()[:24]
    return Path(cache_dir) / "links" / f"{digest}.json"


_FIX = "it is measured again"
_MAX_ENTRY_BYTES = 2**16


def cached_network(cache_dir: str | os.PathLike | None, nodes: Sequence[str]) -> LinkCost | None:
    """The network measured earlier for these nodes, if cached where no other user could have written it
    (``planner.trust``); an entry that is not trusted or not readable is said on stderr and measured again.

    Raises:
        FieldError: (``cache_dir``) the cache directory, or one above it, is not trusted.
    """
    if cache_dir is None:
        return None
    path = _cache_path(cache_dir, nodes)
    try:
        raw = read_trusted(path, what="measured network cache entry", fix=_FIX, max_bytes=_MAX_ENTRY_BYTES)
        if raw is None:
            return None
        data = json.loads(raw)
        return LinkCost(name="network", bus_bytes_per_s=float(data["bus_bytes_per_s"]),
                        step_latency_s=float(data["step_latency_s"]), source=f"{data['source']} (cached)")
    except UntrustedPathError as exc:
        if exc.in_directory:
            raise untrusted_cache_dir(exc) from None
        log.warning("%s: not trusted; %s", exc.problem, _FIX)
    except (ConfigError, ValueError, KeyError, TypeError) as exc:
        log.warning("measured network cache entry %s is unreadable (%s); %s", path, exc, _FIX)
    return None


def store_network(cache_dir: str | os.PathLike | None, nodes: Sequence[str], link: LinkCost) -> None:
    """Cache a measured network for these nodes (``planner.trust.write_trusted``); a failure costs a re-measure,
    nothing else."""
    if cache_dir is None:
        return
    path = _cache_path(cache_dir, nodes)
    text = json.dumps({"bus_bytes_per_s": link.bus_bytes_per_s, "step_latency_s": link.step_latency_s,
                       "source": link.source})
    try:
        write_trusted(path, text, what="measured network cache entry", fix="check the cache directory")
    except (OSError, ConfigError) as exc:
        log.warning("%s", exc)
