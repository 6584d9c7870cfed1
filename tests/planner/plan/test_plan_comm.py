"""planner.plan.comm with build_plan: the ring a plan prices (intra link only on one node, none for one GPU,
the slowest network between nodes), the step it reports, its JSON section, the advice, and old plans."""

from __future__ import annotations

import json

import pytest

from planner.cluster import load_cluster, parse_cluster
from planner.codec import encode
from planner.errors import ConfigError
from planner.interconnect import Interconnect
from planner.job import JobSpec
from planner.plan.build import build_plan
from planner.plan.comm import SyncInputs, comm_summary, section_ring
from planner.plan.io import validate_plan
from planner.plan.types import RankSlot
from planner.profiles.measured_sync import JobSync
from planner.profiles.profile import DeviceProfile
from torchkit.estimate.ddp_sync import RingCost, ddp_buckets, exposed_sync_s
from torchkit.units import GIB, MIB

RESNET50_GRADS = tuple([4 * MIB] * 24 + [1_000_000] * 6)  # ~106 MB in 30 tensors


def _profile(gpu: str, t0: float, t1: float) -> DeviceProfile:
    return DeviceProfile.from_points(
        gpu=gpu,
        method="estimate",
        amp="fp16",
        memory_points=[(b, 2 * GIB + 16 * MIB * b) for b in (1, 16, 64, 256)],
        time_points=[(b, t0 + t1 * b) for b in (1, 16, 64, 256)],
    )


PROFILES = {"a100": _profile("A100-SXM4-80GB", 0.01, 0.0005), "t4": _profile("T4", 0.01, 0.002)}


def _slot(node: str, index: int, profile: str) -> RankSlot:
    return RankSlot(
        node=node,
        device_index=index,
        gpu=PROFILES[profile].gpu,
        profile=profile,
        memory_budget_bytes=10 * GIB,
        total_memory_bytes=16 * GIB,
    )


def _sync(interconnect: Interconnect | None = None, **kw) -> SyncInputs:
    return SyncInputs(
        grad_bytes=RESNET50_GRADS, gradients_source="test", interconnect=interconnect or Interconnect(), **kw
    )


JOB = JobSpec(model="resnet50", global_batch=256)


def test_a_single_gpu_plan_has_no_synchronisation():
    plan = build_plan(JOB, [_slot("a", 0, "a100")], PROFILES, sync=_sync())
    data = encode(plan)
    assert data["predicted_comm_time_s"] == 0.0 and data["comm"]["links"] == []
    assert data["predicted_step_time_s"] == pytest.approx(0.01 + 0.0005 * 256)
    assert comm_summary(plan) == "gradient sync: none (one GPU)"
    assert not any("network" in w for w in plan.warnings)


def test_a_single_node_plan_syncs_over_its_intra_link_only():
    plan = build_plan(JOB, [_slot("a", i, "a100") for i in range(4)], PROFILES, sync=_sync())
    comm = encode(plan)["comm"]
    assert [link["hop"] for link in comm["links"]] == ["intra a"]
    assert comm["links"][0]["link"] == "nvlink" and comm["links"][0]["source"].startswith("catalog: A100")
    assert comm["num_nodes"] == 1 and not any("assumed" in w for w in plan.warnings)
    link = Interconnect().intra_link("a", "A100-SXM4-80GB")
    expected = exposed_sync_s(
        ddp_buckets(RESNET50_GRADS),
        RingCost(num_ranks=4, num_nodes=1, intra=link, network=None),
        compute_s=comm["compute_s"],
        backward_share=2 / 3,
    )
    assert encode(plan)["predicted_comm_time_s"] == pytest.approx(expected)


