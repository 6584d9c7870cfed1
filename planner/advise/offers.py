"""Offers: a YAML of the GPU nodes that can be rented (or are free to use), loaded strictly like a cluster
config (``planner.cluster``): unknown keys are errors naming the file and the path, with the fix.

Format::

    name: my-offers                       # optional (default: the file's stem)
    networks:                             # the networks nodes can share; offers on one network can be mixed
      aws-efa: {gbps: 3200, latency_us: 14}
      lab-ethernet: {gbps: 1, latency_us: 50}
    offers:
      - name: aws-p5                      # a node-name stem: letters, digits, '.', '_', '-'
        gpu: H100-SXM5-80GB               # a catalog GPU type (`batchplan catalog`)
        gpus_per_node: 8
        max_nodes: 2                      # most nodes of this offer a candidate may take
        price_per_node_hour: 55.04        # USD per node-hour; 0 for owned machines
        intra: nvlink                     # optional: nvlink | pcie | {gbps, latency_us} (default by GPU type)
        network: aws-efa                  # one of networks:
        source: "AWS p5.48xlarge on-demand, datareceipts/data-receipts 109-gpu-pricing"
        date: 2026-11-09                  # when the price was read (YYYY-MM-DD)

Limits: at most ``MAX_OFFERS`` offers and ``MAX_NETWORKS`` networks; ``gpus_per_node`` 1..256 (a cluster
config's node limit), ``max_nodes`` 1..``MAX_NODES_PER_OFFER``, a price in [0, ``MAX_PRICE_PER_NODE_HOUR``].
Every error is a ConfigError (exit 2) naming the file and the path (``offers[2].gpu``); the errors of one
file come together. Pure Python + PyYAML: no torch, Ray or pynvml.
"""

from __future__ import annotations

import datetime
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.cluster import MAX_GPUS_PER_NODE, ConfigProblems
from planner.errors import ConfigError
from planner.interconnect import LinkConfig, parse_intra, parse_network
from torchkit.hardware.catalog import GpuCatalog, GpuSpec, cluster_configs_dir, load_catalog
from torchkit.hardware.configio import (
    ConfigLocation,
    expect_int,
    expect_list,
    expect_mapping,
    expect_number,
    expect_str,
    read_yaml_file,
)
from torchkit.hardware.yaml_limits import DocumentLimits

MAX_OFFERS = 64
"""most offers a file may list: the search enumerates mixes of them, which grow fast with their number"""
MAX_NETWORKS = 64
MAX_NODES_PER_OFFER = 1024
"""most nodes one offer may give a candidate"""
MAX_PRICE_PER_NODE_HOUR = 10_000.0
"""USD per node-hour; the dearest public 8-GPU nodes cost under $100/h (comm-and-prices.md §3.1)"""
MAX_SOURCE_CHARS = 500

