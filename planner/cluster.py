"""Cluster configs: a YAML description of (simulated) nodes and their GPUs, loaded strictly.

A config names GPU types from the catalog (``cluster_configs/gpus.yaml``) and may add its own under
``gpu_types:``. Busy cards are described by the memory already in use and their utilisation, so idle-GPU
selection can be exercised without GPUs. Format (DESIGN.md, "Cluster config")::

    name: mixed-lab
    network: {gbps: 25, latency_us: 20}   # optional: between nodes (planner.interconnect); assumed when absent
    gpu_types:                 # optional: extra catalog entries, as in gpus.yaml (a list with name: works too)
      MY-GPU: {memory_mib: 24576, fp16_tflops: 71, bf16_tflops: 71, fp32_tflops: 35.6, bandwidth_gb_s: 936}
    nodes:
      - name: node-a
        cpu_count: 64          # optional: host CPU cores, for the ranks x data-loader workers check
        host_memory_gib: 512   # optional: host memory
        intra: nvlink          # optional: nvlink | pcie | {gbps: N, latency_us: N} (default by GPU type)
        network: {gbps: 100}   # optional: this node's network, overriding the cluster's
        gpus: [{type: A100-SXM4-80GB, count: 8}]
      - name: node-b
        gpus:
          - {type: V100-SXM2-16GB, count: 4}
          - {type: T4, count: 1, used_memory_gib: 9.5, utilization: 0.85}   # a busy card

Every error is a ConfigError naming the file, the path (``nodes[1].gpus[0].type``) and the fix; the errors of
one file come together in one ConfigError (``3 problems: [1] ...; [2] ...``). Pure
Python + PyYAML: importing this module imports no torch, Ray or pynvml.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.errors import ConfigError
from planner.interconnect import Interconnect, LinkConfig, parse_intra, parse_network
from torchkit.hardware.catalog import (
    GPU_SPEC_OPTIONAL_KEYS,
    GPU_SPEC_REQUIRED_KEYS,
    GpuCatalog,
    GpuSpec,
    cluster_configs_dir,
    load_catalog,
    parse_gpu_spec,
)
from torchkit.hardware.configio import (
    ConfigLocation,
    expect_int,
    expect_list,
    expect_mapping,
    expect_number,
    expect_str,
    read_yaml_file,
)
from torchkit.hardware.yaml_limits import DocumentLimits, TotalLimit
from torchkit.units import GIB

MAX_GPUS_PER_NODE = 256
"""sanity bound: the largest real single-host systems have 16 GPUs; a count beyond this is a typo"""
MAX_NODES = 16_384
"""most nodes a config may list: 5,000-node configs plan in seconds; this bounds what a hostile file costs"""
MAX_CLUSTER_GPUS = 65_536
"""most GPUs a config may hold in all: a plan holds at most that many ranks (``planner.plan.validate.MAX_PLAN_RANKS``),
so 16,384 nodes of 256 GPUs is refused on reading, before a GPU is built, rather than after minutes of planning"""
MAX_NODE_NAME_CHARS = 253
"""longest node name: a DNS host name (RFC 1035), as a plan's node names"""
MAX_CONFIG_ENTRIES = 1024
"""most entries any other collection of a config may hold (``gpu_types``, a node's keys, a type's aliases),
checked while the YAML is read (``torchkit.hardware.yaml_limits``)"""
MAX_CPU_COUNT = 65_536
"""most logical cores a node may claim (the largest hosts have under 2,000)"""
MAX_HOST_MEMORY_GIB = 2**20
"""most host memory a node may claim, GiB (1 PiB; the largest hosts have tens of TiB)"""

#: checked while the YAML is read: nodes, a node's GPU entries (the rest: MAX_CONFIG_ENTRIES) and the GPUs in all
_READ_LIMITS = DocumentLimits(
    max_entries={"nodes": MAX_NODES, "nodes[].gpus": MAX_GPUS_PER_NODE},
    default_max_entries=MAX_CONFIG_ENTRIES,
    total=TotalLimit(
        entries="nodes[].gpus[]",
        key="count",
        default=1,
        limit=MAX_CLUSTER_GPUS,
        max_each=MAX_GPUS_PER_NODE,
        what="GPUs",
    ),
)

