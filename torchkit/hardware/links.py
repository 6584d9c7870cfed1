"""The intra-node link catalog: which GPU-to-GPU link a node of a GPU type has by default, and its bus bandwidth.

Read from the ``links:`` section of ``cluster_configs/gpus.yaml``: the PCIe generations' bus bandwidths and,
per GPU type, its PCIe generation, (SXM/HGX boards) its NVLink figure and (PCIe cards that take one) the
measured figure of two cards on a 2-way NVLink bridge, each with its source. The default link of a type is NVLink where the
catalog has a figure for it, else PCIe of its generation. A GPU type the section does not list (one a config
adds) gets PCIe Gen4, said in the link's source.

Two physical facts shape a PCIe card's link beyond its generation:

* **lanes**: a PCIe link moves its lanes x the per-lane rate (PCIe base specification: 32 GT/s a lane at Gen5,
  128b/130b coding), so a card in an x8 slot moves half what the catalog's figure (an x16 slot) says;
* **NVLink bridges** join PCIe cards two by two (NVIDIA's 2-way bridges, e.g. 600 GB/s for the H100 PCIe): a
  ring over bridged pairs takes NVLink inside each pair and PCIe between pairs, so its bandwidth stays the
  PCIe hops' and only half of its steps have NVLink's latency.

NCCL's per-step latencies are here too (``torchkit.estimate.ddp_sync`` prices a ring with them). Pure
Python + PyYAML (no torch).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from torchkit.hardware.catalog import default_catalog_path
from torchkit.hardware.configio import (
    ConfigLocation,
    expect_int,
    expect_mapping,
    expect_number,
    read_yaml_file,
)

IntraKind = Literal["nvlink", "pcie", "nvlink-bridge"]
PCIE_LANES: tuple[int, ...] = (1, 2, 4, 8, 16)
"""link widths a PCIe slot can have; the catalog's PCIe figures are for 16"""

# NCCL tuner constants, Simple protocol (NVIDIA/nccl src/graph/tuning.cc, ncclTunerConstantsDefaults)
NCCL_BASE_LATENCY_S = 8.4e-6
"""base latency of one ring all-reduce"""
NCCL_NVLINK_STEP_S = 3.4e-6
"""hardware latency of one ring step over NVLink"""
NCCL_PCIE_STEP_S = 5.7e-6
"""hardware latency of one ring step over PCIe"""
NCCL_NET_STEP_S = 14e-6
"""hardware latency of one ring step over the network"""


@dataclass(frozen=True, kw_only=True)
class LinkFigures:
    """One link's figures as the catalog gives them."""

    name: str
    """``nvlink`` or ``pcie3``/``pcie4``/``pcie5``"""
    bus_gb_s: float
    """bus bandwidth (nccl-tests' busbw), GB/s"""
    step_latency_s: float
    """NCCL's hardware latency of one ring step over this kind of link"""
    source: str


#: the PCIe generation assumed for a GPU type the link catalog does not list
UNLISTED_PCIE_GEN = 4
#: most a bus bandwidth in the catalog may claim, GB/s (NVLink 5 is 1,800 GB/s)
MAX_BUS_GB_S = 100_000


