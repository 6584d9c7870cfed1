"""A cluster from SLURM: the nodes and GPUs of the job's allocation (``plan --slurm``) or of a partition
(``preflight --slurm-partition NAME``), read with SLURM's own commands.

- Allocation: the hostnames from ``scontrol show hostnames $SLURM_JOB_NODELIST`` (in SLURM's node order,
  which is the order of ``SLURM_NODEID``), the GPUs each node holds for this job from the per-node ``GRES=``
  of ``scontrol show job -d $SLURM_JOB_ID``. On the node batchplan runs on, NVML's answer wins where a driver
  is present (the real GPU names and what other processes hold); other nodes are planned from their GRES.
- Partition: ``sinfo -N -h -p NAME -o "%N|%G|%t|%m|%c"`` (node, GRES, state, memory MB, CPUs); nodes that
  are down, drained, failed or in maintenance are left out, with the reason in :attr:`SlurmCluster.skipped`.

GRES type names are chosen by each site (``gpu:a100:4``); ``planner.probing.slurm_gres.DEFAULT_GRES_TYPES`` maps the common ones to
catalog types and ``--gres-type NAME=TYPE`` adds or overrides a mapping for one run. A name that is neither in
the table nor a catalog name or alias is an error naming the fix. Where a name is ambiguous the smaller-memory
variant is taken (``a100`` is the 40 GB card): a plan made for less memory never runs out of it.

Pure parsing functions over SLURM's text (the GRES strings: ``planner.probing.slurm_gres``), and one thin edge
(``planner.probing.slurm_command.run_slurm_command``) that runs SLURM's commands.

GPUs are numbered 0..n-1 as the job sees them: SLURM sets a step's ``CUDA_VISIBLE_DEVICES`` to the cards it
allocated, and CUDA (in PCI order, ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` as the launch lines set it) numbers them from
0. Where ``scontrol show job -d`` prints the cards' node indices (``gpu:t4:2(IDX:0-1),gpu:a10:2(IDX:2-3)``,
``gpu(IDX:0,2)``), the job's card k is the one with the k-th smallest index; otherwise the entries are taken in
the order SLURM prints them. What SLURM prints is held to a cluster config's limits (``planner.cluster``: node
names, GPUs per node, nodes, GPUs in all, CPUs, memory) before a GPU is built, and read as bytes: output over
``MAX_SLURM_OUTPUT_BYTES`` or a byte that is not UTF-8 in a field batchplan uses is one error line.

Known limitations: a GRES with no type (``gpu:4``) needs ``--gres-type gpu=TYPE``; MIG and shard GRES are not
counted.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from planner.cluster import (
    MAX_CLUSTER_GPUS,
    MAX_CPU_COUNT,
    MAX_GPUS_PER_NODE,
    MAX_HOST_MEMORY_GIB,
    MAX_NODES,
    ClusterSpec,
    NodeSpec,
    SimulatedGpu,
    node_name_problem,
)
from planner.errors import ConfigError
from planner.probing.slurm_command import run_slurm_command
from planner.probing.slurm_gres import MAX_NUMBER_DIGITS, GresGpus, gres_gpu_spec, gres_table, parse_gres_gpus
from torchkit.hardware.catalog import GpuCatalog, GpuSpec, load_catalog
from torchkit.terminal_text import printable

#: sinfo states (``%t``, compact form, a trailing ``*``/``~``/``#`` flag stripped) whose nodes can run a job
USABLE_STATES = frozenset({"idle", "mix", "alloc", "comp", "resv", "plnd"})

_JOB_ID = re.compile(r"[0-9]{1,20}", re.ASCII)
_HOSTLIST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._,\[\]-]*", re.ASCII)


@dataclass(frozen=True, kw_only=True)
class SlurmCluster:
    """What SLURM said, as a cluster to plan, and what was left out."""

    cluster: ClusterSpec
    """nodes named by their SLURM hostnames, in SLURM's node order"""
    skipped: tuple[str, ...] = ()
    """one line per node left out (down, drained, no GPU), with the reason"""
    nvml_nodes: tuple[str, ...] = ()
    """nodes whose GPUs NVML read (this host, with a driver) rather than their GRES"""


