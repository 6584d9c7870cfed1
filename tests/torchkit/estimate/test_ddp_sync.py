"""The DDP synchronisation model: buckets against DDP's own (real gloo process groups on 127.0.0.1), the ring
formula, the overlap rules of the spec, and the alpha-beta fit against synthetic links with known figures."""

from __future__ import annotations

import json
import random
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from tests.gloo import run_ranks
from torchkit.estimate.ddp_sync import (
    Bucket,
    LinkCost,
    RingCost,
    ddp_buckets,
    exposed_sync_s,
    fit_link,
    fit_slowdown,
    gradient_bytes_of,
    sync_timeline,
)
from torchkit.units import MIB


def _models() -> dict[str, torch.nn.Module]:
    """Models whose buckets differ: many small layers, one huge layer, a frozen part, a shared parameter."""
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(
        *[torch.nn.Linear(300, 300) for _ in range(8)], torch.nn.Linear(300, 2000), torch.nn.Linear(2000, 10)
    )
    wide = torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.Linear(64, 120_000), torch.nn.Linear(120_000, 4)
    )
    frozen = torch.nn.Sequential(
        torch.nn.Linear(500, 500), torch.nn.Linear(500, 500), torch.nn.Linear(500, 3)
    )
    frozen[0].weight.requires_grad_(False)
    conv = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3),
        torch.nn.BatchNorm2d(64),
        torch.nn.Conv2d(64, 256, 3),
        torch.nn.Conv2d(256, 256, 3),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(256, 10),
    )
    return {"mlp": mlp, "wide": wide, "frozen": frozen, "conv": conv}


def _inputs(name: str) -> torch.Tensor:
    return {
        "mlp": torch.randn(2, 300),
        "wide": torch.randn(2, 64),
        "frozen": torch.randn(2, 500),
        "conv": torch.randn(2, 3, 12, 12),
    }[name]


CAPS = (None, 1, 0.5, 4)