_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", re.ASCII)  # a hostname label and a Ray resource


def node_name_problem(name: str) -> str | None:
    """What is wrong with ``name`` as a node name (a cluster config's, or a host SLURM lists), or None.

    The text says the rule, with the name escaped (``!r``): it is safe to print whatever the name holds."""
    if len(name) > MAX_NODE_NAME_CHARS:
        return f"node name of {len(name)} characters, over the limit of {MAX_NODE_NAME_CHARS} (a host name)"
    if not _NODE_NAME.fullmatch(name):
        return (
            f"node name {name!r} may hold only letters, digits, '.', '_' and '-' and must start with a letter "
            "or digit (it becomes a host label)"
        )
    return None


_TOP_REQUIRED = {"nodes": "a list of nodes, e.g. nodes: [{name: node-a, gpus: [{type: T4, count: 2}]}]"}
_TOP_OPTIONAL = ("name", "gpu_types", "network")
_NODE_REQUIRED = {
    "name": "e.g. name: node-a",
    "gpus": "e.g. gpus: [{type: A100-SXM4-80GB, count: 8}]",
}
_NODE_OPTIONAL = ("cpu_count", "host_memory_gib", "intra", "network")
_GPU_REQUIRED = {"type": "a catalog GPU type, e.g. type: A100-SXM4-80GB (see `batchplan catalog`)"}
_GPU_OPTIONAL = ("count", "used_memory_gib", "utilization")


@dataclass(frozen=True, kw_only=True)
class SimulatedGpu:
    """One GPU of a simulated node, with the load it carries before our job starts."""

    index: int
    """device index within the node (0, 1, ... in config order), as NVML/CUDA would number it"""
    spec: GpuSpec
    """the catalog type"""
    used_memory_bytes: int = 0
    """memory already held by other processes, bytes (``used_memory_gib`` in the config)"""
    utilization_fraction: float = 0.0
    """current compute utilisation by other processes, 0..1 (``utilization`` in the config)"""

    @property
    def total_memory_bytes(self) -> int:
        """total memory as the driver reports it"""
        return self.spec.memory_bytes

    @property
    def free_memory_bytes(self) -> int:
        """total minus what other processes hold"""
        return self.spec.memory_bytes - self.used_memory_bytes