def test_step_time_is_compute_plus_exposed_sync_and_every_figure_uses_it():
    cluster = parse_cluster(
        {
            "network": {"gbps": 1},
            "nodes": [
                {"name": "a", "gpus": [{"type": "A100-SXM4-80GB", "count": 2}]},
                {"name": "b", "gpus": [{"type": "A100-SXM4-80GB", "count": 2}]},
            ],
        },
        "lab.yaml",
    )
    slots = [_slot("a", 0, "a100"), _slot("a", 1, "a100"), _slot("b", 0, "a100"), _slot("b", 1, "a100")]
    free = build_plan(JOB, slots, PROFILES)
    synced = build_plan(JOB, slots, PROFILES, sync=_sync(cluster.interconnect))
    data = encode(synced)
    comm = data["comm"]
    assert (
        comm["bottleneck"] == "network a"
        and comm["links"][-1]["source"] == "config (lab.yaml: network: 1 Gb/s)"
    )
    sync_s = data["predicted_comm_time_s"]
    assert sync_s > 0.5  # 106 MB over 1 Gb/s: ~1.3 s of all-reduce, little of it hidden
    assert data["predicted_step_time_s"] == pytest.approx(
        free.predicted_step_time_s + sync_s / data["accumulate"]
    )
    assert data["throughput_samples_per_s"] == pytest.approx(
        256 / (data["accumulate"] * data["predicted_step_time_s"])
    )
    assert data["balance_efficiency"] < free.balance_efficiency
    assert data["balance_efficiency_range"][0] < free.balance_efficiency_range[0]
    assert comm["exposed_share"] > 0.3
    low, high = comm["exposed_range_s"]
    assert low == sync_s and comm["allreduce_s"] <= high <= comm["allreduce_s"] * (
        1 + 1e-9
    )  # no overlap: all of it
    assert any("no_sync()" in w and "faster" in w for w in synced.warnings)
    validate_plan(data)
    assert encode(validate_plan(json.loads(json.dumps(data))).comm) == comm


def test_dropping_the_node_behind_the_slow_link_is_advised_with_its_gain():
    cluster = parse_cluster(
        {
            "nodes": [
                {"name": "a", "gpus": [{"type": "A100-SXM4-80GB", "count": 2}]},
                {"name": "t", "network": {"gbps": 1}, "gpus": [{"type": "T4", "count": 2}]},
            ]
        },
        "lab.yaml",
    )
    slots = [_slot("a", 0, "a100"), _slot("a", 1, "a100"), _slot("t", 0, "t4"), _slot("t", 1, "t4")]
    plan = build_plan(JOB, slots, PROFILES, sync=_sync(cluster.interconnect))
    assert encode(plan)["comm"]["bottleneck"] == "network t"
    drop = [w for w in plan.warnings if w.startswith("dropping the 2 T4 ranks")]
    assert drop and "faster" in drop[0]
    # the assumed network of node a is said once, naming the node
    assumed = [w for w in plan.warnings if "not stated" in w]
    assert len(assumed) == 1 and "100 Gb/s Ethernet assumed for a " in assumed[0]


def test_shipped_1g_and_100g_demo_configs_state_their_network():
    slow, fast = load_cluster("demo-mixed-1g"), load_cluster("demo-mixed-100g")
    assert slow.network.gbps == 1 and fast.network.gbps == 100
    assert (
        [n.name for n in slow.nodes]
        == [n.name for n in fast.nodes]
        == [n.name for n in load_cluster("demo-mixed").nodes]
    )


def test_old_plans_without_comm_still_validate_and_a_broken_comm_section_does_not():
    plan = encode(build_plan(JOB, [_slot("a", 0, "a100"), _slot("a", 1, "a100")], PROFILES, sync=_sync()))
    old = {k: v for k, v in plan.items() if k not in ("comm", "predicted_comm_time_s")}
    validate_plan(old)
    with pytest.raises(ConfigError, match="predicted_comm_time_s"):
        validate_plan({**plan, "predicted_comm_time_s": -1})
    with pytest.raises(ConfigError, match=r"comm\.num_ranks"):
        validate_plan({**plan, "comm": {**plan["comm"], "num_ranks": 7}})


@pytest.mark.parametrize(
    ("snippet", "pattern"),
    [
        ({"network": {"gbps": 0}}, r"lab\.yaml: network\.gbps: must be greater than 0"),
        ({"network": {"gbps": 1e7}}, r"network\.gbps: must be at most 100000"),
        ({"network": {"gbps": 10, "latency_us": -3}}, r"network\.latency_us: must be at least 0"),
        ({"network": {"gbps": "fast"}}, r"network\.gbps: expected a number"),
        ({"network": {"bandwidth": 10}}, r"network\.bandwidth: unknown key"),
        ({"network": 10}, r"network: expected a mapping like \{gbps: 100"),
    ],
)
def test_network_config_errors_name_the_key_and_the_fix(snippet, pattern):
    with pytest.raises(ConfigError, match=pattern):
        parse_cluster({**snippet, "nodes": [{"name": "a", "gpus": [{"type": "T4"}]}]}, "lab.yaml")


