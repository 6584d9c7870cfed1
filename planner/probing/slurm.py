"""A cluster from SLURM: the nodes and GPUs of the job's allocation (``plan --slurm``) or of a partition
(``preflight --slurm-partition NAME``), read with SLURM's own commands.

- Allocation: the hostnames from ``scontrol show hostnames $SLURM_JOB_NODELIST`` (in SLURM's node order,
  which is the order of ``SLURM_NODEID``), the GPUs each node holds for this job from the per-node ``GRES=``
  of ``scontrol show job -d $SLURM_JOB_ID``. On the node batchplan runs on, NVML's answer wins where a driver
  is present (the real GPU names and what other processes hold); other nodes are planned from their GRES.
- Partition: ``sinfo -N -h -p NAME -o "%N|%G|%t|%m|%c"`` (node, GRES, state, memory MB, CPUs); nodes that
  are down, drained, failed or in maintenance are left out, with the reason in :attr:`SlurmCluster.skipped`.

GRES type names are chosen by each site (``gpu:a100:4``); :data:`DEFAULT_GRES_TYPES` maps the common ones to
catalog types and ``--gres-type NAME=TYPE`` adds or overrides a mapping for one run. A name that is neither in
the table nor a catalog name or alias is an error naming the fix. Where a name is ambiguous the smaller-memory
variant is taken (``a100`` is the 40 GB card): a plan made for less memory never runs out of it.

Pure parsing functions over SLURM's text, and one thin edge (:func:`run_slurm_command`) that runs it.

Known limitations: GPUs are numbered 0..n-1 as the job sees them (SLURM sets ``CUDA_VISIBLE_DEVICES`` of a
step to the allocated cards); a GRES with no type (``gpu:4``) needs ``--gres-type gpu=TYPE``; MIG and shard
GRES are not counted.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from planner.cluster import ClusterSpec, NodeSpec, SimulatedGpu
from planner.errors import ConfigError
from torchkit.hardware.catalog import GpuCatalog, GpuSpec, load_catalog

#: common GRES type names (lower case, ``_`` read as ``-``) -> catalog type. Sources: the names NVIDIA's
#: product pages use, as sites spell them in gres.conf (``AutoDetect=nvml`` writes ``nvidia_<product>``,
#: which is stripped to ``<product>`` before this lookup). Ambiguous names take the smaller-memory card.
DEFAULT_GRES_TYPES: Mapping[str, str] = {
    "t4": "T4",
    "v100": "V100-SXM2-16GB",
    "v100-16g": "V100-SXM2-16GB",
    "v100-16gb": "V100-SXM2-16GB",
    "v100-32g": "V100-SXM2-32GB",
    "v100-32gb": "V100-SXM2-32GB",
    "a10": "A10",
    "a10g": "A10G",
    "a100": "A100-SXM4-40GB",
    "a100-40g": "A100-SXM4-40GB",
    "a100-40gb": "A100-SXM4-40GB",
    "a100-80g": "A100-SXM4-80GB",
    "a100-80gb": "A100-SXM4-80GB",
    "l4": "L4",
    "l40s": "L40S",
    "h100": "H100-PCIe-80GB",
    "h100-pcie": "H100-PCIe-80GB",
    "h100-sxm": "H100-SXM5-80GB",
    "h100-sxm5": "H100-SXM5-80GB",
    "h200": "H200-SXM-141GB",
    "rtx2080ti": "RTX-2080Ti",
    "2080ti": "RTX-2080Ti",
    "rtx3090": "RTX-3090",
    "3090": "RTX-3090",
    "rtx4090": "RTX-4090",
    "4090": "RTX-4090",
    "a6000": "RTX-A6000",
    "rtx-a6000": "RTX-A6000",
}

#: sinfo states (``%t``, compact form, a trailing ``*``/``~``/``#`` flag stripped) whose nodes can run a job
USABLE_STATES = frozenset({"idle", "mix", "alloc", "comp", "resv", "plnd"})
#: seconds a SLURM command may take (slurmctld answers in milliseconds; a hung one must not hang us)
SLURM_COMMAND_TIMEOUT_S = 30.0

_GRES_ENTRY = re.compile(r"^(?P<name>[^:()]+)(?::(?P<type>[^:()]+))?(?::(?P<count>\d+))?(?:\((?P<extra>[^)]*)\))?$")


@dataclass(frozen=True, kw_only=True)
class GresGpus:
    """GPUs of one GRES entry (``gpu:a100:4``)."""

    gres_type: str | None
    """the type name as SLURM spells it, or None for an untyped ``gpu:N``"""
    count: int
    """number of cards"""


@dataclass(frozen=True, kw_only=True)
class SlurmCluster:
    """What SLURM said, as a cluster to plan, and what was left out."""

    cluster: ClusterSpec
    """nodes named by their SLURM hostnames, in SLURM's node order"""
    skipped: tuple[str, ...] = ()
    """one line per node left out (down, drained, no GPU), with the reason"""
    nvml_nodes: tuple[str, ...] = ()
    """nodes whose GPUs NVML read (this host, with a driver) rather than their GRES"""