@dataclass(frozen=True, kw_only=True)
class NodeSpec:
    """One node of a cluster config."""

    name: str
    """node name, unique within the cluster"""
    gpus: tuple[SimulatedGpu, ...]
    """the node's GPUs, indices 0..n-1"""
    cpu_count: int | None = None
    """host CPU cores (logical), if the config gives them"""
    host_memory_bytes: int | None = None
    """host memory in bytes, if the config gives it (``host_memory_gib``)"""
    intra: LinkConfig | None = None
    """the GPU-to-GPU link (``intra:``); None: the catalog default of its GPU type (``planner.interconnect``)"""
    network: LinkConfig | None = None
    """this node's own ``network:``, overriding the cluster's"""


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """A cluster config, validated and expanded (one SimulatedGpu per card)."""

    name: str
    """cluster name (``name:``; defaults to the file's stem)"""
    nodes: tuple[NodeSpec, ...]
    """nodes in config order"""
    source_path: str
    """the file it was read from, or the label given to ``parse_cluster``"""
    catalog: GpuCatalog
    """the catalog the GPU types were resolved against, including the config's ``gpu_types``"""
    network: LinkConfig | None = None
    """the network between nodes (``network:``); None: a plan assumes a default and says so"""

    @property
    def interconnect(self) -> Interconnect:
        """Every link the config states, for the synchronisation model."""
        return Interconnect(
            network=self.network,
            node_network={n.name: n.network for n in self.nodes if n.network is not None},
            node_intra={n.name: n.intra for n in self.nodes if n.intra is not None},
        )

    @property
    def num_gpus(self) -> int:
        """total GPUs over all nodes"""
        return sum(len(node.gpus) for node in self.nodes)

    def node(self, name: str) -> NodeSpec:
        """The node called ``name``; KeyError if there is none."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def gpu_type_counts(self) -> dict[str, int]:
        """GPU type name -> number of cards, in order of first appearance."""
        counts: dict[str, int] = {}
        for node in self.nodes:
            for gpu in node.gpus:
                counts[gpu.spec.name] = counts.get(gpu.spec.name, 0) + 1
        return counts


def catalog_for(cluster: ClusterSpec | None) -> GpuCatalog:
    """The GPU catalog that applies: a cluster config's (the shipped catalog plus its ``gpu_types:``), else the
    shipped one. Every command and the running job take their catalog from here."""
    return cluster.catalog if cluster is not None else load_catalog()


def shipped_cluster_configs() -> dict[str, Path]:
    """The example cluster configs shipped with batchplan: name (file stem) -> path, sorted by name."""
    return {
        path.stem: path for path in sorted(cluster_configs_dir().glob("*.yaml")) if path.name != "gpus.yaml"
    }


def find_cluster_config(path: str | os.PathLike[str]) -> Path:
    """The file ``path`` names: itself where it exists, else the shipped example of that name (``demo-mixed``).

    Raises:
        ConfigError: neither exists.
    """
    file_path = Path(path)
    if file_path.exists():
        return file_path
    shipped = shipped_cluster_configs()
    stem = file_path.name.removesuffix(".yaml").removesuffix(".yml")
    if file_path.parent == Path(".") and stem in shipped:
        return shipped[stem]
    raise ConfigError(
        f"cluster config {file_path} does not exist (check the path; shipped examples: {', '.join(shipped)})"
    )


def load_cluster(path: str | os.PathLike[str], catalog: GpuCatalog | None = None) -> ClusterSpec:
    """Load and validate a cluster config file.

    ``path`` may also be the name of a shipped example (``demo-mixed``) when no such file exists here.

    Raises:
        ConfigError: the file is missing, is not valid YAML, or breaks a rule of the format (the message
            names the file, the path inside it and the fix).
    """
    file_path = find_cluster_config(path)
    data = read_yaml_file(file_path, "cluster config", limits=_READ_LIMITS)
    return parse_cluster(data, str(file_path), catalog=catalog, default_name=file_path.stem)


def parse_cluster(
    data: Any, source: str, catalog: GpuCatalog | None = None, *, default_name: str | None = None
) -> ClusterSpec:
    """Validate parsed YAML (``data``) as a cluster config; ``source`` names it in errors.

    ``catalog`` defaults to the shipped one; the config's ``gpu_types`` are added to it.
    ``default_name`` is used when the config has no ``name:`` (default: the stem of ``source``).
    """
    top = ConfigLocation(source)
    if data is None:
        raise top.error("is empty (expected a mapping with name: and nodes:)")
    expect_mapping(
        data, top, required=_TOP_REQUIRED, optional=_TOP_OPTIONAL, what="a mapping with name: and nodes:"
    )
    name = (
        expect_str(data["name"], top.key("name")) if "name" in data else (default_name or Path(source).stem)
    )

    problems = ConfigProblems(source)
    catalog = _with_config_types(
        load_catalog() if catalog is None else catalog, data.get("gpu_types"), top, problems
    )

    nodes_where = top.key("nodes")
    nodes_raw: list = []
    with problems.collect():
        listed = expect_list(data["nodes"], nodes_where, what="a list of nodes")
        if len(listed) > MAX_NODES:
            raise nodes_where.error(
                f"lists {len(listed)} nodes, over the limit of {MAX_NODES} (split the config)"
            )
        _check_total_gpus(listed, nodes_where)
        nodes_raw = listed  # only within the limits is any node built
    nodes: list[NodeSpec] = []
    first_index_of: dict[str, int] = {}
    for i, node_raw in enumerate(nodes_raw):
        with problems.collect():
            node = _parse_node(node_raw, nodes_where.index(i), catalog, problems)
            if node.name in first_index_of:
                first = first_index_of[node.name]
                name_where = nodes_where.index(i).key("name")
                raise name_where.error(
                    f"duplicate node name {node.name!r} (also nodes[{first}]; names must be unique)"
                )
            first_index_of[node.name] = i
            nodes.append(node)
    network = None
    if data.get("network") is not None:
        with problems.collect():
            network = parse_network(data["network"], top.key("network"))
    problems.raise_any()
    return ClusterSpec(name=name, nodes=tuple(nodes), source_path=source, catalog=catalog, network=network)


def _check_total_gpus(nodes_raw: list, where: ConfigLocation) -> None:
    """The GPUs the nodes declare, summed from their raw ``count:`` values before a GPU is built."""
    total = 0
    for node in nodes_raw:
        entries = node.get("gpus") if isinstance(node, dict) else None
        for entry in entries if isinstance(entries, list) else ():
            count = entry.get("count", 1) if isinstance(entry, dict) else 1
            if isinstance(count, int) and not isinstance(count, bool) and 0 < count <= MAX_GPUS_PER_NODE:
                total += count  # other counts are reported per entry
    if total > MAX_CLUSTER_GPUS:
        raise where.error(
            f"declare {total} GPUs in all, over the limit of {MAX_CLUSTER_GPUS} (a plan holds at most "
            f"{MAX_CLUSTER_GPUS} ranks; split the cluster)"
        )


class ConfigProblems:
    """Config errors collected instead of raised one at a time, so that one run names all of them."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.messages: list[str] = []
        self.broken_types: set[str] = set()
        """``gpu_types`` names (lower case) whose entry is already reported: a node naming one is not
        reported again as not in the catalog"""

    @contextlib.contextmanager
    def collect(self) -> Iterator[None]:
        try:
            yield
        except ConfigError as exc:
            self.messages.append(str(exc))

    def raise_any(self) -> None:
        if len(self.messages) == 1:
            raise ConfigError(self.messages[0])
        if self.messages:
            prefix = f"{self.source}: "
            listed = "; ".join(f"[{i}] {m.removeprefix(prefix)}" for i, m in enumerate(self.messages, 1))
            raise ConfigError(f"{self.source}: {len(self.messages)} problems: {listed}")