@pytest.mark.parametrize(
    ("intra", "pattern"),
    [
        ("nvlink", r"nodes\[0\]\.intra: nvlink: T4 has no NVLink figure"),
        ("infiniband", r"nodes\[0\]\.intra: expected nvlink, nvlink-bridge, pcie, pcie-x8 .* or \{gbps: N\}"),
        ({"gbps": -5}, r"nodes\[0\]\.intra\.gbps: must be greater than 0"),
        ("pcie-x6", r"nodes\[0\]\.intra: pcie-x6: a PCIe slot has x1, x2, x4, x8 or x16 lanes"),
        ("nvlink-x8", r"nodes\[0\]\.intra: expected nvlink, nvlink-bridge"),
        ("nvlink-bridge", r"nodes\[0\]\.intra: nvlink-bridge: T4 takes no NVLink bridge"),
    ],
)
def test_intra_config_errors_name_the_node_and_the_fix(intra, pattern):
    with pytest.raises(ConfigError, match=pattern):
        parse_cluster({"nodes": [{"name": "a", "intra": intra, "gpus": [{"type": "T4"}]}]}, "lab.yaml")


def test_intra_overrides_the_catalog_and_a_node_network_the_clusters():
    cluster = parse_cluster(
        {
            "network": {"gbps": 25},
            "nodes": [
                {"name": "a", "intra": "pcie", "gpus": [{"type": "A100-SXM4-80GB", "count": 2}]},
                {
                    "name": "b",
                    "intra": {"gbps": 400, "latency_us": 2},
                    "network": {"gbps": 10},
                    "gpus": [{"type": "T4", "count": 2}],
                },
            ],
        },
        "lab.yaml",
    )
    net = cluster.interconnect
    assert net.intra_link("a", "A100-SXM4-80GB").name == "pcie4"
    assert (
        net.intra_link("b", "T4").bus_bytes_per_s == 50e9 and net.intra_link("b", "T4").step_latency_s == 2e-6
    )
    assert (
        net.network_link("a")[0].bus_bytes_per_s == 25e9 / 8
        and net.network_link("b")[0].bus_bytes_per_s == 10e9 / 8
    )


def test_a_pcie_link_goes_with_its_lanes_and_bridged_pairs_cross_pcie_between_them():
    """issue #32: PCIe 5.0 x8 vs x16 vs NVLink bridges, the links of the MLPerf H100-PCIe systems."""
    cluster = parse_cluster(
        {
            "nodes": [
                {"name": "x16", "intra": "pcie", "gpus": [{"type": "H100-PCIe-80GB", "count": 8}]},
                {"name": "x8", "intra": "pcie-x8", "gpus": [{"type": "H100-PCIe-80GB", "count": 8}]},
                {"name": "nvb", "intra": "nvlink-bridge", "gpus": [{"type": "H100-PCIe-80GB", "count": 4}]},
            ]
        },
        "lab.yaml",
    )
    net = cluster.interconnect
    x16, x8 = net.intra_link("x16", "H100-PCIe-80GB", 8), net.intra_link("x8", "H100-PCIe-80GB", 8)
    assert (x16.name, x8.name) == ("pcie5", "pcie5x8")
    assert x8.bus_bytes_per_s == pytest.approx(x16.bus_bytes_per_s / 2) and "pcie-x8" in x8.source
    pairs, two = net.intra_link("nvb", "H100-PCIe-80GB", 4), net.intra_link("nvb", "H100-PCIe-80GB", 2)
    assert pairs.bus_bytes_per_s == x16.bus_bytes_per_s  # the ring crosses PCIe between the bridged pairs
    assert x16.step_latency_s > pairs.step_latency_s > two.step_latency_s  # half its steps on NVLink
    assert two.name == "nvlink-bridge" and two.bus_bytes_per_s == 116e9  # two cards: one bridge, all NVLink


