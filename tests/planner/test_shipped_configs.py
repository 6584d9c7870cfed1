"""Every shipped cluster config loads and plans (in-process, no Ray) into a valid plan: every GPU is a rank or
excluded with a reason, loss weights sum to the world size, and every rank's predicted memory fits its budget.

Profiles are made once per GPU type, so even the 64-node config (416 GPUs) plans in about a second here;
the time of each config is printed (``pytest -s``), never asserted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from planner.cluster import ClusterSpec, load_cluster, shipped_cluster_configs
from planner.codec import encode
from planner.driver import PlanOutcome, plan_without_ray
from planner.job import JobSpec
from planner.plan.io import validate_plan

pytestmark = pytest.mark.slow  # the first config pays for importing torch and estimating the model (seconds)

CONFIGS = shipped_cluster_configs()
JOB = JobSpec(model="tests.planner.tiny_models:convnet", input_shape=(3, 32, 32), global_batch=None)


@dataclass(frozen=True)
class Planned:
    cluster: ClusterSpec
    outcome: PlanOutcome
    seconds: float

    @property
    def plan(self) -> dict:
        assert self.outcome.plan is not None, self.outcome.error
        return encode(self.outcome.plan)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def planned(request) -> Planned:
    cluster = load_cluster(CONFIGS[request.param])
    start = time.perf_counter()
    outcome = plan_without_ray(JOB, cluster)
    seconds = time.perf_counter() - start
    print(
        f"\n{request.param}: {len(cluster.nodes)} nodes, {cluster.num_gpus} GPUs planned in {seconds:.2f} s"
    )
    return Planned(cluster=cluster, outcome=outcome, seconds=seconds)


def test_the_shipped_configs_are_the_examples_without_the_catalog():
    assert "gpus" not in CONFIGS
    assert {"demo-mixed", "mixed-64", "shared-node", "homogeneous-a100", "consumer-lab"} <= set(CONFIGS)


def test_the_plan_validates(planned):
    validate_plan(planned.plan, where=planned.cluster.name)
    assert planned.outcome.failed_nodes == {}
    assert planned.plan["job"] == encode(JOB)


def test_every_gpu_is_a_rank_or_excluded_with_a_reason(planned):
    ranks = {(r["node"], r["device_index"]) for r in planned.plan["ranks"]}
    excluded = {(e["node"], e["device_index"]): e["reason"] for e in planned.plan["excluded"]}
    assert len(ranks) == len(planned.plan["ranks"]), "a device holds two ranks"
    assert not ranks & set(excluded), "a device is both a rank and excluded"
    assert all(reason.strip() for reason in excluded.values())
    for inventory in planned.outcome.inventories:
        for index in inventory.selection.selected:
            assert (inventory.name, index) in ranks or (inventory.name, index) in excluded, (
                inventory.name,
                index,
            )
    every_gpu = {(node.name, g.index) for node in planned.cluster.nodes for g in node.gpus}
    assert ranks | set(excluded) == every_gpu


def test_nodes_and_ranks_agree_with_the_cluster(planned):
    plan = planned.plan
    order = [n.name for n in planned.cluster.nodes]
    # ranks are numbered node by node in config order, local ranks counting up
    assert [r["rank"] for r in plan["ranks"]] == list(range(plan["world_size"]))
    assert [order.index(r["node"]) for r in plan["ranks"]] == sorted(
        order.index(r["node"]) for r in plan["ranks"]
    )
    for node in plan["nodes"]:
        local = [r for r in plan["ranks"] if r["node"] == node["name"]]
        assert [r["local_rank"] for r in local] == list(range(node["nproc_per_node"]))
        assert node["cuda_visible_devices"] == ",".join(str(r["device_index"]) for r in local)


def test_loss_weights_sum_to_the_world_size(planned):
    plan = planned.plan
    assert sum(r["loss_weight"] for r in plan["ranks"]) == pytest.approx(plan["world_size"])
    assert plan["step_batch"] == sum(r["batch"] for r in plan["ranks"])


def test_every_rank_fits_its_memory_budget(planned):
    for r in planned.plan["ranks"]:
        assert 1 <= r["batch"] <= r["max_batch"]
        assert r["predicted_memory_bytes"] <= r["memory_budget_bytes"] <= r["total_memory_bytes"], r


def test_each_gpu_type_is_profiled_once(planned):
    selected_types = {
        inventory.gpu_type(index)
        for inventory in planned.outcome.inventories
        for index in inventory.selection.selected
    }
    assert planned.outcome.profile_calls == len(selected_types)
    assert {p["gpu"] for p in planned.plan["profiles"].values()} == selected_types
    assert {r["profile"] for r in planned.plan["ranks"]} <= set(planned.plan["profiles"])