def _gpu_type_entries(raw: Any, where: ConfigLocation) -> list[tuple[ConfigLocation, Any, Any, bool]]:
    """``(location, name, entry, listed)`` of each ``gpu_types`` entry, in either form: the mapping
    ``gpus.yaml`` uses (``{MY-GPU: {memory_mib: ...}}``, so an entry can be copied from there) or a list of
    entries with a ``name`` key (``listed``)."""
    if isinstance(raw, dict):
        return [(where.key(name), name, entry, False) for name, entry in raw.items()]
    entries = expect_list(
        raw,
        where,
        what="a mapping of GPU type name -> entry (as in gpus.yaml) or a list of entries with name:",
        non_empty=False,
    )
    return [
        (where.index(i), entry.get("name") if isinstance(entry, dict) else None, entry, True)
        for i, entry in enumerate(entries)
    ]


def _parse_config_type(
    where: ConfigLocation, name: Any, entry: Any, listed: bool, catalog: GpuCatalog
) -> GpuCatalog:
    name_where = where.key("name") if listed else where
    fields = entry
    if listed:
        expect_mapping(
            entry,
            where,
            required={"name": "the new type's name, e.g. name: MY-GPU", **GPU_SPEC_REQUIRED_KEYS},
            optional=GPU_SPEC_OPTIONAL_KEYS,
            what="a GPU type entry mapping",
        )
        fields = {key: value for key, value in entry.items() if key != "name"}
    spec = parse_gpu_spec(expect_str(name, name_where), fields, where)
    try:
        return catalog.with_types([spec])
    except ConfigError as exc:
        raise name_where.error(str(exc)) from None


def _with_config_types(
    catalog: GpuCatalog, raw: Any, top: ConfigLocation, problems: ConfigProblems
) -> GpuCatalog:
    """The catalog plus the config's ``gpu_types`` entries (gpus.yaml keys; see ``_gpu_type_entries``)."""
    if raw is None:
        return catalog
    entries: list[tuple[ConfigLocation, Any, Any, bool]] = []
    with problems.collect():
        entries = _gpu_type_entries(raw, top.key("gpu_types"))
    for where, name, entry, listed in entries:
        before = len(problems.messages)
        with problems.collect():
            catalog = _parse_config_type(where, name, entry, listed, catalog)
        if len(problems.messages) > before and isinstance(name, str):
            problems.broken_types.add(name.strip().lower())
    return catalog


