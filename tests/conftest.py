"""Shared fixtures: environment restored after each test; one local Ray cluster per test run (per process that
asks for it), which the in-process CLI runs of tests/cli_in_process.py disconnect from and it reconnects to."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from tests import cli_in_process

# Ray reads this once, at its first import: every raylet a test starts must stay on 127.0.0.1 (DESIGN.md)
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
# where fault-injection tests mark the Ray nodes whose probe should hang (tests/planner/tiny_models.py); set
# before the test cluster starts so that its raylets, and the probes they start, inherit it
FAULT_DIR = os.path.join(tempfile.gettempdir(), f"batchplan-test-faults-{os.getpid()}")
os.environ["BATCHPLAN_TEST_FAULT_DIR"] = FAULT_DIR


@pytest.fixture(autouse=True)
def _restore_environment():
    """Tests may set CUDA_VISIBLE_DEVICES, RANK, ...; put the environment back afterwards."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


#: raylets of the shared test cluster: enough for the 3-node simulated configs to get one each
TEST_RAYLETS = 3


class _TestRay:
    """The suite's local Ray cluster and this process's driver connection to it (which the in-process CLI
    runs of ``tests/cli_in_process.py`` drop: ``batchplan`` must not find a connected Ray)."""

    def __init__(self) -> None:
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        from ray.cluster_utils import Cluster

        # Ray puts its session (with unix sockets, at most 107 bytes a path) under RAY_TMPDIR or TMPDIR: a user's
        # long one would break it, and the test must not write there. A short one of its own, for its raylets only.
        self.temp_dir = tempfile.mkdtemp(prefix="bpr", dir="/tmp")
        common = {"node_ip_address": "127.0.0.1", "num_cpus": 1, "object_store_memory": 80 * 2**20}
        saved = {name: os.environ.pop(name, None) for name in ("RAY_TMPDIR", "RAY_ADDRESS")}
        os.environ["RAY_TMPDIR"] = self.temp_dir
        try:
            self.cluster = Cluster(initialize_head=True, head_node_args={**common, "include_dashboard": False})
            for _ in range(TEST_RAYLETS - 1):
                self.cluster.add_node(wait=False, **common)
            self.cluster.wait_for_nodes()
        finally:
            os.environ.pop("RAY_TMPDIR")
            os.environ.update({k: v for k, v in saved.items() if v is not None})

    def connect(self) -> None:
        import ray

        if not ray.is_initialized():
            ray.init(address=self.cluster.address, _node_ip_address="127.0.0.1", log_to_driver=False,
                     logging_level="ERROR")

    def disconnect(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()

    def stop(self) -> None:
        self.disconnect()
        self.cluster.shutdown()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def _test_ray() -> Iterator[_TestRay]:
    os.makedirs(FAULT_DIR, exist_ok=True)
    ray = _TestRay()
    cli_in_process.ray_disconnect_hooks.append(ray.disconnect)
    try:
        yield ray
    finally:
        cli_in_process.ray_disconnect_hooks.remove(ray.disconnect)
        ray.stop()
        shutil.rmtree(FAULT_DIR, ignore_errors=True)


@pytest.fixture
def ray_cluster(_test_ray: _TestRay):
    """The one real local Ray cluster of the test run, this process connected to it as a driver:
    TEST_RAYLETS raylets, all on 127.0.0.1, dashboard off (``ray.cluster_utils.Cluster``).

    Ray rewrites 127.0.0.1 to the machine's own address unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 is set
    before it starts and every node is given node_ip_address=127.0.0.1 (DESIGN.md, Testing). Started once per
    process that asks for it.
    """
    _test_ray.connect()
    return _test_ray.cluster