@dataclass(frozen=True, kw_only=True)
class GpuLinks:
    """The intra-node links of one GPU type."""

    pcie_gen: int
    """PCIe generation of its slot"""
    pcie_bus_gb_s: float
    """bus bandwidth over PCIe, GB/s (the generation's, or the type's own where measured)"""
    pcie_source: str
    nvlink_bus_gb_s: float | None
    """bus bandwidth over NVLink/NVSwitch, GB/s; None for PCIe cards"""
    nvlink_source: str = ""
    nvlink_bridge_bus_gb_s: float | None = None
    """bus bandwidth of two cards on a 2-way NVLink bridge, GB/s, as measured; None where the catalog knows no
    bridge for the type (or no measurement of one)"""
    nvlink_bridge_source: str = ""

    @property
    def default_kind(self) -> IntraKind:
        return "nvlink" if self.nvlink_bus_gb_s is not None else "pcie"

    def link(self, kind: IntraKind, gpu: str, *, lanes: int = 16, ranks: int | None = None) -> LinkFigures:
        """The link of ``kind`` for a node of ``gpu`` cards in slots of ``lanes`` PCIe lanes, ``ranks`` of them in
        the ring (module docstring; two bridged cards are one bridge, more cross PCIe between the pairs).

        Raises ValueError for NVLink on a PCIe card, a bridge on a card without one, or a width PCIe lacks."""
        if lanes not in PCIE_LANES:
            raise ValueError(f"a PCIe link has 1, 2, 4, 8 or 16 lanes, not {lanes}")
        if kind == "nvlink":
            if self.nvlink_bus_gb_s is None:
                raise ValueError(f"{gpu} has no NVLink figure in the link catalog (it is a PCIe card)")
            return LinkFigures(
                name="nvlink",
                bus_gb_s=self.nvlink_bus_gb_s,
                step_latency_s=NCCL_NVLINK_STEP_S,
                source=f"catalog: {gpu} NVLink {self.nvlink_bus_gb_s:g} GB/s ({self.nvlink_source})",
            )
        width = "" if lanes == 16 else f" x{lanes}"
        bus = self.pcie_bus_gb_s * lanes / 16
        pcie = f"PCIe Gen{self.pcie_gen}{width} {bus:g} GB/s ({self.pcie_source}" + (
            f"; x{lanes} of the x16 figure {self.pcie_bus_gb_s:g}: bandwidth goes with the lanes)"
            if width
            else ")"
        )
        name = f"pcie{self.pcie_gen}" + (f"x{lanes}" if width else "")
        if kind == "nvlink-bridge":
            if self.nvlink_bridge_bus_gb_s is None:
                raise ValueError(f"{gpu} takes no NVLink bridge in the link catalog")
            if ranks == 2:
                return LinkFigures(
                    name="nvlink-bridge",
                    bus_gb_s=self.nvlink_bridge_bus_gb_s,
                    step_latency_s=NCCL_NVLINK_STEP_S,
                    source=f"catalog: {gpu} on one NVLink bridge {self.nvlink_bridge_bus_gb_s:g} GB/s "
                    f"({self.nvlink_bridge_source})",
                )
            return LinkFigures(
                name=f"nvlink-bridge+{name}",
                bus_gb_s=bus,
                step_latency_s=(NCCL_NVLINK_STEP_S + NCCL_PCIE_STEP_S) / 2,
                source=f"catalog: {gpu} pairs on NVLink bridges, {pcie} between the pairs",
            )
        return LinkFigures(
            name=name, bus_gb_s=bus, step_latency_s=NCCL_PCIE_STEP_S, source=f"catalog: {gpu} {pcie}"
        )


@dataclass(frozen=True, kw_only=True)
class LinkCatalog:
    gpus: dict[str, GpuLinks]
    pcie_bus_gb_s: dict[int, tuple[float, str]]
    """PCIe generation -> (bus GB/s, source)"""

    def for_gpu(self, gpu: str) -> GpuLinks:
        """The links of GPU type ``gpu`` (PCIe Gen4 for a type the catalog does not list)."""
        if gpu in self.gpus:
            return self.gpus[gpu]
        bus, source = self.pcie_bus_gb_s[UNLISTED_PCIE_GEN]
        return GpuLinks(
            pcie_gen=UNLISTED_PCIE_GEN,
            pcie_bus_gb_s=bus,
            nvlink_bus_gb_s=None,
            pcie_source=f"{gpu} is not in the link catalog: PCIe Gen{UNLISTED_PCIE_GEN} assumed; {source}",
        )

    def default_link(self, gpu: str) -> LinkFigures:
        links = self.for_gpu(gpu)
        return links.link(links.default_kind, gpu)