def split_gres(text: str) -> list[str]:
    """``gpu:a100:2(S:0-1),mps:100`` -> its entries; commas inside parentheses do not split."""
    entries, depth, current = [], 0, ""
    for char in text.strip():
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            entries.append(current)
            current = ""
        else:
            current += char
    if current:
        entries.append(current)
    return [e.strip() for e in entries if e.strip() and e.strip() != "(null)"]


def parse_gres_gpus(text: str, where: str) -> list[GresGpus]:
    """The ``gpu`` entries of a GRES string (others, like ``mps`` or ``shard``, are ignored).

    Raises:
        ConfigError: an entry SLURM would not write.
    """
    found = []
    for entry in split_gres(text):
        match = _GRES_ENTRY.match(entry)
        if match is None:
            raise ConfigError(f"{where}: GRES entry {entry!r} is not name[:type][:count] (check `sinfo -o %G`)")
        if match["name"] != "gpu":
            continue
        gres_type, count = match["type"], match["count"]
        if count is None and gres_type is not None and gres_type.isdigit():  # gpu:4
            gres_type, count = None, gres_type
        found.append(GresGpus(gres_type=gres_type, count=int(count) if count is not None else 1))
    return found


def gres_table(overrides: Sequence[str] = ()) -> dict[str, str]:
    """:data:`DEFAULT_GRES_TYPES` with ``NAME=TYPE`` overrides (``--gres-type``) on top."""
    table = dict(DEFAULT_GRES_TYPES)
    for item in overrides:
        name, sep, gpu_type = item.partition("=")
        if not sep or not name.strip() or not gpu_type.strip():
            raise ConfigError(f"--gres-type {item!r} is invalid (use NAME=TYPE, e.g. --gres-type a100=A100-SXM4-80GB)")
        table[_normal_gres_name(name)] = gpu_type.strip()
    return table


def _normal_gres_name(name: str) -> str:
    name = name.strip().lower().replace("_", "-")
    return name.removeprefix("nvidia-")


def gres_gpu_spec(gres_type: str | None, table: Mapping[str, str], catalog: GpuCatalog, where: str) -> GpuSpec:
    """The catalog type of a GRES type name: the table first, then the catalog's own names and aliases.

    Raises:
        ConfigError: an untyped GRES without a ``gpu=`` mapping, or a name nothing maps.
    """
    key = "gpu" if gres_type is None else _normal_gres_name(gres_type)
    if key in table:
        return catalog.get(table[key])
    if gres_type is not None:
        spec = catalog.resolve(gres_type) or catalog.resolve(key)
        if spec is not None:
            return spec
    spelled = "gpu:N (no type)" if gres_type is None else f"gpu:{gres_type}"
    raise ConfigError(
        f"{where}: GRES {spelled} names no GPU type batchplan knows (add --gres-type "
        f"{key if gres_type is not None else 'gpu'}=TYPE with a type from `batchplan catalog`)"
    )