def _node(
    name: str,
    gres: Sequence[GresGpus],
    table: Mapping[str, str],
    catalog: GpuCatalog,
    *,
    cpu_count: int | None = None,
    memory_mb: int | None = None,
) -> NodeSpec:
    """A node SLURM lists, its GPUs numbered 0..n-1 as the job sees them: by SLURM's card index where every
    entry prints one (``IDX:``), else in the order printed. Held to a cluster config's limits first."""
    _check_node_name(name)
    total = sum(entry.count for entry in gres)
    if total > MAX_GPUS_PER_NODE:
        raise ConfigError(
            f"node {name}: SLURM lists {total} GPUs, over the limit of {MAX_GPUS_PER_NODE} per node "
            "(a cluster config's; check `scontrol show node`)"
        )
    if cpu_count is not None and cpu_count > MAX_CPU_COUNT:
        raise ConfigError(
            f"node {name}: SLURM lists {cpu_count} CPUs, over the limit of {MAX_CPU_COUNT} (a cluster "
            "config's; check `scontrol show node`)"
        )
    if memory_mb is not None and memory_mb > MAX_HOST_MEMORY_GIB * 1024:
        raise ConfigError(
            f"node {name}: SLURM lists {memory_mb} MB of memory, over the limit of "
            f"{MAX_HOST_MEMORY_GIB} GiB (a cluster config's; check `scontrol show node`)"
        )
    by_index = all(entry.indices is not None for entry in gres)
    cards: list[
        tuple[int, GpuSpec]
    ] = []  # (SLURM's index on the node, or the printed order; the card's type)
    for entry in gres:
        spec = gres_gpu_spec(entry.gres_type, table, catalog, f"node {name}")
        for k in range(entry.count):
            cards.append((entry.indices[k] if by_index and entry.indices is not None else len(cards), spec))
    if by_index and len({position for position, _ in cards}) != len(cards):
        raise ConfigError(
            f"node {name}: SLURM lists a GPU index in two GRES entries (is this SLURM's "
            "`scontrol show job -d`?)"
        )
    cards.sort(key=lambda card: card[0])
    gpus = tuple(SimulatedGpu(index=job_index, spec=spec) for job_index, (_, spec) in enumerate(cards))
    memory = memory_mb * 2**20 if memory_mb else None
    return NodeSpec(name=name, gpus=gpus, cpu_count=cpu_count or None, host_memory_bytes=memory)


def _check_node_name(name: str) -> None:
    problem = node_name_problem(name)
    if problem is not None:
        raise ConfigError(f"SLURM lists a {problem} (check `sinfo -N` and `scontrol show hostnames`)")


def _check_cluster_size(num_nodes: int, num_gpus: int, what: str) -> None:
    """A cluster config's limits on nodes and GPUs in all, checked as SLURM's nodes are read."""
    if num_nodes > MAX_NODES:
        raise ConfigError(
            f"{what} lists over {MAX_NODES} nodes, the limit of a cluster config (plan a smaller "
            "partition or job)"
        )
    if num_gpus > MAX_CLUSTER_GPUS:
        raise ConfigError(
            f"{what} holds over {MAX_CLUSTER_GPUS} GPUs, the limit of a cluster config and a plan's "
            "ranks (plan a smaller partition or job)"
        )


def _field_number(text: str, what: str, node: str) -> int | None:
    """A number field of ``sinfo`` (CPUs, memory MB), None where SLURM prints none; over nine digits it is over
    every limit, said before it is read."""
    text = text.rstrip("+")  # sinfo marks a range of values with a trailing '+'
    if not (text.isascii() and text.isdigit()):
        return None
    if len(text) > MAX_NUMBER_DIGITS:
        raise ConfigError(
            f"node {node}: SLURM lists {text[:12]}... {what} ({len(text)} digits), over a cluster "
            "config's limit (check `scontrol show node`)"
        )
    return int(text)


