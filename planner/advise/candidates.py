"""Candidate clusters: what a set of offers allows, one offer's nodes or a mix of offers on one network.

A candidate takes ``n_k`` nodes of each offer ``k`` of one network (0 ≤ n_k ≤ ``max_nodes``), at least one node,
at most ``max_gpus`` GPUs in all. Its nodes are called ``<offer>-0``, ``<offer>-1``, ...; as a cluster config
(``cluster_config``) it is exactly what ``batchplan plan --cluster`` reads, so a candidate's plan is one command
away. Pure Python: no torch, Ray or pynvml.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from planner.advise.offers import Offer, OfferSet
from planner.cluster import ClusterSpec, parse_cluster
from planner.errors import ConfigError
from planner.interconnect import Interconnect

MAX_CANDIDATES = 50_000
"""most candidates one search enumerates (a bound each, ~0.15 ms: 50,000 take seconds); more is refused with a
fix (a lower ``--max-gpus``, fewer nodes per offer)"""


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """Some nodes of some offers of one network."""

    network: str
    parts: tuple[tuple[Offer, int], ...]
    """(offer, number of its nodes) for each offer it takes, in the offers file's order; every count ≥ 1"""

    @property
    def num_gpus(self) -> int:
        return sum(offer.gpus_per_node * nodes for offer, nodes in self.parts)

    @property
    def num_nodes(self) -> int:
        return sum(nodes for _, nodes in self.parts)

    @property
    def price_per_hour_usd(self) -> float:
        """the sum of its nodes' prices per hour"""
        return sum(offer.price_per_node_hour_usd * nodes for offer, nodes in self.parts)

    @property
    def label(self) -> str:
        """For people and JSON: ``2×aws-p5 + 1×lambda-a10``."""
        return " + ".join(f"{nodes}×{offer.name}" for offer, nodes in self.parts)

    @property
    def slug(self) -> str:
        """A file-name and cluster-name form of the label: ``aws-p5x2_lambda-a10x1``."""
        return "_".join(f"{offer.name}x{nodes}" for offer, nodes in self.parts)

    def node_names(self) -> Iterator[tuple[str, Offer]]:
        """(node name, its offer) in node-rank order."""
        for offer, nodes in self.parts:
            for i in range(nodes):
                yield f"{offer.name}-{i}", offer

    def interconnect(self, offers: OfferSet) -> Interconnect:
        """The links its cluster config states (``cluster_config(...).interconnect``, without parsing it)."""
        return Interconnect(
            network=offers.networks[self.network].link,
            node_intra={name: offer.intra for name, offer in self.node_names() if offer.intra},
        )

    def cluster_config(self, offers: OfferSet) -> dict[str, Any]:
        """The candidate as cluster-config data (``planner.cluster``): YAML of it is a valid ``--cluster`` file."""
        nodes = []
        for name, offer in self.node_names():
            node: dict[str, Any] = {
                "name": name,
                "gpus": [{"type": offer.gpu.name, "count": offer.gpus_per_node}],
            }
            if offer.intra_raw is not None:
                node["intra"] = offer.intra_raw
            nodes.append(node)
        return {
            "name": f"advise-{self.slug}",
            "network": dict(offers.networks[self.network].raw),
            "nodes": nodes,
        }

    def cluster(self, offers: OfferSet) -> ClusterSpec:
        """The candidate as a validated cluster config."""
        return parse_cluster(
            self.cluster_config(offers), f"advise candidate {self.label}", catalog=offers.catalog
        )


def enumerate_candidates(offers: OfferSet, usable: Sequence[Offer], *, max_gpus: int) -> list[Candidate]:
    """Every candidate over the ``usable`` offers: per network, every count vector (n_k ≤ max_nodes_k, not all
    zero) with at most ``max_gpus`` GPUs, in a fixed order (networks, then offers, as the file lists them).

    Raises:
        ConfigError: more than ``MAX_CANDIDATES`` (with the fix).
    """
    found: list[Candidate] = []
    for network in offers.networks:
        group = [offer for offer in usable if offer.network == network]
        for parts in _count_vectors(group, max_gpus):
            found.append(Candidate(network=network, parts=parts))
            if len(found) > MAX_CANDIDATES:
                raise ConfigError(
                    f"the offers allow more than {MAX_CANDIDATES:,} candidate clusters of at most "
                    f"{max_gpus} GPUs (lower --max-gpus, or the max_nodes of the offers)"
                )
    return found


def _count_vectors(group: Sequence[Offer], gpus_left: int) -> Iterator[tuple[tuple[Offer, int], ...]]:
    """The non-empty (offer, nodes) tuples over ``group`` within ``gpus_left`` GPUs, depth first."""

    def walk(
        k: int, left: int, chosen: tuple[tuple[Offer, int], ...]
    ) -> Iterator[tuple[tuple[Offer, int], ...]]:
        if k == len(group):
            if chosen:
                yield chosen
            return
        offer = group[k]
        most = min(offer.max_nodes, left // offer.gpus_per_node)
        for nodes in range(most + 1):
            part = ((offer, nodes),) if nodes else ()
            yield from walk(k + 1, left - nodes * offer.gpus_per_node, chosen + part)

    yield from walk(0, gpus_left, ())
