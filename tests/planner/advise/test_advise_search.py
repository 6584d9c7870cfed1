"""planner.advise.search over ResNet-50 profiles (estimated once per GPU type, cached under tmp): the pruned
search gives the brute-force front on random offer sets, its bound is never below a plan's throughput, a
1 Gb/s network keeps multi-node points off the front and an InfiniBand-class one puts them on it, the filters
reject with one line each, and a searched plan is the one ``plan_without_ray`` makes of the candidate's
config."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.advise.candidates import enumerate_candidates
from planner.advise.evaluate import AdviseContext
from planner.advise.offers import parse_offers
from planner.advise.search import Filters, pareto_front, search
from planner.driver import DriverOptions, plan_without_ray
from planner.job import JobSpec
from planner.profiles.cache import ProfileCache

TYPES = ("A100-SXM4-80GB", "H100-SXM5-80GB", "T4", "L4")
EPOCH = 1_281_167


def _offers(entries: list[dict], networks: dict[str, dict]):
    full = [
        {
            "max_nodes": 1,
            "price_per_node_hour": 1.0,
            "network": "net",
            "source": "test",
            "date": "2026-11-09",
            "gpus_per_node": 1,
            **e,
        }
        for e in entries
    ]
    return parse_offers({"networks": networks, "offers": full}, "test-offers.yaml")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return ProfileCache(tmp_path_factory.mktemp("profiles"))


@pytest.fixture(scope="module")
def context(cache):
    offers = _offers([{"name": f"o{i}", "gpu": t} for i, t in enumerate(TYPES)], {"net": {"gbps": 10}})
    return AdviseContext(JobSpec(model="resnet50"), offers, epoch_samples=EPOCH, cache=cache)


@pytest.fixture(scope="module")
def batch_context(cache):
    offers = _offers([{"name": f"o{i}", "gpu": t} for i, t in enumerate(TYPES)], {"net": {"gbps": 10}})
    return AdviseContext(
        JobSpec(model="resnet50", global_batch=512), offers, epoch_samples=EPOCH, cache=cache
    )


def _run(context, offers, max_gpus=16, filters=Filters(), prune=True):
    ctx = context.with_offers(offers)
    candidates = enumerate_candidates(
        offers, [o for o in offers.offers if ctx.holds_job(o) is None], max_gpus=max_gpus
    )
    return ctx, candidates, search(ctx, candidates, filters, prune=prune)


def _points(result):
    return [(p.candidate.label, p.time_per_epoch_s, p.cost_per_epoch_usd) for p in result.front]


offer_entry = st.fixed_dictionaries(
    {
        "gpu": st.sampled_from(TYPES),
        "gpus_per_node": st.sampled_from((1, 2, 4, 8)),
        "max_nodes": st.integers(1, 4),
        "price_per_node_hour": st.sampled_from((0.0, 0.35, 1.29, 2.69, 8.0, 21.96, 55.04)),
        "network": st.sampled_from(("a", "b")),
    }
)


@pytest.mark.slow
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    entries=st.lists(offer_entry, min_size=2, max_size=5),
    gbps=st.tuples(st.sampled_from((1, 10, 100, 400)), st.sampled_from((1, 10, 100, 400))),
)
def test_the_pruned_front_is_the_brute_force_front(context, entries, gbps):
    offers = _offers(
        [{**e, "name": f"o{i}"} for i, e in enumerate(entries)],
        {"a": {"gbps": gbps[0]}, "b": {"gbps": gbps[1], "latency_us": 50}},
    )
    _, candidates, pruned = _run(context, offers, max_gpus=12)
    _, _, brute = _run(context, offers, max_gpus=12, prune=False)
    assert _points(pruned) == _points(brute)
    assert brute.planned == len(candidates) and pruned.planned + pruned.pruned == len(candidates)
    for point in brute.evaluated:
        assert point.samples_per_s <= point.bound_samples_per_s


@pytest.mark.slow
@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(entries=st.lists(offer_entry, min_size=2, max_size=3))
def test_with_a_global_batch_the_pruned_front_is_the_brute_force_front(batch_context, entries):
    offers = _offers(
        [{**e, "name": f"o{i}", "max_nodes": min(e["max_nodes"], 2)} for i, e in enumerate(entries)],
        {"a": {"gbps": 100}, "b": {"gbps": 1}},
    )
    _, _, pruned = _run(batch_context, offers, max_gpus=8)
    _, _, brute = _run(batch_context, offers, max_gpus=8, prune=False)
    assert _points(pruned) == _points(brute)
    for point in brute.evaluated:
        assert point.samples_per_s <= point.bound_samples_per_s


def _nodes_offers(gbps: float, latency_us: float):
    return _offers(
        [
            {"name": "one", "gpu": "A100-SXM4-80GB", "max_nodes": 8, "price_per_node_hour": 1.39},
            {
                "name": "eight",
                "gpu": "A100-SXM4-80GB",
                "gpus_per_node": 8,
                "max_nodes": 2,
                "price_per_node_hour": 22.32,
            },
        ],
        {"net": {"gbps": gbps, "latency_us": latency_us}},
    )


def test_over_1_gbps_no_multi_node_point_is_faster_than_the_best_single_node(context):
    # ResNet-50's 102 MB of fp32 gradients over 1 Gb/s: the MIT row of comm-and-prices.md §2.3 (~0.12 GB/s
    # links) has synchronisation > 50% of the step; a single node then wins
    _, _, brute = _run(context, _nodes_offers(1, 50), prune=False)
    single = [p for p in brute.evaluated if p.candidate.num_nodes == 1]
    multi = [p for p in brute.evaluated if p.candidate.num_nodes > 1]
    assert single and multi
    fastest_single_s = min(p.time_per_epoch_s for p in single)
    assert all(p.time_per_epoch_s > fastest_single_s for p in multi)
    assert min(multi, key=lambda p: p.time_per_epoch_s).plan.comm.exposed_share > 0.5
    assert brute.front[0].candidate.label == "1×eight"
    # a multi-node point stays on the front only as a cheaper, slower one, where the sync does not dominate
    assert all(p.plan.comm.exposed_share < 0.5 for p in brute.front if p.candidate.num_nodes > 1)


def test_over_infiniband_class_links_multi_node_points_are_on_the_front(context):
    _, _, result = _run(context, _nodes_offers(400, 14))
    assert result.front[0].candidate.label == "2×eight"
    assert any(p.candidate.num_nodes > 1 for p in result.front)
    share = result.front[0].plan.comm.exposed_share
    assert share < 0.2


def test_filters_reject_with_a_line_each_and_keep_the_rest(context):
    offers = _nodes_offers(400, 14)
    _, candidates, everything = _run(context, offers)
    _, _, budget = _run(context, offers, filters=Filters(budget_per_hour_usd=10.0))
    over = [c for c in candidates if c.price_per_hour_usd > 10.0]
    assert len([r for r in budget.rejected if "--budget-per-hour 10" in r.reason]) == len(over)
    assert all(p.candidate.price_per_hour_usd <= 10.0 for p in budget.evaluated)
    deadline_s = sorted(p.time_per_epoch_s for p in everything.front)[1]
    _, _, quick = _run(context, offers, filters=Filters(deadline_s=deadline_s))
    assert all(p.time_per_epoch_s <= deadline_s for p in quick.front)
    assert any("--deadline" in r.reason for r in quick.rejected)
    assert len(quick.front) == 2


def test_a_global_batch_no_candidate_reaches_is_a_rejection_with_the_allocators_reason(cache):
    # one sample per optimizer step cannot be split over two ranks of at least one sample each
    offers = _offers([{"name": "t4", "gpu": "T4", "max_nodes": 2}], {"net": {"gbps": 10}})
    ctx = AdviseContext(JobSpec(model="resnet50", global_batch=1), offers, epoch_samples=EPOCH, cache=cache)
    result = search(ctx, enumerate_candidates(offers, offers.offers, max_gpus=16))
    assert [p.candidate.label for p in result.front] == ["1×t4"]
    (rejected,) = result.rejected
    assert rejected.cluster == "2×t4" and "global batch" in rejected.reason and "\n" not in rejected.reason


def test_a_searched_plan_is_the_plan_of_the_candidates_cluster_config(context, cache):
    offers = _offers(
        [
            {
                "name": "a100",
                "gpu": "A100-SXM4-80GB",
                "gpus_per_node": 2,
                "max_nodes": 2,
                "price_per_node_hour": 3,
            },
            {
                "name": "t4",
                "gpu": "T4",
                "gpus_per_node": 2,
                "max_nodes": 1,
                "price_per_node_hour": 1,
                "intra": "pcie",
            },
        ],
        {"net": {"gbps": 25, "latency_us": 20}},
    )
    ctx, candidates, _ = _run(context, offers)
    for candidate in candidates:
        ours = ctx.evaluate(candidate).plan
        theirs = plan_without_ray(ctx.job, candidate.cluster(offers), options=DriverOptions(cache=cache)).plan
        assert [(r.node, r.gpu, r.batch) for r in ours.ranks] == [
            (r.node, r.gpu, r.batch) for r in theirs.ranks
        ]
        assert ours.throughput_samples_per_s == theirs.throughput_samples_per_s
        assert ours.predicted_comm_time_s == theirs.predicted_comm_time_s


def test_a_searched_plan_prices_an_exposed_sync_as_the_plan_line_does(context, cache):
    """Where the all-reduce is not hidden (a slow network), its exposed part depends on how much of the step is
    backward: advise takes its GPU types' share as the driver does, so the point's figures are its plan
    line's (they differed: 52,345 vs 51,699 samples/s, sync 12% vs 13%, on the README's example)."""
    offers = _offers(
        [{"name": "h100", "gpu": "H100-SXM5-80GB", "gpus_per_node": 8, "max_nodes": 2}],
        {"net": {"gbps": 100, "latency_us": 14}},
    )
    ctx, candidates, _ = _run(context, offers)
    two_nodes = next(c for c in candidates if c.num_nodes == 2)
    ours = ctx.evaluate(two_nodes).plan
    theirs = plan_without_ray(ctx.job, two_nodes.cluster(offers), options=DriverOptions(cache=cache)).plan
    assert ours.predicted_comm_time_s > 0  # exposed: the share matters
    assert ours.comm.backward_share == theirs.comm.backward_share != 2 / 3
    assert ours.throughput_samples_per_s == theirs.throughput_samples_per_s
    assert ours.predicted_comm_time_s == theirs.predicted_comm_time_s
    assert ctx.bound_samples_per_s(two_nodes) >= ours.throughput_samples_per_s


def test_the_front_is_the_undominated_points_fastest_first(context):
    _, _, result = _run(context, _nodes_offers(10, 30), prune=False)
    front = pareto_front(result.evaluated)
    for p in result.evaluated:
        dominated = any(
            q.time_per_epoch_s <= p.time_per_epoch_s
            and q.cost_per_epoch_usd <= p.cost_per_epoch_usd
            and (q.time_per_epoch_s, q.cost_per_epoch_usd) != (p.time_per_epoch_s, p.cost_per_epoch_usd)
            for q in result.evaluated
        )
        assert (p in front) == (not dominated)
    assert [p.time_per_epoch_s for p in front] == sorted(p.time_per_epoch_s for p in front)


def test_a_point_carries_its_time_range_and_says_when_its_gpu_is_uncalibrated(context):
    _, _, result = _run(context, _nodes_offers(400, 14))
    for point in result.front:
        low, high = point.time_per_epoch_range_s
        assert low < point.time_per_epoch_s < high
    assert context.uncalibrated(result.front[0].candidate) == []  # A100-SXM4-80GB has calibration rows
    t4 = _offers(
        [{"name": "t", "gpu": "T4"}], {"net": {"gbps": 10}}
    )  # Turing has rows (issue #32), the T4 none
    (line,) = context.with_offers(t4).uncalibrated(enumerate_candidates(t4, t4.offers, max_gpus=1)[0])
    assert line.startswith("T4: no calibration rows")
    h100 = _offers([{"name": "h", "gpu": "H100-SXM5-80GB"}], {"net": {"gbps": 10}})  # MLPerf rows: calibrated
    assert (
        context.with_offers(h100).uncalibrated(enumerate_candidates(h100, h100.offers, max_gpus=1)[0]) == []
    )


def test_an_offer_whose_gpu_cannot_hold_the_minimum_batch_is_ruled_out(context):
    tight = dataclasses.replace(context.job, min_batch=10_000)
    ctx = context.with_offers(_nodes_offers(10, 30))
    ctx.job = tight
    reason = ctx.holds_job(ctx.offers.offers[0])
    assert reason is not None and "below the minimum batch 10000" in reason