def parse_sinfo_nodes(
    text: str, *, partition: str, table: Mapping[str, str], catalog: GpuCatalog
) -> SlurmCluster:
    """``sinfo -N -h -p NAME -o "%N|%G|%t|%m|%c"`` -> the partition's usable GPU nodes.

    Raises:
        ConfigError: no line (no such partition) or no usable GPU node.
    """
    nodes: dict[str, NodeSpec] = {}
    skipped: list[str] = []
    seen: set[str] = set()
    num_gpus = 0
    what = f"SLURM partition {partition!r}"
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split("|")]
        if len(fields) != 5:
            raise ConfigError(
                f"sinfo printed {line[:120]!r}, not NODE|GRES|STATE|MEMORY|CPUS (is this SLURM's sinfo?)"
            )
        name, gres, state, memory, cpus = fields
        if name in seen:  # a node in several partitions is listed once per partition
            continue
        _check_node_name(name)
        seen.add(name)
        _check_cluster_size(len(seen), num_gpus, what)
        state = state.rstrip("*~#!%$@^-+").lower()
        if state not in USABLE_STATES:
            skipped.append(
                f"{name}: state {printable(state, max_chars=40)} (`scontrol show node {name}` says why)"
            )
            continue
        gpus = parse_gres_gpus(gres, f"node {name}")
        num_gpus += sum(entry.count for entry in gpus)
        _check_cluster_size(len(seen), num_gpus, what)
        node = _node(
            name,
            gpus,
            table,
            catalog,
            cpu_count=_field_number(cpus, "CPUs", name),
            memory_mb=_field_number(memory, "MB of memory", name),
        )
        if not node.gpus:
            skipped.append(f"{name}: no GPU GRES")
            continue
        nodes[name] = node
    if not nodes and not skipped:
        raise ConfigError(f"SLURM partition {partition!r} has no nodes (check the name with `sinfo -s`)")
    if not nodes:
        raise ConfigError(f"SLURM partition {partition!r} has no usable GPU node ({'; '.join(skipped)})")
    cluster = ClusterSpec(
        name=f"slurm:{partition}",
        nodes=tuple(nodes.values()),
        source_path=f"sinfo -p {partition}",
        catalog=catalog,
    )
    return SlurmCluster(cluster=cluster, skipped=tuple(skipped))


_JOB_NODE_LINE = re.compile(r"^\s*Nodes=(?P<nodes>\S+)\s.*?\bGRES=(?P<gres>\S*)", re.MULTILINE)


def parse_job_node_gres(text: str) -> list[tuple[str, str]]:
    """``(hostlist expression, GRES)`` of each per-node line of ``scontrol show job -d``
    (``Nodes=gpu-a CPU_IDs=0 Mem=4000 GRES=gpu:a100:1(IDX:0)``)."""
    return [(m["nodes"], m["gres"]) for m in _JOB_NODE_LINE.finditer(text)]


def allocation_cluster(
    hostnames: Sequence[str],
    job_gres: Sequence[tuple[Sequence[str], str]],
    *,
    job_id: str,
    table: Mapping[str, str],
    catalog: GpuCatalog,
    local: NodeSpec | None = None,
) -> SlurmCluster:
    """The allocation as a cluster: ``hostnames`` in SLURM's order, each with its GRES GPUs (``job_gres``:
    the expanded hostnames of a per-node line and its GRES), the NVML-read ``local`` node replacing its own.

    Raises:
        ConfigError: no node of the allocation holds a GPU.
    """
    what = f"SLURM job {job_id}"
    _check_cluster_size(len(hostnames), 0, what)
    gres_of: dict[str, str] = {}
    for names, gres in job_gres:
        for name in names:
            gres_of[name] = gres
    nodes, skipped, num_gpus = [], [], 0
    for host in hostnames:
        _check_node_name(host)
        gpus = parse_gres_gpus(gres_of.get(host, ""), f"node {host}")
        num_gpus += sum(entry.count for entry in gpus)
        _check_cluster_size(len(hostnames), num_gpus, what)
        node = local if local is not None and local.name == host else _node(host, gpus, table, catalog)
        if node.gpus:
            nodes.append(node)
        else:
            skipped.append(
                f"{host}: the job holds no GPU there (ask for GPUs with --gres=gpu:N or --gpus-per-node)"
            )
    if not nodes:
        raise ConfigError(f"SLURM job {job_id} holds no GPU on any of its nodes ({'; '.join(skipped)})")
    cluster = ClusterSpec(
        name=f"slurm-job-{job_id}", nodes=tuple(nodes), source_path=f"SLURM job {job_id}", catalog=catalog
    )
    nvml = (local.name,) if local is not None and local in nodes else ()
    return SlurmCluster(cluster=cluster, skipped=tuple(skipped), nvml_nodes=nvml)


# ------------------------------------------------------------------------------------------------ the edge


