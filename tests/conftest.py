"""Shared fixtures: environment restored after each test; one local Ray cluster per test run."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

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


@pytest.fixture(scope="session")
def ray_cluster():
    """One real local Ray cluster for the whole test run: TEST_RAYLETS raylets, all on 127.0.0.1, dashboard off.

    Ray rewrites 127.0.0.1 to the machine's own address unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 is set
    before it starts and every node is given node_ip_address=127.0.0.1 (DESIGN.md, Testing).
    """
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray
    from ray.cluster_utils import Cluster

    common = {"node_ip_address": "127.0.0.1", "num_cpus": 1, "object_store_memory": 80 * 2**20}
    cluster = Cluster(initialize_head=True, head_node_args={**common, "include_dashboard": False})
    for _ in range(TEST_RAYLETS - 1):
        cluster.add_node(wait=False, **common)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, _node_ip_address="127.0.0.1", log_to_driver=False, logging_level="ERROR")
    os.makedirs(FAULT_DIR, exist_ok=True)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(FAULT_DIR, ignore_errors=True)
