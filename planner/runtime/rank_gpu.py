"""Is this rank on the GPU its plan entry was sized for? A T4 node started with the A100 node's ``--node-rank``
takes the A100's batch (229 where the T4's cap is 182) and runs out of memory in its first step; here it is
refused before any collective, with the ``--node-rank`` this machine has in the plan.

The GPU is read through NVML at the entry's ``device_index`` (NVML numbers devices in PCI order, as the
plan's ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` lines do) and compared with the entry: the same catalog type (names
and NVML aliases resolved through ``cluster_configs/gpus.yaml``) and a total memory within
``MEMORY_REL_TOLERANCE`` of the entry's. Pure Python over ``GpuStats``; NVML is read only by
:func:`local_gpu`, when the process runs under its node's device environment (the plan's launch line sets
``CUDA_VISIBLE_DEVICES`` to the node's devices): a CPU test of a GPU plan, or a job on a machine without
NVML, is not checked, and says so once in the log.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping

from planner.errors import ConfigError
from planner.plan.rank_view import RankView
from planner.plan.types import Plan, RankEntry
from torchkit.hardware.nvml import GpuStats, NvmlUnavailableError
from torchkit.units import GIB

log = logging.getLogger(__name__)

#: total memory of the same GPU type differs by ECC (1/16 of it: 15360 vs 16384 MiB on a T4) and by driver
#: reservations; a different memory size of one name (A100 40 vs 80 GB) differs by far more
MEMORY_REL_TOLERANCE = 0.10
#: most nodes an error message names
_MAX_NAMED_NODES = 8


def local_gpu(view: RankView, environ: Mapping[str, str]) -> GpuStats | None:
    """This machine's GPU at the rank's ``device_index``, through NVML; None when it cannot be checked here
    (not launched under the node's device list, or no NVML), which is logged.

    Raises:
        ConfigError: launched under the node's device list, but NVML has no GPU of that index.
    """
    if environ.get("CUDA_VISIBLE_DEVICES") != view.node.cuda_visible_devices:
        log.debug(
            "rank %d: not launched under its node's CUDA_VISIBLE_DEVICES; its GPU is not checked",
            view.entry.rank,
        )
        return None
    from torchkit.hardware.nvml import read_local_gpu_stats

    try:
        stats = read_local_gpu_stats()
    except NvmlUnavailableError as exc:
        log.info("rank %d: the GPU it runs on is not checked against the plan (%s)", view.entry.rank, exc)
        return None
    for gpu in stats:
        if gpu.index == view.entry.device_index:
            return gpu
    seen = ", ".join(str(g.index) for g in stats) or "none"
    raise ConfigError(
        f"rank {view.entry.rank} is planned on GPU {view.entry.device_index} of node {view.entry.node!r}, but this "
        f"machine's NVML has no GPU {view.entry.device_index} (it has {seen}): run this node's own line of the plan "
        f"(batchplan show PLAN)"
    )


def same_gpu(entry: RankEntry, gpu: GpuStats) -> bool:
    """``gpu`` is the type the entry names, with about its memory."""
    catalog = _catalog()

    def canonical(name: str) -> str:
        spec = catalog.resolve(name)
        return spec.name if spec is not None else name.strip().lower()

    memory_close = (
        abs(gpu.memory_total_bytes - entry.total_memory_bytes)
        <= MEMORY_REL_TOLERANCE * entry.total_memory_bytes
    )
    return canonical(gpu.name) == canonical(entry.gpu) and memory_close


@functools.cache
def _catalog():
    from torchkit.hardware.catalog import load_catalog

    return load_catalog()


def check_rank_gpu(view: RankView, gpu: GpuStats, where: str, whole: Callable[[], Plan]) -> None:
    """Refuse a rank whose GPU is not the one its entry was planned for, naming the right ``--node-rank``.

    Args:
        whole: the whole plan, read only when the GPU differs (to find the nodes that have this GPU).
    """
    entry = view.entry
    if same_gpu(entry, gpu):
        return
    here = f"{gpu.name} ({gpu.memory_total_bytes / GIB:.1f} GiB)"
    planned = f"{entry.gpu} ({entry.total_memory_bytes / GIB:.1f} GiB)"
    plan = whole()
    matching = {r.node_rank for r in plan.ranks if same_gpu(r, gpu)}
    matches = [node for node in plan.nodes if node.node_rank in matching]
    if matches:
        named = ", ".join(f"{n.name} (--node-rank {n.node_rank})" for n in matches[:_MAX_NAMED_NODES])
        more = f" and {len(matches) - _MAX_NAMED_NODES} more" if len(matches) > _MAX_NAMED_NODES else ""
        fix = (
            f"this machine's GPUs are those of node {named}{more} in the plan: start it with that node's line, "
            f"--node-rank {matches[0].node_rank}"
        )
    else:
        fix = (
            f"no node of the plan has a {gpu.name}: re-plan with this machine in the cluster (batchplan plan)"
        )
    raise ConfigError(
        f"{where}: rank {entry.rank} is planned for a {planned} on node {entry.node!r} (--node-rank "
        f"{entry.node_rank}), but GPU {entry.device_index} here is a {here}, so its batch {entry.batch} was sized "
        f"for another GPU; {fix}"
    )
