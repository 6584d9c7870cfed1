"""The interconnect of a cluster: the network between nodes and the GPU-to-GPU link inside each, as a
cluster config states them, and the links a plan prices the gradient all-reduce over.

Config (``planner.cluster``; DESIGN.md "Planned extensions")::

    network: {gbps: 25, latency_us: 20}     # between nodes (optional; per node too, overriding it)
    nodes:
      - name: node-a
        intra: nvlink                       # or nvlink-bridge, pcie, pcie-x8, or {gbps: 200, latency_us: 3};
                                            # default by GPU type
        network: {gbps: 100}

``gbps`` is the link's rate in Gb/s (10^9 bit/s), taken as the bus bandwidth a ring all-reduce reaches over
it (``gbps/8`` GB/s: the best case; nccl-tests over 4x HDR 200 Gb reach 85% of it, NVIDIA/nccl-tests#119);
``latency_us`` the latency of one ring step (default: NCCL's 14 µs per network step, 5.7 µs for an intra
link given as ``{gbps}``). The default intra link follows the GPU type (``torchkit.hardware.links``:
NVLink on SXM/HGX boards, PCIe of its generation on PCIe cards). No default knows a real cluster's fabric:
without ``network`` a plan assumes ``DEFAULT_NETWORK_GBPS`` and warns once that it did.

Pure Python: no torch, Ray or pynvml.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from torchkit.estimate.ddp_sync import LinkCost
from torchkit.hardware.configio import ConfigLocation, describe_value, expect_mapping, expect_number
from torchkit.hardware.links import NCCL_NET_STEP_S, NCCL_PCIE_STEP_S, PCIE_LANES, load_link_catalog

DEFAULT_NETWORK_GBPS = 100.0
"""the network assumed between nodes when nothing says otherwise: 100 Gb/s Ethernet"""
MAX_LINK_GBPS = 100_000.0
"""most a link may claim, Gb/s (NVLink 5: 14,400 Gb/s per GPU); more is a typo"""
MAX_LATENCY_US = 1_000_000.0
"""most a link's step latency may be, µs (1 s)"""

_LINK_KEYS = {"gbps": "the link's rate in Gb/s, e.g. gbps: 100"}


@dataclass(frozen=True, kw_only=True)
class LinkConfig:
    """A link as a config gives it."""

    kind: Literal["nvlink", "pcie", "nvlink-bridge", "rate"]
    """``nvlink``/``pcie``/``nvlink-bridge``: the catalog figure of the node's GPU type; ``rate``: ``gbps`` as
    given"""
    lanes: int = 16
    """PCIe lanes of the node's GPU slots (``pcie-x8``); the catalog's PCIe figures are x16"""
    gbps: float | None = None
    latency_us: float | None = None
    where: str = ""
    """the config location it came from, e.g. ``demo.yaml: nodes[1].intra``"""

    def cost(self, name: str, default_latency_s: float) -> LinkCost:
        """The link of a ``rate`` config: ``gbps/8`` GB/s, its latency or ``default_latency_s``."""
        assert self.kind == "rate" and self.gbps is not None
        latency_s = default_latency_s if self.latency_us is None else self.latency_us * 1e-6
        return LinkCost(
            name=name,
            bus_bytes_per_s=self.gbps * 1e9 / 8,
            step_latency_s=latency_s,
            source=f"config ({self.where}: {self.gbps:g} Gb/s)",
        )


def _parse_rate(raw: Any, where: ConfigLocation, example: str) -> LinkConfig:
    entry = expect_mapping(
        raw, where, required=_LINK_KEYS, optional=("latency_us",), what=f"a mapping like {example}"
    )
    gbps = expect_number(entry["gbps"], where.key("gbps"), positive=True, maximum=MAX_LINK_GBPS, hint="Gb/s")
    latency = None
    if entry.get("latency_us") is not None:
        latency = expect_number(
            entry["latency_us"],
            where.key("latency_us"),
            minimum=0,
            maximum=MAX_LATENCY_US,
            hint="µs per ring step",
        )
    return LinkConfig(kind="rate", gbps=gbps, latency_us=latency, where=f"{where.source}: {where.path}")


def parse_network(raw: Any, where: ConfigLocation) -> LinkConfig:
    """``network: {gbps: N, latency_us: N}`` (ConfigError naming ``where`` otherwise)."""
    return _parse_rate(raw, where, "{gbps: 100, latency_us: 14}")


