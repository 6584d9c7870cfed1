"""The driver's profiling methods on real nodes (``planner.profiling.method``): ``auto`` is decided in the
node's probe. The probes run in this process (``LocalBackend``) for nodes reported as real: this machine's
torch has no CUDA, so each is a real node without CUDA."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from planner.cluster import load_cluster
from planner.driver import DriverOptions, run_plan
from planner.errors import FieldError
from planner.job import JobSpec
from planner.probing.backends import LocalBackend
from planner.profiles.cache import ProfileCache
from planner.profiling.method import cuda_usable

pytestmark = pytest.mark.skipif(cuda_usable(0), reason="CUDA is usable here: the nodes could measure")

JOB = {"model": "tests.planner.tiny_models:convnet", "input_shape": (3, 32, 32), "amp": "fp16"}


class RealNodesBackend(LocalBackend):
    """A cluster config's nodes reported as real (``simulated=False``), probed in this process."""

    def inventories(self, select, min_free_memory_fraction, max_utilization_fraction):
        found, failed = super().inventories(select, min_free_memory_fraction, max_utilization_fraction)
        return [replace(inventory, simulated=False) for inventory in found], failed


@pytest.fixture
def cluster(tmp_path):
    path = tmp_path / "two-real.yaml"
    path.write_text(yaml.safe_dump({"nodes": [{"name": "node-a", "gpus": [{"type": "T4", "count": 2}]},
                                              {"name": "node-b", "gpus": [{"type": "A10", "count": 1}]}]}))
    return load_cluster(path)


def test_auto_on_a_real_node_without_cuda_estimates_with_a_note(cluster, tmp_path):
    cache = ProfileCache(tmp_path / "profiles")
    outcome = run_plan(JobSpec(**JOB), RealNodesBackend(cluster), cluster.catalog, options=DriverOptions(cache=cache))
    plan = outcome.plan
    assert plan.world_size == 3 and outcome.profile_calls == 2
    for rank in plan.ranks:
        profile = plan.profiles[rank.profile]
        assert profile.method == "estimate"
        assert any(n.startswith(f"{rank.gpu}: no free GPU of this type to measure on (CUDA cannot use device")
                   for n in profile.notes)
        assert cache.path_for(rank.profile).is_file()  # filed under the estimate's key


def test_measure_on_a_real_node_without_cuda_is_an_error_naming_the_setting(cluster):
    with pytest.raises(FieldError, match=r"^method measure needs a CUDA GPU of type T4 \(device 0\)") as info:
        run_plan(JobSpec(**JOB, method="measure"), RealNodesBackend(cluster), cluster.catalog,
                 options=DriverOptions())
    assert info.value.field == "method"


def test_estimate_on_real_nodes_is_the_plan_of_the_same_nodes_simulated(cluster):
    job = JobSpec(**JOB, method="estimate")
    real = run_plan(job, RealNodesBackend(cluster), cluster.catalog, options=DriverOptions()).plan
    simulated = run_plan(job, LocalBackend(cluster), cluster.catalog, options=DriverOptions()).plan
    assert [r.batch for r in real.ranks] == [r.batch for r in simulated.ranks]
    assert set(real.profiles) == set(simulated.profiles)