@pytest.mark.slow  # estimates ResNet-50 on three GPU types (about a minute on 2 cores)
def test_demo_mixed_over_1g_and_100g_plans_differ_and_the_slow_one_advises_with_its_gain(tmp_path):
    from planner.driver import DriverOptions, plan_without_ray
    from planner.profiles.cache import ProfileCache

    job = JobSpec(model="resnet50", global_batch=768)
    options = DriverOptions(cache=ProfileCache(tmp_path))
    slow = plan_without_ray(job, load_cluster("demo-mixed-1g"), options=options).plan
    fast = plan_without_ray(job, load_cluster("demo-mixed-100g"), options=options).plan
    for plan in (slow, fast):
        assert plan.comm.gradient_bytes > 100e6  # ResNet-50: 25.6 M fp32 parameters
        assert not any("not modelled" in w for w in plan.warnings)
    assert slow.predicted_step_time_s > 3 * fast.predicted_step_time_s
    assert slow.comm.exposed_share > 0.3 > fast.comm.exposed_share
    assert any("no_sync()" in w and "× faster" in w for w in slow.warnings)
    assert any(w.startswith(("dropping", "keeping only")) and "× faster" in w for w in slow.warnings)
    assert not any("no_sync()" in w for w in fast.warnings)
    assert "exposed sync" in comm_summary(slow) and "of it" in comm_summary(slow)


def _job_sync(slowdown: float) -> JobSync:
    return JobSync(
        slowdown=slowdown,
        measured_exposed_s=0.02,
        predicted_exposed_s=0.005,
        compute_s=0.1,
        steps=9,
        link="gloo, 2 node(s), 4 rank(s)",
        created="2026-12-02T08:00:00+00:00",
    )


def test_a_job_measured_slowdown_answers_its_own_ring_only_and_says_so():
    cluster = parse_cluster(
        {
            "network": {"gbps": 10},
            "nodes": [
                {"name": "a", "gpus": [{"type": "A100-SXM4-80GB", "count": 2}]},
                {"name": "b", "gpus": [{"type": "A100-SXM4-80GB", "count": 2}]},
            ],
        },
        "lab.yaml",
    )
    slots = [_slot("a", 0, "a100"), _slot("a", 1, "a100"), _slot("b", 0, "a100"), _slot("b", 1, "a100")]
    model = encode(build_plan(JOB, slots, PROFILES, sync=_sync(cluster.interconnect)))
    assert model["comm"]["exposed_source"] == "the links' model" and model["comm"]["slowdown"] == 1.0
    shape = model["comm"]["ring_shape"]
    assert shape.startswith("ax2;bx2;intra a=nvlink@") and "network b=network@1.25e+09B/s" in shape
    measured = build_plan(
        JOB, slots, PROFILES, sync=_sync(cluster.interconnect, job_sync={shape: _job_sync(3.0)})
    )
    data = encode(measured)
    assert data["comm"]["slowdown"] == 3.0 and data["comm"]["job_sync"]["measured_exposed_s"] == 0.02
    assert data["comm"]["exposed_source"].startswith(
        "measured in the job (gloo, 2 node(s), 4 rank(s); 9 steps"
    )
    assert data["predicted_comm_time_s"] > model["predicted_comm_time_s"]
    ring, buckets = section_ring(measured.comm)  # the links' own ring, which the job checks itself against
    slowed = RingCost(num_ranks=4, num_nodes=2, intra=ring.intra, network=ring.network, slowdown=3.0)
    assert data["predicted_comm_time_s"] == pytest.approx(
        exposed_sync_s(buckets, slowed, compute_s=data["comm"]["compute_s"], backward_share=2 / 3)
    )
    assert any(n.startswith("exposed gradient synchronisation measured in the job") for n in data["notes"])
    assert "measured in the job: all-reduces 3× the links' time" in comm_summary(measured)
    validate_plan(data)
    # another ring (one node's ranks, or another network) is not answered by it
    other = build_plan(
        JOB, slots[:2], PROFILES, sync=_sync(cluster.interconnect, job_sync={shape: _job_sync(3.0)})
    )
    assert encode(other)["comm"]["slowdown"] == 1.0
    faster = parse_cluster(
        {
            "network": {"gbps": 100},
            "nodes": [
                {"name": "a", "gpus": [{"type": "A100-SXM4-80GB", "count": 2}]},
                {"name": "b", "gpus": [{"type": "A100-SXM4-80GB", "count": 2}]},
            ],
        },
        "lab.yaml",
    )
    elsewhere = build_plan(
        JOB, slots, PROFILES, sync=_sync(faster.interconnect, job_sync={shape: _job_sync(3.0)})
    )
    assert encode(elsewhere)["comm"]["exposed_source"] == "the links' model"
