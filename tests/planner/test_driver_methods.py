"""The driver's profiling methods on real nodes (``planner.obtain.method``): ``auto`` is decided in the
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
from planner.obtain.method import cuda_usable
from planner.probing.backends import LocalBackend
from planner.profiles.cache import ProfileCache
from tests.planner.cli_helpers import SHARED_NODE

without_cuda = pytest.mark.skipif(cuda_usable(0), reason="CUDA is usable here: the nodes could measure")

JOB = {"model": "tests.planner.tiny_models:convnet", "input_shape": (3, 32, 32), "amp": "fp16"}


class RealNodesBackend(LocalBackend):
    """A cluster config's nodes reported as real (``simulated=False``), probed in this process."""

    def inventories(self, select, min_free_memory_fraction, max_utilization_fraction):
        found, failed = super().inventories(select, min_free_memory_fraction, max_utilization_fraction)
        return [replace(inventory, simulated=False) for inventory in found], failed


@pytest.fixture
def cluster(tmp_path):
    path = tmp_path / "two-real.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "nodes": [
                    {"name": "node-a", "gpus": [{"type": "T4", "count": 2}]},
                    {"name": "node-b", "gpus": [{"type": "A10", "count": 1}]},
                ]
            }
        )
    )
    return load_cluster(path)


@without_cuda
def test_auto_on_a_real_node_without_cuda_estimates_with_a_note(cluster, tmp_path):
    cache = ProfileCache(tmp_path / "profiles")
    outcome = run_plan(
        JobSpec(**JOB), RealNodesBackend(cluster), cluster.catalog, options=DriverOptions(cache=cache)
    )
    plan = outcome.plan
    assert plan.world_size == 3 and outcome.profile_calls == 2
    for rank in plan.ranks:
        profile = plan.profiles[rank.profile]
        assert profile.method == "estimate"
        assert any(
            n.startswith(f"{rank.gpu}: no free GPU of this type to measure on (CUDA cannot use device")
            for n in profile.notes
        )
        assert cache.path_for(rank.profile).is_file()  # filed under the estimate's key


@without_cuda
def test_measure_on_a_real_node_without_cuda_is_an_error_naming_the_setting(cluster):
    with pytest.raises(FieldError, match=r"^method measure needs a CUDA GPU of type T4 \(device 0\)") as info:
        run_plan(
            JobSpec(**JOB, method="measure"),
            RealNodesBackend(cluster),
            cluster.catalog,
            options=DriverOptions(),
        )
    assert info.value.field == "method"


def test_estimate_on_real_nodes_is_the_plan_of_the_same_nodes_simulated(cluster):
    job = JobSpec(**JOB, method="estimate")
    real = run_plan(job, RealNodesBackend(cluster), cluster.catalog, options=DriverOptions()).plan
    simulated = run_plan(job, LocalBackend(cluster), cluster.catalog, options=DriverOptions()).plan
    assert [r.batch for r in real.ranks] == [r.batch for r in simulated.ranks]
    assert set(real.profiles) == set(simulated.profiles)


def test_the_driver_names_settings_by_field_and_the_cli_by_flag():
    """Flag names live in the CLI (planner.cli.options.flag_of): the driver's warnings name the settings by
    ``DriverOptions.name_of``, fields by default."""
    from planner.cli.options import flag_of
    from planner.driver import plan_without_ray

    cluster = load_cluster(SHARED_NODE)  # by its path in the repository, whatever the working directory
    job = JobSpec(**JOB, method="estimate", min_free_memory_fraction=0.0, max_utilization_fraction=1.0)

    def warnings(**options) -> list[str]:
        plan = plan_without_ray(job, cluster, options=DriverOptions(workers_per_rank=16, **options)).plan
        return [w for w in plan.warnings if w.startswith(("shared GPUs:", "lab-server: 4 ranks"))]

    by_field, by_flag = warnings(), warnings(name_of=flag_of)
    assert len(by_field) == len(by_flag) == 2
    assert by_field[0].endswith("cores; lower workers_per_rank") and by_flag[0].endswith(
        "cores; lower --workers"
    )
    assert by_field[1].endswith("; min_free_memory_fraction, max_utilization_fraction)")
    assert by_flag[1].endswith("; --min-memory-fraction, --max-utilization)")
    assert not any("--" in w for w in by_field)


class TorchWithoutCudaBackend(RealNodesBackend):
    """Real nodes whose probes read a torch built without CUDA (``planner.probing.inventory.torch_cuda_build``)."""

    def inventories(self, select, min_free_memory_fraction, max_utilization_fraction):
        found, failed = super().inventories(select, min_free_memory_fraction, max_utilization_fraction)
        driver = {"torch_version": "2.13.0+cpu", "torch_cuda_version": None}
        return [replace(inventory, driver=driver) for inventory in found], failed


def test_auto_on_a_node_whose_torch_has_no_cuda_is_cached_as_the_estimate_it_is(cluster, tmp_path):
    cache = ProfileCache(tmp_path / "profiles")
    options = DriverOptions(cache=cache)
    first = run_plan(JobSpec(**JOB), TorchWithoutCudaBackend(cluster), cluster.catalog, options=options)
    second = run_plan(JobSpec(**JOB), TorchWithoutCudaBackend(cluster), cluster.catalog, options=options)
    assert (first.profile_calls, second.profile_calls) == (2, 0)  # the second run finds both estimates
    for node in ("node-a", "node-b"):
        [line] = [
            w for w in second.plan.warnings if w.startswith(f"{node}: torch 2.13.0+cpu there is a build")
        ]
        assert "its GPUs are estimated, not measured" in line
    assert [r.batch for r in second.plan.ranks] == [r.batch for r in first.plan.ranks]
    estimate = run_plan(
        JobSpec(**JOB, method="estimate"), TorchWithoutCudaBackend(cluster), cluster.catalog, options=options
    )
    assert estimate.profile_calls == 0 and set(estimate.plan.profiles) == set(second.plan.profiles)


@without_cuda
def test_auto_where_torch_has_cuda_but_cannot_use_it_still_estimates_each_run(cluster, tmp_path):
    """The limitation left (planner.obtain.lookup): a node whose probe cannot tell in advance."""
    cache = ProfileCache(tmp_path / "profiles")
    options = DriverOptions(cache=cache)
    calls = [
        run_plan(JobSpec(**JOB), RealNodesBackend(cluster), cluster.catalog, options=options).profile_calls
        for _ in range(2)
    ]
    assert calls == [2, 2]