def expand_hostlist(expression: str) -> list[str]:
    """``gpu-[a-b],cpu1`` -> hostnames, as SLURM expands them (``scontrol show hostnames``).

    Raises:
        ConfigError: ``expression`` is not a host list (it is never passed on as an option), or it expands to
            more nodes than a cluster config may hold.
    """
    if len(expression) > 2**16 or not _HOSTLIST.fullmatch(expression):
        raise ConfigError(
            f"SLURM node list {expression[:120]!r} is not a host list like gpu-[01-04],gpu-10 "
            "(check SLURM_JOB_NODELIST)"
        )
    hostnames = run_slurm_command(["scontrol", "show", "hostnames", expression]).split()
    _check_cluster_size(len(hostnames), 0, f"SLURM node list {expression[:60]!r}")
    return hostnames


def partition_cluster(
    partition: str, *, gres_types: Sequence[str] = (), catalog: GpuCatalog | None = None
) -> SlurmCluster:
    """The usable GPU nodes of a SLURM partition (``preflight --slurm-partition``)."""
    if not partition or partition.startswith("-") or not partition.isprintable() or len(partition) > 256:
        raise ConfigError(
            f"SLURM partition {partition[:80]!r} is not a partition name (`sinfo -s` lists them)"
        )
    text = run_slurm_command(["sinfo", "-N", "-h", "-p", partition, "-o", "%N|%G|%t|%m|%c"])
    return parse_sinfo_nodes(
        text, partition=partition, table=gres_table(gres_types), catalog=catalog or load_catalog()
    )


def _local_nvml_node(hostnames: Sequence[str], catalog: GpuCatalog) -> NodeSpec | None:
    """This host as a node of the allocation, its GPUs read over NVML; None without a driver or off the list."""
    from torchkit.hardware.nvml import NvmlUnavailableError, read_local_inventory

    here = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    if here not in hostnames:
        return None
    try:
        inventory = read_local_inventory()
    except NvmlUnavailableError:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    wanted = {int(i) for i in visible.split(",") if i.strip().isdigit()} if visible else None
    gpus = []
    for stats in inventory.gpus:
        spec = catalog.resolve(stats.name)
        if spec is None or (wanted is not None and stats.index not in wanted):
            continue
        gpus.append(
            SimulatedGpu(
                index=len(gpus),
                spec=spec,
                used_memory_bytes=min(stats.memory_used_bytes, spec.memory_bytes),
                utilization_fraction=stats.utilization_fraction or 0.0,
            )
        )
    return NodeSpec(name=here, gpus=tuple(gpus)) if gpus else None


def current_allocation(*, gres_types: Sequence[str] = (), catalog: GpuCatalog | None = None) -> SlurmCluster:
    """The nodes and GPUs of the SLURM job this process runs in (``plan --slurm``).

    Raises:
        ConfigError: not inside an allocation, or SLURM's commands fail.
    """
    job_id = os.environ.get("SLURM_JOB_ID", "").strip()
    nodelist = (
        os.environ.get("SLURM_JOB_NODELIST", "").strip() or os.environ.get("SLURM_NODELIST", "").strip()
    )
    if not job_id or not nodelist:
        raise ConfigError(
            "--slurm plans the SLURM job this runs in, and SLURM_JOB_ID/SLURM_JOB_NODELIST are not set "
            "(run it inside salloc or an sbatch script, or use preflight --slurm-partition NAME)"
        )
    if not _JOB_ID.fullmatch(job_id):
        raise ConfigError(
            f"SLURM_JOB_ID {job_id[:40]!r} is not a SLURM job id (digits; run it inside salloc or an "
            "sbatch script)"
        )
    catalog = catalog or load_catalog()
    hostnames = expand_hostlist(nodelist)
    detail = run_slurm_command(["scontrol", "show", "job", "-d", job_id])
    node_lines = parse_job_node_gres(detail)
    _check_cluster_size(len(node_lines), 0, f"SLURM job {job_id}")
    job_gres = [
        (expand_hostlist(nodes) if any(c in nodes for c in "[,") else [nodes], gres)
        for nodes, gres in node_lines
    ]
    return allocation_cluster(
        hostnames,
        job_gres,
        job_id=job_id,
        table=gres_table(gres_types),
        catalog=catalog,
        local=_local_nvml_node(hostnames, catalog),
    )