def _ddp_worker(rank: int, out: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
    try:
        result = {}
        for name in _models():
            for cap in CAPS:
                ddp = DistributedDataParallel(_models()[name], bucket_cap_mb=cap)
                for _ in range(3):  # DDP rebuilds its buckets in gradient-ready order at the second forward
                    ddp(_inputs(name)).float().sum().backward()
                data = ddp._get_ddp_logging_data()
                assert "rebuilt_bucket_sizes" in data, (name, cap, data)
                result[f"{name}/{cap}"] = {
                    "sizes": data["rebuilt_bucket_sizes"],
                    "indices": data["rebuilt_per_bucket_param_indices"],
                    "ready_order": [
                        int(i) for i in data["prev_iteration_grad_ready_order_indices"].split(",")
                    ],
                }
        if rank == 0:
            Path(out).write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ddp_buckets_seen(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("buckets") / "buckets.json"
    run_ranks(_ddp_worker, str(out), world_size=2, log_dir=out.parent / "logs")
    return json.loads(out.read_text())


def _listed(buckets) -> tuple[str, str]:
    """Bucket sizes and indices the way ``_get_ddp_logging_data`` writes them."""
    return (
        ", ".join(str(b.size_bytes) for b in buckets),
        ", ".join(" ".join(str(i) for i in b.param_indices) for b in buckets),
    )


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize("cap", CAPS)
@pytest.mark.parametrize("name", ["mlp", "wide", "frozen", "conv"])
def test_bucket_model_matches_ddp_rebuilt_buckets_given_its_ready_order(ddp_buckets_seen, name, cap):
    model = _models()[name]
    seen = ddp_buckets_seen[f"{name}/{cap}"]
    # DDP numbers the parameters that require grad only; so does gradient_bytes_of
    buckets = ddp_buckets(gradient_bytes_of(model), cap, ready_order=seen["ready_order"])
    assert _listed(buckets) == (seen["sizes"], seen["indices"])


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize("cap", CAPS)
@pytest.mark.parametrize("name", ["mlp", "wide", "frozen", "conv"])
def test_reverse_registration_order_gives_ddp_buckets_up_to_a_bias_at_a_boundary(ddp_buckets_seen, name, cap):
    model = _models()[name]
    seen = ddp_buckets_seen[f"{name}/{cap}"]
    buckets = ddp_buckets(gradient_bytes_of(model), cap)
    if name != "conv":  # linear layers release the bias's gradient first: reverse order is exact
        assert _listed(buckets) == (seen["sizes"], seen["indices"])
    real = [int(s) for s in seen["sizes"].split(", ")]
    assert len(buckets) == len(real)
    biggest_bias = max(p.numel() * 4 for n, p in model.named_parameters() if n.endswith("bias"))
    assert all(abs(b.size_bytes - r) <= biggest_bias for b, r in zip(buckets, real, strict=True))


def test_first_bucket_is_1_mib_by_default_and_the_cap_otherwise():
    sizes = [MIB // 2] * 20  # 10 MiB in 20 gradients
    default = ddp_buckets(sizes)
    assert [b.size_bytes for b in default] == [MIB, 9 * MIB]
    assert [b.size_bytes for b in ddp_buckets(sizes, 4)] == [4 * MIB, 4 * MIB, 2 * MIB]
    assert default[0].param_indices == (19, 18)  # reverse registration order: the last layer is ready first
    assert [b.ready_share for b in default] == [0.1, 1.0]
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        ddp_buckets(sizes, 0)


def _ring(n: int, nodes: int, intra_gb_s: float = 100.0, net_gb_s: float = 10.0) -> RingCost:
    intra = LinkCost(name="nvlink", bus_bytes_per_s=intra_gb_s * 1e9, step_latency_s=3.4e-6)
    net = LinkCost(name="network", bus_bytes_per_s=net_gb_s * 1e9, step_latency_s=14e-6)
    return RingCost(
        num_ranks=n, num_nodes=nodes, intra=intra if n > nodes else None, network=net if nodes > 1 else None
    )


def test_ring_allreduce_is_alpha_plus_2_n_minus_1_over_n_bytes_over_the_slowest_link():
    ring = _ring(16, 2)  # 2 nodes × 8: 30 steps, 2 of them over the network
    assert ring.bottleneck.name == "network"
    assert ring.alpha_s == pytest.approx(8.4e-6 + 28 * 3.4e-6 + 2 * 14e-6)
    assert ring.allreduce_s(100e6) == pytest.approx(ring.alpha_s + 2 * 15 / 16 * 100e6 / 10e9)
    single_node = _ring(8, 1)
    assert single_node.bottleneck.name == "nvlink" and single_node.network is None
    assert single_node.allreduce_s(100e6) == pytest.approx(8.4e-6 + 14 * 3.4e-6 + 2 * 7 / 8 * 100e6 / 100e9)
    assert _ring(1, 1).allreduce_s(100e6) == 0.0


def test_exposed_is_the_whole_allreduce_with_one_bucket_and_latency_only_on_infinite_bandwidth():
    grads = [4 * MIB] * 25
    one = ddp_buckets(grads, 1000)
    ring = _ring(4, 2)
    assert exposed_sync_s(one, ring, compute_s=0.3, backward_share=2 / 3) == pytest.approx(
        ring.allreduce_s(100 * MIB)
    )
    fast = RingCost(
        num_ranks=4,
        num_nodes=2,
        intra=None,
        network=LinkCost(name="network", bus_bytes_per_s=1e30, step_latency_s=14e-6),
    )
    buckets = ddp_buckets(grads)
    assert exposed_sync_s(buckets, fast, compute_s=0.3, backward_share=2 / 3) == pytest.approx(fast.alpha_s)


def test_exposed_falls_with_bandwidth_and_with_longer_backward():
    buckets = ddp_buckets([MIB] * 100)
    times = [
        exposed_sync_s(buckets, _ring(8, 4, net_gb_s=g), compute_s=0.1, backward_share=2 / 3)
        for g in (0.5, 1, 5, 25, 100)
    ]
    assert all(a > b for a, b in zip(times, times[1:], strict=False))
    ring = _ring(8, 4, net_gb_s=5)
    by_compute = [
        exposed_sync_s(buckets, ring, compute_s=c, backward_share=2 / 3) for c in (0.01, 0.05, 0.1, 0.5)
    ]
    assert all(a >= b for a, b in zip(by_compute, by_compute[1:], strict=False))


def test_one_node_equals_two_nodes_with_an_infinitely_fast_network_but_its_latency():
    buckets = ddp_buckets([MIB] * 60)
    intra = LinkCost(name="pcie4", bus_bytes_per_s=24e9, step_latency_s=0.0)
    net = LinkCost(name="network", bus_bytes_per_s=1e30, step_latency_s=0.0)
    one = RingCost(num_ranks=8, num_nodes=1, intra=intra, network=None)
    two = RingCost(num_ranks=8, num_nodes=2, intra=intra, network=net)
    assert exposed_sync_s(buckets, one, compute_s=0.05, backward_share=0.6) == pytest.approx(
        exposed_sync_s(buckets, two, compute_s=0.05, backward_share=0.6)
    )


def test_buckets_wait_for_the_communication_stream():
    buckets = (
        Bucket(param_indices=(1,), size_bytes=10, ready_share=0.5),
        Bucket(param_indices=(0,), size_bytes=10, ready_share=1.0),
    )
    slow = RingCost(
        num_ranks=2,
        num_nodes=2,
        intra=None,
        network=LinkCost(name="network", bus_bytes_per_s=10.0, step_latency_s=0.0),
        base_latency_s=0.0,
    )
    timeline = sync_timeline(buckets, slow, backward_start_s=1.0, backward_s=2.0)  # each all-reduce takes 1 s
    assert timeline.bucket_start_s == (2.0, 3.0)  # the second is ready at 3.0 and the stream is free at 3.0
    assert timeline.exposed_s == pytest.approx(1.0)
    late = sync_timeline(buckets, slow, backward_start_s=0.0, backward_s=0.2)
    assert late.bucket_start_s == pytest.approx((0.1, 1.1)) and late.exposed_s == pytest.approx(1.9)
    # with no overlap (a CPU host whose backward keeps its cores busy) every all-reduce waits for the backward
    none = sync_timeline(buckets, slow, backward_start_s=1.0, backward_s=2.0, overlap_efficiency=0.0)
    assert none.bucket_end_s == pytest.approx((4.0, 5.0)) and none.exposed_s == pytest.approx(2.0)
    half = sync_timeline(buckets, slow, backward_start_s=1.0, backward_s=2.0, overlap_efficiency=0.5)
    # bucket 1 starts at 2.0, does 0.5 s of work by 3.0 and the rest by 3.5; bucket 2 then runs alone
    assert half.bucket_end_s == pytest.approx((3.5, 4.5)) and half.exposed_s == pytest.approx(1.5)
    # a free all-reduce (a zero-latency ring's empty bucket) with no overlap ends where it starts
    free = RingCost(
        num_ranks=2,
        num_nodes=1,
        intra=LinkCost(name="x", bus_bytes_per_s=1.0, step_latency_s=0.0),
        network=None,
        base_latency_s=0.0,
    )
    empty = (Bucket(param_indices=(0,), size_bytes=0, ready_share=0.5),)
    assert (
        sync_timeline(empty, free, backward_start_s=1.0, backward_s=2.0, overlap_efficiency=0.0).exposed_s
        == 0.0
    )


@pytest.mark.parametrize(("alpha_us", "bus_gb_s", "n"), [(50.0, 1.0, 2), (300.0, 0.11, 4), (12.0, 24.0, 8)])
def test_fit_recovers_alpha_and_busbw_of_a_synthetic_link(alpha_us, bus_gb_s, n):
    rng = random.Random(7)
    sizes = [2**k for k in range(16, 28, 2)] * 3  # 64 KiB .. 128 MiB, three repeats
    factor = 2 * (n - 1) / n
    times = [
        (alpha_us * 1e-6 + factor * s / (bus_gb_s * 1e9)) * (1 + rng.uniform(-0.03, 0.03)) for s in sizes
    ]
    fit = fit_link(sizes, times, n)
    assert fit.bus_bytes_per_s == pytest.approx(bus_gb_s * 1e9, rel=0.05)
    assert fit.alpha_s == pytest.approx(alpha_us * 1e-6, rel=0.15)
    assert fit.rms_relative_error < 0.03


def test_fit_refuses_what_it_cannot_fit():
    with pytest.raises(ValueError, match="two or more distinct"):
        fit_link([1e6, 1e6], [1.0, 1.1], 2)
    with pytest.raises(ValueError, match="do not grow"):
        fit_link([1e6, 2e6], [1.0, 0.5], 2)
    with pytest.raises(ValueError, match="2 ranks"):
        fit_link([1e6, 2e6], [1.0, 2.0], 1)


@pytest.mark.parametrize("true_slowdown", [0.5, 1.0, 3.0, 40.0])
def test_the_slowdown_fit_recovers_the_factor_a_measured_exposed_sync_came_from(true_slowdown):
    buckets = ddp_buckets([MIB] * 60)
    ring = _ring(4, 2, net_gb_s=1.0)
    measured = RingCost(
        num_ranks=4, num_nodes=2, intra=ring.intra, network=ring.network, slowdown=true_slowdown
    )
    exposed = exposed_sync_s(buckets, measured, compute_s=0.05, backward_share=0.6)
    k = fit_slowdown(buckets, ring, compute_s=0.05, backward_share=0.6, exposed_s=exposed)
    assert k == pytest.approx(true_slowdown, rel=1e-6)
    assert measured.allreduce_s(MIB) == pytest.approx(true_slowdown * ring.allreduce_s(MIB))


def test_a_slowdown_from_nothing_exposed_is_one_where_the_model_agrees_and_below_one_where_it_exposes_more():
    buckets = ddp_buckets([MIB] * 60)
    fast = _ring(2, 1, intra_gb_s=1000.0)  # all but the last bucket's ~25 µs hidden behind a 1 s backward
    assert fit_slowdown(buckets, fast, compute_s=1.5, backward_share=2 / 3, exposed_s=0.0) == 1.0
    slow = _ring(2, 1, intra_gb_s=1.0)  # the last bucket's 9 MiB at 1 GB/s: ~9 ms exposed
    k = fit_slowdown(buckets, slow, compute_s=0.5, backward_share=2 / 3, exposed_s=0.0)
    assert k < 0.05
    faster = RingCost(num_ranks=2, num_nodes=1, intra=slow.intra, network=None, slowdown=k)
    assert exposed_sync_s(buckets, faster, compute_s=0.5, backward_share=2 / 3) == pytest.approx(
        1e-4, rel=1e-6
    )
    with pytest.raises(ValueError, match="two or more ranks"):
        fit_slowdown(buckets, _ring(1, 1), compute_s=0.5, backward_share=2 / 3, exposed_s=0.01)
    with pytest.raises(ValueError, match=">= 0"):
        fit_slowdown(buckets, slow, compute_s=0.5, backward_share=2 / 3, exposed_s=-1.0)
    with pytest.raises(ValueError, match="slowdown"):
        RingCost(num_ranks=2, num_nodes=1, intra=slow.intra, network=None, slowdown=0.0)
