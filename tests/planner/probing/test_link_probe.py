"""The link probe: NodeProbe actors on two raylets of a real local Ray cluster (127.0.0.1) time an all-reduce
among themselves over gloo, the times fit a link, and the link is cached per cluster."""

from __future__ import annotations

import pytest

from planner.errors import FieldError
from planner.probing import link_probe
from planner.store import CacheStore
from tests.other_user import reachable_place
from torchkit.estimate.ddp_sync import LinkCost
from torchkit.units import MIB


@pytest.mark.ray
@pytest.mark.slow  # two Ray workers import torch and form a gloo group: ~20 s on 2 cores
def test_node_probes_time_an_allreduce_among_themselves_and_the_times_fit_a_link(ray_cluster):
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from planner.probing.probe import NodeProbe
    from torchkit.hardware.catalog import load_catalog

    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]][:2]
    probes = [
        ray.remote(NodeProbe)
        .options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
        .remote(None, load_catalog())
        for node in nodes
    ]
    port = ray.get(probes[0].free_port.remote())
    sizes = [MIB, 4 * MIB, 8 * MIB]
    times = ray.get(
        [p.allreduce_probe.remote(rank, 2, "127.0.0.1", port, sizes, 3) for rank, p in enumerate(probes)],
        timeout=180,
    )
    for p in probes:
        ray.kill(p)
    assert len(times) == 2 and all(len(t) == 3 and all(x > 0 for x in t) for t in times)
    link = link_probe.network_link(sizes, times[0], 2, "gloo")
    assert link.bus_bytes_per_s > 1e6  # loopback moves more than a MB/s, however loaded the machine
    assert link.source.startswith("measured by the probes (gloo all-reduce among 2 nodes")


def test_a_measured_network_is_cached_per_set_of_nodes(tmp_path):
    store = CacheStore(tmp_path)
    link = LinkCost(
        name="network", bus_bytes_per_s=1.2e9, step_latency_s=2e-5, source="measured by the probes (x)"
    )
    assert link_probe.cached_network(store, ["a", "b"]) is None
    link_probe.store_network(store, ["b", "a"], link)
    cached = link_probe.cached_network(store, ["a", "b"])
    assert cached is not None and cached.bus_bytes_per_s == 1.2e9 and cached.step_latency_s == 2e-5
    assert cached.source.endswith("(cached)")
    assert link_probe.cached_network(store, ["a", "b", "c"]) is None
    assert link_probe.cached_network(None, ["a", "b"]) is None
    [entry] = (tmp_path / "links").glob("*.json")
    entry.write_text(entry.read_text().replace("1200000000.0", "-1.0"))  # a negative bandwidth, checksum kept
    assert link_probe.cached_network(store, ["a", "b"]) is None and "checksum mismatch" in store.problems[-1]
    (tmp_path / "links").chmod(0o500)
    try:
        link_probe.store_network(store, ["x", "y"], link)  # unwritable: no error, just no cache
    finally:
        (tmp_path / "links").chmod(0o700)


def test_a_link_entry_others_could_write_is_measured_again_and_their_directory_refused(caplog):
    link = LinkCost(
        name="network", bus_bytes_per_s=1.2e9, step_latency_s=2e-5, source="measured by the probes (x)"
    )
    with reachable_place() as cache:  # where other users can reach it (pytest's tmp_path is private)
        store = CacheStore(cache)
        link_probe.store_network(store, ["a", "b"], link)
        entry = next((cache / "links").glob("*.json"))
        entry.chmod(0o666)  # issue #34: anyone could have put a faster network there
        assert link_probe.cached_network(store, ["a", "b"]) is None
        assert f"{entry} is writable by every user" in caplog.text and "measuring it again" in caplog.text
        assert (
            len(store.problems) == 1
            and "not trusted; ignoring it and measuring it again" in store.problems[0]
        )
        link_probe.store_network(store, ["a", "b"], link)  # the measurement replaces it, private again
        assert (
            entry.stat().st_mode & 0o777 == 0o644 and link_probe.cached_network(store, ["a", "b"]) is not None
        )
        (cache / "links").chmod(0o777)
        with pytest.raises(FieldError, match=r"/links (above it )?is writable by every user"):
            link_probe.cached_network(CacheStore(cache), ["a", "b"])