_INTRA_FORMS = "nvlink, nvlink-bridge, pcie, pcie-x8 (x1/x2/x4/x8/x16) or {gbps: N}"


def parse_intra(raw: Any, where: ConfigLocation, gpu_types: tuple[str, ...]) -> LinkConfig:
    """``intra: nvlink | nvlink-bridge | pcie | pcie-xN | {gbps: N, latency_us: N}``; ``nvlink`` on a node of
    PCIe cards, or ``nvlink-bridge`` on cards that take none, is an error (``torchkit.hardware.links``)."""
    if isinstance(raw, str):
        kind, _, width = raw.strip().lower().partition("-x")
        if raw.strip().lower() == "nvlink-bridge":
            kind, width = "nvlink-bridge", ""
        if kind not in ("nvlink", "pcie", "nvlink-bridge") or (width and kind != "pcie"):
            raise where.error(f"expected {_INTRA_FORMS}, got {describe_value(raw)}")
        if width and (not width.isdigit() or int(width) not in PCIE_LANES):
            raise where.error(f"{raw}: a PCIe slot has x1, x2, x4, x8 or x16 lanes")
        links = load_link_catalog()
        if kind == "nvlink":
            pcie_only = [t for t in gpu_types if links.for_gpu(t).nvlink_bus_gb_s is None]
            if pcie_only:
                raise where.error(
                    f"nvlink: {pcie_only[0]} has no NVLink figure in the link catalog (use pcie, "
                    "nvlink-bridge for bridged pairs, or {gbps: N} with your measured bus bandwidth)"
                )
        if kind == "nvlink-bridge":
            unbridged = [t for t in gpu_types if links.for_gpu(t).nvlink_bridge_bus_gb_s is None]
            if unbridged:
                raise where.error(
                    f"nvlink-bridge: {unbridged[0]} takes no NVLink bridge in the link catalog (use "
                    "pcie, or {gbps: N} with your measured bus bandwidth)"
                )
        return LinkConfig(
            kind=kind,
            lanes=int(width) if width else 16,  # type: ignore[arg-type]
            where=f"{where.source}: {where.path}",
        )
    return _parse_rate(raw, where, "{gbps: 200, latency_us: 3}")


@dataclass(frozen=True, kw_only=True)
class Interconnect:
    """Every link a cluster config states (empty for a cluster that states none, e.g. one reached by
    ``--address``)."""

    network: LinkConfig | None = None
    """the cluster's ``network``"""
    node_network: Mapping[str, LinkConfig] = field(default_factory=dict)
    """node name -> its own ``network``"""
    node_intra: Mapping[str, LinkConfig] = field(default_factory=dict)
    """node name -> its ``intra``"""

    def network_link(self, node: str) -> tuple[LinkCost, bool]:
        """The network link of ``node`` and whether it is the assumed default (nothing stated it)."""
        stated = self.node_network.get(node, self.network)
        if stated is None:
            return LinkCost(
                name="network",
                bus_bytes_per_s=DEFAULT_NETWORK_GBPS * 1e9 / 8,
                step_latency_s=NCCL_NET_STEP_S,
                source=f"assumed default ({DEFAULT_NETWORK_GBPS:g} Gb/s Ethernet)",
            ), True
        return stated.cost("network", NCCL_NET_STEP_S), False

    def intra_link(self, node: str, gpu: str, ranks: int | None = None) -> LinkCost:
        """The GPU-to-GPU link of ``node`` (whose ``ranks`` ranks are ``gpu`` cards): the config's, else the
        catalog's (two cards on one NVLink bridge have the bridge's figure, more cross PCIe between pairs)."""
        stated = self.node_intra.get(node)
        catalog = load_link_catalog()
        if stated is None or stated.kind != "rate":
            kind = catalog.for_gpu(gpu).default_kind if stated is None else stated.kind
            lanes = 16 if stated is None else stated.lanes
            figures = catalog.for_gpu(gpu).link(kind, gpu, lanes=lanes, ranks=ranks)  # type: ignore[arg-type]
            said = kind if lanes == 16 else f"{kind}-x{lanes}"
            source = (
                figures.source if stated is None else f"config ({stated.where}: {said}), {figures.source}"
            )
            return LinkCost(
                name=figures.name,
                bus_bytes_per_s=figures.bus_gb_s * 1e9,
                step_latency_s=figures.step_latency_s,
                source=source,
            )
        return stated.cost("intra", NCCL_PCIE_STEP_S)