def _node(name: str, gres: Sequence[GresGpus], table: Mapping[str, str], catalog: GpuCatalog, *,
          cpu_count: int | None = None, memory_mb: int | None = None) -> NodeSpec:
    gpus: list[SimulatedGpu] = []
    for entry in gres:
        spec = gres_gpu_spec(entry.gres_type, table, catalog, f"node {name}")
        gpus.extend(SimulatedGpu(index=len(gpus) + i, spec=spec) for i in range(entry.count))
    memory = memory_mb * 2**20 if memory_mb else None
    return NodeSpec(name=name, gpus=tuple(gpus), cpu_count=cpu_count or None, host_memory_bytes=memory)


def parse_sinfo_nodes(
    text: str, *, partition: str, table: Mapping[str, str], catalog: GpuCatalog
) -> SlurmCluster:
    """``sinfo -N -h -p NAME -o "%N|%G|%t|%m|%c"`` -> the partition's usable GPU nodes.

    Raises:
        ConfigError: no line (no such partition) or no usable GPU node.
    """
    nodes: dict[str, NodeSpec] = {}
    skipped: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split("|")]
        if len(fields) != 5:
            raise ConfigError(f"sinfo printed {line!r}, not NODE|GRES|STATE|MEMORY|CPUS (is this SLURM's sinfo?)")
        name, gres, state, memory, cpus = fields
        if name in nodes:  # a node in several partitions is listed once per partition
            continue
        state = state.rstrip("*~#!%$@^-+").lower()
        if state not in USABLE_STATES:
            skipped.append(f"{name}: state {state} (`scontrol show node {name}` says why)")
            continue
        node = _node(name, parse_gres_gpus(gres, f"node {name}"), table, catalog,
                     cpu_count=int(cpus) if cpus.isdigit() else None,
                     memory_mb=int(memory) if memory.isdigit() else None)
        if not node.gpus:
            skipped.append(f"{name}: no GPU GRES")
            continue
        nodes[name] = node
    if not nodes and not skipped:
        raise ConfigError(f"SLURM partition {partition!r} has no nodes (check the name with `sinfo -s`)")
    if not nodes:
        raise ConfigError(f"SLURM partition {partition!r} has no usable GPU node ({'; '.join(skipped)})")
    cluster = ClusterSpec(name=f"slurm:{partition}", nodes=tuple(nodes.values()), source_path=f"sinfo -p {partition}",
                          catalog=catalog)
    return SlurmCluster(cluster=cluster, skipped=tuple(skipped))


_JOB_NODE_LINE = re.compile(r"^\s*Nodes=(?P<nodes>\S+)\s.*?\bGRES=(?P<gres>\S*)", re.MULTILINE)


def parse_job_node_gres(text: str) -> list[tuple[str, str]]:
    """``(hostlist expression, GRES)`` of each per-node line of ``scontrol show job -d``
    (``Nodes=gpu-a CPU_IDs=0 Mem=4000 GRES=gpu:a100:1(IDX:0)``)."""
    return [(m["nodes"], m["gres"]) for m in _JOB_NODE_LINE.finditer(text)]


def allocation_cluster(
    hostnames: Sequence[str], job_gres: Sequence[tuple[Sequence[str], str]], *, job_id: str,
    table: Mapping[str, str], catalog: GpuCatalog, local: NodeSpec | None = None,
) -> SlurmCluster:
    """The allocation as a cluster: ``hostnames`` in SLURM's order, each with its GRES GPUs (``job_gres``:
    the expanded hostnames of a per-node line and its GRES), the NVML-read ``local`` node replacing its own.

    Raises:
        ConfigError: no node of the allocation holds a GPU.
    """
    gres_of: dict[str, str] = {}
    for names, gres in job_gres:
        for name in names:
            gres_of[name] = gres
    nodes, skipped = [], []
    for host in hostnames:
        node = local if local is not None and local.name == host else _node(
            host, parse_gres_gpus(gres_of.get(host, ""), f"node {host}"), table, catalog)
        if node.gpus:
            nodes.append(node)
        else:
            skipped.append(f"{host}: the job holds no GPU there (ask for GPUs with --gres=gpu:N or --gpus-per-node)")
    if not nodes:
        raise ConfigError(f"SLURM job {job_id} holds no GPU on any of its nodes ({'; '.join(skipped)})")
    cluster = ClusterSpec(name=f"slurm-job-{job_id}", nodes=tuple(nodes), source_path=f"SLURM job {job_id}",
                          catalog=catalog)
    nvml = (local.name,) if local is not None and local in nodes else ()
    return SlurmCluster(cluster=cluster, skipped=tuple(skipped), nvml_nodes=nvml)


