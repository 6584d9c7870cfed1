"""planner.advise.candidates: every count vector within the GPU limit, mixes only on one network, and each
candidate a valid cluster config."""

from __future__ import annotations

import itertools

from planner.advise.candidates import enumerate_candidates
from planner.advise.offers import parse_offers

OFFERS = parse_offers(
    {
        "networks": {"ib": {"gbps": 400}, "eth": {"gbps": 1, "latency_us": 50}},
        "offers": [
            {
                "name": "big",
                "gpu": "A100-SXM4-80GB",
                "gpus_per_node": 8,
                "max_nodes": 2,
                "price_per_node_hour": 20,
                "network": "ib",
                "source": "t",
                "date": "2026-11-09",
            },
            {
                "name": "small",
                "gpu": "T4",
                "gpus_per_node": 1,
                "max_nodes": 5,
                "price_per_node_hour": 0.5,
                "network": "ib",
                "source": "t",
                "date": "2026-11-09",
                "intra": "pcie",
            },
            {
                "name": "lone",
                "gpu": "L4",
                "gpus_per_node": 2,
                "max_nodes": 3,
                "price_per_node_hour": 1,
                "network": "eth",
                "source": "t",
                "date": "2026-11-09",
            },
        ],
    },
    "t.yaml",
)


def _expected(max_gpus: int) -> set[tuple]:
    big, small, lone = OFFERS.offers
    found = set()
    for b, s in itertools.product(range(3), range(6)):
        if 0 < 8 * b + s <= max_gpus:
            found.add(tuple((o.name, n) for o, n in ((big, b), (small, s)) if n))
    for n in range(1, 4):
        if 2 * n <= max_gpus:
            found.add((("lone", n),))
    return found


def test_every_count_vector_within_the_gpu_limit_once():
    for max_gpus in (1, 4, 9, 16, 100):
        got = [
            tuple((o.name, n) for o, n in c.parts)
            for c in enumerate_candidates(OFFERS, OFFERS.offers, max_gpus=max_gpus)
        ]
        assert len(got) == len(set(got))
        assert set(got) == _expected(max_gpus)


def test_offers_on_different_networks_are_never_mixed():
    for candidate in enumerate_candidates(OFFERS, OFFERS.offers, max_gpus=100):
        assert len({o.network for o, _ in candidate.parts}) == 1


def test_a_candidate_is_a_cluster_config_with_its_links_and_price():
    big, small, _ = OFFERS.offers
    candidate = next(
        c
        for c in enumerate_candidates(OFFERS, OFFERS.offers, max_gpus=16)
        if [(o.name, n) for o, n in c.parts] == [("big", 1), ("small", 3)]
    )
    cluster = candidate.cluster(OFFERS)
    assert [n.name for n in cluster.nodes] == ["big-0", "small-0", "small-1", "small-2"]
    assert cluster.num_gpus == candidate.num_gpus == 11
    assert cluster.network is not None and cluster.network.gbps == 400
    assert cluster.node("small-1").intra.kind == "pcie" and cluster.node("big-0").intra is None
    assert candidate.price_per_hour_usd == 20 + 3 * 0.5
    ours, theirs = candidate.interconnect(OFFERS), cluster.interconnect
    for node in cluster.nodes:  # the same figures (their sources name different places)
        for a, b in (
            (ours.network_link(node.name)[0], theirs.network_link(node.name)[0]),
            (
                ours.intra_link(node.name, node.gpus[0].spec.name),
                theirs.intra_link(node.name, node.gpus[0].spec.name),
            ),
        ):
            assert (a.name, a.bus_bytes_per_s, a.step_latency_s) == (
                b.name,
                b.bus_bytes_per_s,
                b.step_latency_s,
            )
    assert candidate.label == "1×big + 3×small" and candidate.slug == "bigx1_smallx3"


def test_more_candidates_than_the_limit_are_refused_with_the_fix():
    import pytest

    from planner.advise.candidates import MAX_CANDIDATES
    from planner.errors import ConfigError

    many = parse_offers(
        {
            "networks": {"n": {"gbps": 10}},
            "offers": [
                {
                    "name": f"o{i}",
                    "gpu": "T4",
                    "gpus_per_node": 1,
                    "max_nodes": 1024,
                    "price_per_node_hour": 1,
                    "network": "n",
                    "source": "t",
                    "date": "2026-11-09",
                }
                for i in range(4)
            ],
        },
        "t.yaml",
    )
    with pytest.raises(
        ConfigError, match=f"more than {MAX_CANDIDATES:,} candidate clusters.*lower --max-gpus"
    ):
        enumerate_candidates(many, many.offers, max_gpus=4096)
