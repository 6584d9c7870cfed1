"""The intra-node link catalog: which GPU-to-GPU link a node of a GPU type has by default, and its bus bandwidth.

Read from the ``links:`` section of ``cluster_configs/gpus.yaml``: the PCIe generations' bus bandwidths and,
per GPU type, its PCIe generation and (SXM/HGX boards) its NVLink figure, each with its source. The default
link of a type is NVLink where the catalog has a figure for it, else PCIe of its generation. A GPU type the
section does not list (one a config adds) gets PCIe Gen4, said in the link's source.

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

IntraKind = Literal["nvlink", "pcie"]

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

    @property
    def default_kind(self) -> IntraKind:
        return "nvlink" if self.nvlink_bus_gb_s is not None else "pcie"

    def link(self, kind: IntraKind, gpu: str) -> LinkFigures:
        """The link of ``kind`` for a node of ``gpu`` cards. Raises ValueError for NVLink on a PCIe card."""
        if kind == "nvlink":
            if self.nvlink_bus_gb_s is None:
                raise ValueError(f"{gpu} has no NVLink figure in the link catalog (it is a PCIe card)")
            return LinkFigures(name="nvlink", bus_gb_s=self.nvlink_bus_gb_s, step_latency_s=NCCL_NVLINK_STEP_S,
                            source=f"catalog: {gpu} NVLink {self.nvlink_bus_gb_s:g} GB/s ({self.nvlink_source})")
        return LinkFigures(name=f"pcie{self.pcie_gen}", bus_gb_s=self.pcie_bus_gb_s, step_latency_s=NCCL_PCIE_STEP_S,
                        source=f"catalog: {gpu} PCIe Gen{self.pcie_gen} {self.pcie_bus_gb_s:g} GB/s ({self.pcie_source})")


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
        return GpuLinks(pcie_gen=UNLISTED_PCIE_GEN, pcie_bus_gb_s=bus, nvlink_bus_gb_s=None,
                        pcie_source=f"{gpu} is not in the link catalog: PCIe Gen{UNLISTED_PCIE_GEN} assumed; {source}")

    def default_link(self, gpu: str) -> LinkFigures:
        links = self.for_gpu(gpu)
        return links.link(links.default_kind, gpu)


def _parse(data: Any, where: ConfigLocation) -> LinkCatalog:
    section = expect_mapping(data, where, required={"pcie": "PCIe generation -> {bus_gb_s, source}",
                                                     "gpus": "GPU type -> {pcie_gen, nvlink_bus_gb_s, source}"})
    pcie: dict[int, tuple[float, str]] = {}
    for gen, entry in section["pcie"].items():
        at = where.key("pcie").key(gen)
        expect_int(gen, at, minimum=1, maximum=9)
        expect_mapping(entry, at, required={"bus_gb_s": "GB/s", "source": "where the figure comes from"})
        pcie[gen] = (expect_number(entry["bus_gb_s"], at.key("bus_gb_s"), positive=True, maximum=MAX_BUS_GB_S),
                     " ".join(str(entry["source"]).split()))
    gpus: dict[str, GpuLinks] = {}
    for name, entry in section["gpus"].items():
        at = where.key("gpus").key(name)
        expect_mapping(entry, at, required={"pcie_gen": "e.g. pcie_gen: 4"},
                       optional=("nvlink_bus_gb_s", "pcie_bus_gb_s", "source"))
        gen = expect_int(entry["pcie_gen"], at.key("pcie_gen"), minimum=1, maximum=9)
        if gen not in pcie:
            raise at.key("pcie_gen").error(f"PCIe Gen{gen} has no entry under links.pcie")
        source = " ".join(str(entry.get("source", "")).split())
        own_pcie = entry.get("pcie_bus_gb_s")
        nvlink = entry.get("nvlink_bus_gb_s")
        gpus[name] = GpuLinks(
            pcie_gen=gen,
            pcie_bus_gb_s=(pcie[gen][0] if own_pcie is None else
                           expect_number(own_pcie, at.key("pcie_bus_gb_s"), positive=True, maximum=MAX_BUS_GB_S)),
            pcie_source=pcie[gen][1] if own_pcie is None else source,
            nvlink_bus_gb_s=(None if nvlink is None else
                             expect_number(nvlink, at.key("nvlink_bus_gb_s"), positive=True, maximum=MAX_BUS_GB_S)),
            nvlink_source=source if nvlink is not None else "")
    if UNLISTED_PCIE_GEN not in pcie:
        raise where.key("pcie").error(f"needs a Gen{UNLISTED_PCIE_GEN} entry (the default of unlisted GPU types)")
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