def _parse(data: Any, where: ConfigLocation) -> LinkCatalog:
    section = expect_mapping(
        data,
        where,
        required={
            "pcie": "PCIe generation -> {bus_gb_s, source}",
            "gpus": "GPU type -> {pcie_gen, nvlink_bus_gb_s, source}",
        },
    )
    pcie: dict[int, tuple[float, str]] = {}
    for gen, entry in section["pcie"].items():
        at = where.key("pcie").key(gen)
        expect_int(gen, at, minimum=1, maximum=9)
        expect_mapping(entry, at, required={"bus_gb_s": "GB/s", "source": "where the figure comes from"})
        pcie[gen] = (
            expect_number(entry["bus_gb_s"], at.key("bus_gb_s"), positive=True, maximum=MAX_BUS_GB_S),
            " ".join(str(entry["source"]).split()),
        )
    gpus: dict[str, GpuLinks] = {}
    for name, entry in section["gpus"].items():
        at = where.key("gpus").key(name)
        expect_mapping(
            entry,
            at,
            required={"pcie_gen": "e.g. pcie_gen: 4"},
            optional=("nvlink_bus_gb_s", "pcie_bus_gb_s", "nvlink_bridge_bus_gb_s", "source"),
        )
        bridge = entry.get("nvlink_bridge_bus_gb_s")
        gen = expect_int(entry["pcie_gen"], at.key("pcie_gen"), minimum=1, maximum=9)
        if gen not in pcie:
            raise at.key("pcie_gen").error(f"PCIe Gen{gen} has no entry under links.pcie")
        source = " ".join(str(entry.get("source", "")).split())
        own_pcie = entry.get("pcie_bus_gb_s")
        nvlink = entry.get("nvlink_bus_gb_s")
        gpus[name] = GpuLinks(
            pcie_gen=gen,
            pcie_bus_gb_s=(
                pcie[gen][0]
                if own_pcie is None
                else expect_number(own_pcie, at.key("pcie_bus_gb_s"), positive=True, maximum=MAX_BUS_GB_S)
            ),
            pcie_source=pcie[gen][1] if own_pcie is None else source,
            nvlink_bus_gb_s=(
                None
                if nvlink is None
                else expect_number(nvlink, at.key("nvlink_bus_gb_s"), positive=True, maximum=MAX_BUS_GB_S)
            ),
            nvlink_source=source if nvlink is not None else "",
            nvlink_bridge_bus_gb_s=(
                None
                if bridge is None
                else expect_number(
                    bridge, at.key("nvlink_bridge_bus_gb_s"), positive=True, maximum=MAX_BUS_GB_S
                )
            ),
            nvlink_bridge_source=source if bridge is not None else "",
        )
    if UNLISTED_PCIE_GEN not in pcie:
        raise where.key("pcie").error(
            f"needs a Gen{UNLISTED_PCIE_GEN} entry (the default of unlisted GPU types)"
        )
    return LinkCatalog(gpus=gpus, pcie_bus_gb_s=pcie)


def load_link_catalog(path: str | Path | None = None) -> LinkCatalog:
    """The ``links:`` section of a GPU catalog file (default: the shipped ``gpus.yaml``, read once).

    Raises:
        ConfigError: the section is missing or malformed (the message names the file and the key)."""
    if path is None:
        return _default_link_catalog()
    return _load(Path(path))


@functools.cache
def _default_link_catalog() -> LinkCatalog:
    return _load(default_catalog_path())


def _load(path: Path) -> LinkCatalog:
    data = read_yaml_file(path, "GPU catalog")
    top = ConfigLocation(str(path))
    if not isinstance(data, dict) or "links" not in data:
        raise top.error("has no links: section (the intra-node link defaults; see the shipped gpus.yaml)")
    return _parse(data["links"], top.key("links"))