_READ_LIMITS = DocumentLimits(
    max_entries={"offers": MAX_OFFERS, "networks": MAX_NETWORKS}, default_max_entries=64
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")  # a node-name stem (planner.cluster's node names)
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")

_TOP_REQUIRED = {
    "networks": "a mapping of network name -> {gbps, latency_us}, e.g. networks: {ethernet: {gbps: 100}}",
    "offers": "a list of offers, e.g. offers: [{name: a, gpu: T4, gpus_per_node: 1, max_nodes: 4, ...}]",
}
_OFFER_REQUIRED = {
    "name": "e.g. name: lambda-h100",
    "gpu": "a catalog GPU type, e.g. gpu: H100-SXM5-80GB (see `batchplan catalog`)",
    "gpus_per_node": "e.g. gpus_per_node: 8",
    "max_nodes": "the most nodes of it you may rent, e.g. max_nodes: 2",
    "price_per_node_hour": "USD per node-hour, 0 for owned machines, e.g. price_per_node_hour: 31.92",
    "network": "the name of one of networks:, e.g. network: ethernet",
    "source": 'where the price comes from, e.g. source: "Lambda on-demand pricing page"',
    "date": "when the price was read, e.g. date: 2026-11-09",
}
_OFFER_OPTIONAL = ("intra",)


@dataclass(frozen=True, kw_only=True)
class Offer:
    """One kind of node that can be rented."""

    name: str
    """unique within the file; a candidate's nodes are called ``<name>-0``, ``<name>-1``, ..."""
    gpu: GpuSpec
    gpus_per_node: int
    max_nodes: int
    price_per_node_hour_usd: float
    network: str
    """the name of the network its nodes share with the other offers on it"""
    intra: LinkConfig | None
    """the GPU-to-GPU link inside a node; None: the catalog default of its GPU type"""
    intra_raw: Any
    """``intra`` as the file spelt it, written back into a candidate's cluster config"""
    source: str
    date: str
    """YYYY-MM-DD"""

    @property
    def price_per_gpu_hour_usd(self) -> float:
        return self.price_per_node_hour_usd / self.gpus_per_node


@dataclass(frozen=True, kw_only=True)
class Network:
    name: str
    link: LinkConfig
    raw: dict
    """as the file spelt it, written back into a candidate's cluster config"""


@dataclass(frozen=True, kw_only=True)
class OfferSet:
    """An offers file, validated."""

    name: str
    source_path: str
    networks: dict[str, Network]
    offers: tuple[Offer, ...]
    catalog: GpuCatalog


def shipped_offers() -> dict[str, Path]:
    """The offers files shipped with batchplan (``cluster_configs/offers/``): name (file stem) -> path."""
    return {path.stem: path for path in sorted((cluster_configs_dir() / "offers").glob("*.yaml"))}


def find_offers_file(path: str | os.PathLike[str]) -> Path:
    """The file ``path`` names: itself where it exists, else the shipped offers of that name (``example``)."""
    file_path = Path(path)
    if file_path.exists():
        return file_path
    shipped = shipped_offers()
    stem = file_path.name.removesuffix(".yaml").removesuffix(".yml")
    if file_path.parent == Path(".") and stem in shipped:
        return shipped[stem]
    raise ConfigError(
        f"offers file {file_path} does not exist (check the path; shipped: {', '.join(shipped)})"
    )


def load_offers(path: str | os.PathLike[str], catalog: GpuCatalog | None = None) -> OfferSet:
    """Load and validate an offers file (ConfigError naming the file, the path in it and the fix); ``path``
    may be the name of a shipped one (``example``) where no such file exists here."""
    file_path = find_offers_file(path)
    data = read_yaml_file(file_path, "offers file", limits=_READ_LIMITS)
    return parse_offers(data, str(file_path), catalog=catalog, default_name=file_path.stem)


def parse_offers(
    data: Any, source: str, *, catalog: GpuCatalog | None = None, default_name: str | None = None
) -> OfferSet:
    """Validate parsed YAML as an offers file; ``source`` names it in errors."""
    top = ConfigLocation(source)
    if data is None:
        raise top.error("is empty (expected a mapping with networks: and offers:)")
    expect_mapping(
        data, top, required=_TOP_REQUIRED, optional=("name",), what="a mapping with networks: and offers:"
    )
    name = (
        expect_str(data["name"], top.key("name")) if "name" in data else (default_name or Path(source).stem)
    )
    catalog = catalog or load_catalog()
    problems = ConfigProblems(source)
    networks: dict[str, Network] = {}
    with problems.collect():
        networks = _parse_networks(data["networks"], top.key("networks"), problems)
    offers: list[Offer] = []
    offers_where = top.key("offers")
    raw_offers: list = []
    with problems.collect():
        raw_offers = expect_list(data["offers"], offers_where, what="a list of offers")
    first_index: dict[str, int] = {}
    for i, raw in enumerate(raw_offers):
        with problems.collect():
            offer = _parse_offer(raw, offers_where.index(i), catalog, networks, problems)
            if offer is None:
                continue  # its problems are collected
            if offer.name in first_index:
                raise (
                    offers_where.index(i)
                    .key("name")
                    .error(
                        f"duplicate offer name {offer.name!r} (also offers[{first_index[offer.name]}]; names must be unique)"
                    )
                )
            first_index[offer.name] = i
            offers.append(offer)
    problems.raise_any()
    return OfferSet(name=name, source_path=source, networks=networks, offers=tuple(offers), catalog=catalog)


def _parse_networks(raw: Any, where: ConfigLocation, problems: ConfigProblems) -> dict[str, Network]:
    if not isinstance(raw, dict) or not raw:
        raise where.error(
            "expected a non-empty mapping of network name -> {gbps, latency_us}, e.g. "
            "networks: {ethernet: {gbps: 100, latency_us: 14}}"
        )
    networks: dict[str, Network] = {}
    for name, entry in raw.items():
        with problems.collect():
            _check_name(name, where.key(name), "network name")
            networks[name] = Network(name=name, link=parse_network(entry, where.key(name)), raw=dict(entry))
    return networks


def _check_name(name: Any, where: ConfigLocation, what: str) -> str:
    name = expect_str(name, where)
    if not _NAME.match(name):
        raise where.error(
            f"{what} {name!r} may hold only letters, digits, '.', '_' and '-', start with a letter or "
            "digit and be at most 63 characters (it names the candidate's nodes)"
        )
    return name


def _parse_date(raw: Any, where: ConfigLocation) -> str:
    if isinstance(raw, datetime.date) and not isinstance(raw, datetime.datetime):
        return raw.isoformat()
    text = raw if isinstance(raw, str) else ""
    try:
        if _DATE.match(text):
            return datetime.date.fromisoformat(text).isoformat()
    except ValueError:
        pass
    raise where.error(f"expected a date YYYY-MM-DD (when the price was read), got {raw!r}")


#: an offers file names catalog types only (it has no gpu_types:): what to do about one the catalog lacks
OFFER_GPU_FIX = (
    "offers name catalog types: `batchplan catalog` lists them; a type of your own goes in the "
    "gpu_types: of a cluster config, planned with batchplan plan"
)


def _parse_offer_gpu(raw: Any, where: ConfigLocation, catalog: GpuCatalog) -> GpuSpec:
    """An offer's ``gpu:``: a catalog type (an offers file has no gpu_types: of its own)."""
    name = expect_str(raw, where)
    try:
        return catalog.get(name, fix=OFFER_GPU_FIX)
    except ConfigError as exc:
        raise where.error(str(exc)) from None


def _parse_network_name(raw: Any, where: ConfigLocation, networks: dict[str, Network]) -> str:
    """An offer's ``network:``: the name of one of the file's networks."""
    network = expect_str(raw, where)
    if network not in networks:
        raise where.error(
            f"network {network!r} is not one of networks: ({', '.join(networks)}; add it there)"
        )
    return network


def _parse_source(raw: Any, where: ConfigLocation) -> str:
    """An offer's ``source:`` (where its price comes from), at most ``MAX_SOURCE_CHARS`` characters."""
    source = expect_str(raw, where)
    if len(source) > MAX_SOURCE_CHARS:
        raise where.error(f"{len(source)} characters, over the limit of {MAX_SOURCE_CHARS} (shorten it)")
    return source


def _parse_offer(
    raw: Any,
    where: ConfigLocation,
    catalog: GpuCatalog,
    networks: dict[str, Network],
    problems: ConfigProblems,
) -> Offer | None:
    """One offer; every problem of it collected in ``problems`` (an unknown GPU type is said with a bad price,
    not after it is fixed), and None when it has any."""
    entry = expect_mapping(
        raw, where, required=_OFFER_REQUIRED, optional=_OFFER_OPTIONAL, what="an offer mapping"
    )
    before = len(problems.messages)
    fields: dict[str, Any] = {}

    def field(key: str, parse) -> None:
        with problems.collect():
            fields[key] = parse()

    field("name", lambda: _check_name(entry["name"], where.key("name"), "offer name"))
    field("gpu", lambda: _parse_offer_gpu(entry["gpu"], where.key("gpu"), catalog))
    field(
        "gpus_per_node",
        lambda: expect_int(
            entry["gpus_per_node"],
            where.key("gpus_per_node"),
            minimum=1,
            maximum=MAX_GPUS_PER_NODE,
            hint="GPUs in one node of this offer",
        ),
    )
    field(
        "max_nodes",
        lambda: expect_int(
            entry["max_nodes"],
            where.key("max_nodes"),
            minimum=1,
            maximum=MAX_NODES_PER_OFFER,
            hint="the most nodes of this offer a candidate may take",
        ),
    )
    field(
        "price",
        lambda: expect_number(
            entry["price_per_node_hour"],
            where.key("price_per_node_hour"),
            minimum=0,
            maximum=MAX_PRICE_PER_NODE_HOUR,
            hint="USD per node-hour, 0 for owned machines",
        ),
    )
    field("network", lambda: _parse_network_name(entry["network"], where.key("network"), networks))
    field("source", lambda: _parse_source(entry["source"], where.key("source")))
    field("date", lambda: _parse_date(entry["date"], where.key("date")))
    if entry.get("intra") is not None and "gpu" in fields:
        field("intra", lambda: parse_intra(entry["intra"], where.key("intra"), (fields["gpu"].name,)))
    if len(problems.messages) > before:
        return None
    return Offer(
        name=fields["name"],
        gpu=fields["gpu"],
        gpus_per_node=fields["gpus_per_node"],
        max_nodes=fields["max_nodes"],
        price_per_node_hour_usd=float(fields["price"]),
        network=fields["network"],
        intra=fields.get("intra"),
        intra_raw=entry.get("intra"),
        source=fields["source"],
        date=fields["date"],
    )