# ------------------------------------------------------------------------------------------------ the edge


def run_slurm_command(argv: Sequence[str]) -> str:
    """stdout of a SLURM command; a missing command or a failure is one ConfigError with SLURM's words."""
    if shutil.which(argv[0]) is None:
        raise ConfigError(f"{argv[0]} is not on PATH (run on a SLURM login or compute node, or load its module)")
    try:
        result = subprocess.run(list(argv), capture_output=True, text=True, timeout=SLURM_COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise ConfigError(f"`{' '.join(argv)}` did not answer in {SLURM_COMMAND_TIMEOUT_S:.0f} s (is slurmctld up? "
                          "`scontrol ping` tells)") from exc
    if result.returncode != 0:
        said = (result.stderr.strip() or result.stdout.strip()).splitlines()
        raise ConfigError(f"`{' '.join(argv)}` failed: {said[-1] if said else f'exit {result.returncode}'} "
                          "(check that slurmctld is reachable: `scontrol ping`)")
    return result.stdout


def expand_hostlist(expression: str) -> list[str]:
    """``gpu-[a-b],cpu1`` -> hostnames, as SLURM expands them (``scontrol show hostnames``)."""
    return run_slurm_command(["scontrol", "show", "hostnames", expression]).split()


def partition_cluster(partition: str, *, gres_types: Sequence[str] = (), catalog: GpuCatalog | None = None
                      ) -> SlurmCluster:
    """The usable GPU nodes of a SLURM partition (``preflight --slurm-partition``)."""
    text = run_slurm_command(["sinfo", "-N", "-h", "-p", partition, "-o", "%N|%G|%t|%m|%c"])
    return parse_sinfo_nodes(text, partition=partition, table=gres_table(gres_types), catalog=catalog or load_catalog())


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
        gpus.append(SimulatedGpu(index=len(gpus), spec=spec, used_memory_bytes=min(stats.memory_used_bytes,
                                 spec.memory_bytes), utilization_fraction=stats.utilization_fraction or 0.0))
    return NodeSpec(name=here, gpus=tuple(gpus)) if gpus else None


def current_allocation(*, gres_types: Sequence[str] = (), catalog: GpuCatalog | None = None) -> SlurmCluster:
    """The nodes and GPUs of the SLURM job this process runs in (``plan --slurm``).

    Raises:
        ConfigError: not inside an allocation, or SLURM's commands fail.
    """
    job_id = os.environ.get("SLURM_JOB_ID", "").strip()
    nodelist = os.environ.get("SLURM_JOB_NODELIST", "").strip() or os.environ.get("SLURM_NODELIST", "").strip()
    if not job_id or not nodelist:
        raise ConfigError("--slurm plans the SLURM job this runs in, and SLURM_JOB_ID/SLURM_JOB_NODELIST are not set "
                          "(run it inside salloc or an sbatch script, or use preflight --slurm-partition NAME)")
    catalog = catalog or load_catalog()
    hostnames = expand_hostlist(nodelist)
    detail = run_slurm_command(["scontrol", "show", "job", "-d", job_id])
    job_gres = [(expand_hostlist(nodes) if any(c in nodes for c in "[,") else [nodes], gres)
                for nodes, gres in parse_job_node_gres(detail)]
    return allocation_cluster(hostnames, job_gres, job_id=job_id, table=gres_table(gres_types), catalog=catalog,
                              local=_local_nvml_node(hostnames, catalog))