def _parse_node(raw: Any, where: ConfigLocation, catalog: GpuCatalog, problems: ConfigProblems) -> NodeSpec:
    node = expect_mapping(raw, where, required=_NODE_REQUIRED, optional=_NODE_OPTIONAL, what="a node mapping")
    name = expect_str(node["name"], where.key("name"))
    problem = node_name_problem(name)
    if problem is not None:
        raise where.key("name").error(problem)
    cpu_count = None
    if node.get("cpu_count") is not None:
        cpu_count = expect_int(node["cpu_count"], where.key("cpu_count"), minimum=1, maximum=MAX_CPU_COUNT)
    host_memory_bytes = None
    if node.get("host_memory_gib") is not None:
        gib = expect_number(
            node["host_memory_gib"],
            where.key("host_memory_gib"),
            positive=True,
            maximum=MAX_HOST_MEMORY_GIB,
            hint="in GiB",
        )
        host_memory_bytes = round(gib * GIB)

    gpus_where = where.key("gpus")
    entries = expect_list(node["gpus"], gpus_where, what="a list of {type, count} entries")
    gpus: list[SimulatedGpu] = []
    for j, entry in enumerate(entries):
        if isinstance(entry, dict) and str(entry.get("type", "")).strip().lower() in problems.broken_types:
            continue
        with problems.collect():  # a bad GPU entry is reported with the others; the node stays checked
            gpus.extend(_parse_gpu_entry(entry, gpus_where.index(j), catalog, first_index=len(gpus)))
        if len(gpus) > MAX_GPUS_PER_NODE:
            raise gpus_where.error(
                f"node {name!r} has more than {MAX_GPUS_PER_NODE} GPUs (check the counts, or split it into nodes)"
            )
    intra = network = None
    if node.get("intra") is not None:
        intra = parse_intra(
            node["intra"], where.key("intra"), tuple(dict.fromkeys(g.spec.name for g in gpus))
        )
    if node.get("network") is not None:
        network = parse_network(node["network"], where.key("network"))
    return NodeSpec(
        name=name,
        gpus=tuple(gpus),
        cpu_count=cpu_count,
        host_memory_bytes=host_memory_bytes,
        intra=intra,
        network=network,
    )


def _parse_gpu_entry(
    raw: Any, where: ConfigLocation, catalog: GpuCatalog, *, first_index: int
) -> list[SimulatedGpu]:
    entry: Mapping[str, Any] = expect_mapping(
        raw,
        where,
        required=_GPU_REQUIRED,
        optional=_GPU_OPTIONAL,
        what="a GPU entry mapping like {type: T4, count: 2}",
    )
    type_where = where.key("type")
    type_name = expect_str(entry["type"], type_where)
    try:
        spec = catalog.get(type_name)
    except ConfigError as exc:
        raise type_where.error(str(exc)) from None
    # checked before a single SimulatedGpu is built: `count: 1000000000000` must cost nothing
    room = MAX_GPUS_PER_NODE - first_index
    count = expect_int(
        entry.get("count", 1),
        where.key("count"),
        minimum=1,
        maximum=room,
        hint=f"a node holds at most {MAX_GPUS_PER_NODE} GPUs; split it into nodes if it really has more",
    )

    used_memory_bytes = 0
    if entry.get("used_memory_gib") is not None:
        used_where = where.key("used_memory_gib")
        used_gib = expect_number(entry["used_memory_gib"], used_where, minimum=0, hint="memory in use, GiB")
        if used_gib * GIB > spec.memory_bytes:  # compared before rounding: 1e308 GiB would overflow round()
            raise used_where.error(
                f"{used_gib:g} GiB in use exceeds the {spec.memory_bytes / GIB:.2f} GiB total of a {spec.name} "
                f"(use at most {spec.memory_bytes / GIB:.2f})"
            )
        used_memory_bytes = round(used_gib * GIB)
    utilization = 0.0
    if entry.get("utilization") is not None:
        utilization = expect_number(
            entry["utilization"],
            where.key("utilization"),
            minimum=0,
            maximum=1,
            hint="a fraction, e.g. 0.85 for 85%",
        )
    return [
        SimulatedGpu(
            index=first_index + k,
            spec=spec,
            used_memory_bytes=used_memory_bytes,
            utilization_fraction=utilization,
        )
        for k in range(count)
    ]
