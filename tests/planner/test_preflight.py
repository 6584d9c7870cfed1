"""planner.preflight.run_checks over hand-made inventories and plans: every check passing and failing."""

from __future__ import annotations

import dataclasses

import pytest

from planner.allocate.advice import Advice, AdviceKind
from planner.cluster import NodeSpec, SimulatedGpu
from planner.codec import encode
from planner.job import JobSpec
from planner.plan.io import validate_plan
from planner.plan.types import ExcludedDevice, ExclusionKind, Plan
from planner.preflight import Check, Thresholds, run_checks
from planner.probing.inventory import HostInfo, NodeInventory, simulated_inventory
from tests import plans
from torchkit.hardware.catalog import load_catalog
from torchkit.hardware.gpu_select import GpuSelection
from torchkit.hardware.nvml import GpuStats

GIB = 2**30
CATALOG = load_catalog()
DRIVER = {
    "nvml_version": "12.550.54.15",
    "driver_version": "550.54.15",
    "cuda_driver_version": "12.4",
    "torch_version": "2.4.0",
}


def real_node(
    name: str,
    *,
    gpus: int = 2,
    driver: dict | None = None,
    selection: GpuSelection | None = None,
    utilization: tuple[float, ...] | None = None,
) -> NodeInventory:
    """A real (not simulated) node of A100s as a probe would report it."""
    utilization = utilization or (0.0,) * gpus
    devices = tuple(
        GpuStats(
            index=i,
            name="NVIDIA A100-SXM4-80GB",
            uuid=f"GPU-{name}-{i}",
            memory_total_bytes=80 * GIB,
            memory_used_bytes=0,
            memory_free_bytes=80 * GIB,
            utilization_fraction=utilization[i],
        )
        for i in range(gpus)
    )
    return NodeInventory(
        name=name,
        simulated=False,
        devices=devices,
        gpu_types=("A100-SXM4-80GB",) * gpus,
        selection=selection or GpuSelection(selected=tuple(range(gpus)), skipped=()),
        host=HostInfo(hostname=name, cpu="AMD EPYC 7742", cpu_count=256, memory_total_bytes=1024 * GIB),
        driver=dict(DRIVER if driver is None else driver),
    )


def sim_node(
    name: str, *gpus: SimulatedGpu, select: str = "all", max_utilization: float = 1.0
) -> NodeInventory:
    return simulated_inventory(
        NodeSpec(name=name, gpus=gpus), select=select, max_utilization_fraction=max_utilization
    )


def gpu(index: int, type_name: str = "T4", used_gib: float = 0.0, utilization: float = 0.0) -> SimulatedGpu:
    return SimulatedGpu(
        index=index,
        spec=CATALOG.get(type_name),
        used_memory_bytes=int(used_gib * GIB),
        utilization_fraction=utilization,
    )


def make_plan(
    *,
    idle=(0.0, 0.02, 0.05, 0.1),
    job_global_batch=None,
    accumulate=1,
    excluded=(),
    alternatives=None,
    advice=(),
    throughput=1000.0,
) -> Plan:
    """A plan with the fields preflight reads: equal batches of 64 on node-a, these idle shares and advice."""
    n = len(idle)
    plan = validate_plan(
        plans.make_plan(
            batches=(64,) * n, nodes=(("node-a", n),), accumulate=accumulate, gpus=["A100-SXM4-80GB"] * n
        )
    )
    return plan.replace(
        job=JobSpec(model="m", global_batch=job_global_batch),
        throughput_samples_per_s=throughput,
        ranks=tuple(dataclasses.replace(r, idle_fraction=f) for r, f in zip(plan.ranks, idle, strict=True)),
        alternatives={"uniform": 900.0, "max": 950.0, "balanced": throughput}
        if alternatives is None
        else alternatives,
        excluded=tuple(excluded),
        warnings=("note", *advice),
        advice=tuple(advice),
    )


def checks_of(
    *,
    inventories=None,
    failed_nodes=None,
    expected=("node-a", "node-b"),
    plan="default",
    plan_error=None,
    **thresholds,
) -> dict[str, Check]:
    inventories = [real_node("node-a"), real_node("node-b")] if inventories is None else inventories
    result = run_checks(
        inventories=inventories,
        failed_nodes=failed_nodes or {},
        expected_node_names=list(expected),
        plan=make_plan() if plan == "default" else plan,
        plan_error=plan_error,
        thresholds=Thresholds(**thresholds),
    )
    by_name = {c.name: c for c in result}
    assert len(by_name) == len(result), "check names are unique"
    return by_name


# ---------------------------------------------------------------------------------------------- all good


def test_a_healthy_cluster_and_plan_pass_every_check_in_order():
    result = run_checks(
        inventories=[real_node("node-a"), real_node("node-b")],
        failed_nodes={},
        expected_node_names=["node-a", "node-b"],
        plan=make_plan(),
        plan_error=None,
        thresholds=Thresholds(),
    )
    assert [c.name for c in result] == [
        "cluster_reachable",
        "nodes_present",
        "gpus_present",
        "idle_thresholds",
        "versions_consistent",
        "plan_feasible",
        "min_batch_fits",
        "imbalance",
        "slow_gpus_worth_it",
    ]
    assert all(c.ok for c in result), [c for c in result if not c.ok]
    by_name = {c.name: c.detail for c in result}
    assert by_name["cluster_reachable"] == "2 node(s) answered"
    assert by_name["nodes_present"] == "2 of 2 node(s) probed"
    assert by_name["gpus_present"] == "4 of 4 GPU(s) selected, 4 planned as ranks"
    assert by_name["idle_thresholds"] == "every requested GPU meets the idle thresholds"
    assert by_name["plan_feasible"] == "4 ranks, global batch 256 (accumulate 1)"
    assert by_name["min_batch_fits"] == "every rank fits the minimum batch"


def test_check_to_json_shape():
    assert encode(Check(name="x", ok=False, detail="why")) == {"name": "x", "ok": False, "detail": "why"}
    assert encode(Check(name="x", ok=False, detail="why", fix="do"))["fix"] == "do"


def test_every_failed_check_carries_its_fix_and_passing_ones_none():
    plan = make_plan(
        idle=(0.0, 0.3), job_global_batch=1000, throughput=100.0, alternatives={"best_single_group": 200.0}
    )
    checks = checks_of(failed_nodes={"node-b": "gone"}, plan=plan, expect_gpus=9)
    failed = [c for c in checks.values() if not c.ok]
    assert {c.name for c in failed} >= {
        "nodes_present",
        "gpus_present",
        "global_batch_reachable",
        "imbalance",
        "slow_gpus_worth_it",
    }
    assert all(c.fix for c in failed), [c.name for c in failed if not c.fix]
    assert not any(c.fix for c in checks.values() if c.ok)
    assert "raise max_imbalance" in checks["imbalance"].fix


# ---------------------------------------------------------------------------------------------- nodes_present


def test_a_failed_node_fails_nodes_present_with_its_reason():
    checks = checks_of(
        inventories=[real_node("node-a")], failed_nodes={"node-b": "probe did not answer within 120 s"}
    )
    check = checks["nodes_present"]
    assert not check.ok
    assert check.detail == "1 of 2 node(s) probed; missing: node-b (probe did not answer within 120 s)"


def test_an_expected_node_that_did_not_answer_fails_nodes_present():
    checks = checks_of(inventories=[real_node("node-a")], expected=("node-a", "node-b"))
    assert not checks["nodes_present"].ok
    assert "missing: node-b (did not answer)" in checks["nodes_present"].detail


def test_a_failed_node_outside_the_expected_list_still_fails():
    checks = checks_of(
        inventories=[real_node("node-a"), real_node("node-b")],
        expected=(),
        failed_nodes={"node-b": "probe process died (RayActorError)"},
    )
    assert not checks["nodes_present"].ok
    assert "node-b (probe process died (RayActorError))" in checks["nodes_present"].detail


def test_expect_nodes_more_than_answered_fails_and_equal_passes():
    assert not checks_of(expected=(), expect_nodes=3)["nodes_present"].ok
    assert checks_of(expected=(), expect_nodes=3)["nodes_present"].detail == "2 of 3 node(s) probed"
    assert checks_of(expected=(), expect_nodes=2)["nodes_present"].ok


def test_a_real_cluster_without_expected_names_passes_with_any_number_of_nodes():
    check = checks_of(inventories=[real_node("gpu-host")], expected=())["nodes_present"]
    assert check.ok
    assert check.detail == "1 of 1 node(s) probed"


# ---------------------------------------------------------------------------------------------- gpus_present


def test_expect_gpus_above_the_selected_gpus_fails():
    check = checks_of(expect_gpus=6)["gpus_present"]
    assert not check.ok
    assert check.detail == "4 of 4 GPU(s) selected, 4 planned as ranks, 6 required"


def test_expect_gpus_met_passes():
    assert checks_of(expect_gpus=4)["gpus_present"].ok


def test_no_gpu_selected_anywhere_fails_gpus_present():
    empty = GpuSelection(
        selected=(), skipped=((0, "busy: 90% utilisation > 50%"), (1, "busy: 95% utilisation > 50%"))
    )
    checks = checks_of(
        inventories=[real_node("node-a", selection=empty)],
        expected=("node-a",),
        plan=None,
        plan_error="no usable GPU to plan on",
    )
    assert not checks["gpus_present"].ok
    assert checks["gpus_present"].detail == "0 of 2 GPU(s) selected, 0 planned as ranks"


def test_expect_gpus_counts_the_ranks_of_the_plan():
    plan = make_plan(
        idle=(0.0, 0.0, 0.0),  # 3 ranks; the 4th selected GPU could not be profiled
        excluded=[
            ExcludedDevice(
                node="node-b",
                device_index=1,
                gpu="A100-SXM4-80GB",
                reason="its GPU type could not be profiled (see warnings)",
                kind=ExclusionKind.NOT_PROFILED,
            )
        ],
    )
    checks = checks_of(plan=plan, expect_gpus=4)
    assert not all(c.ok for c in checks.values())


# ---------------------------------------------------------------------------------------------- idle_thresholds


def test_a_busy_gpu_skipped_by_the_thresholds_fails_idle_thresholds():
    node = sim_node("node-t4", gpu(0), gpu(1, utilization=0.97, used_gib=10), max_utilization=0.5)
    assert node.selection.selected == (0,)
    check = checks_of(inventories=[node], expected=("node-t4",))["idle_thresholds"]
    assert not check.ok
    assert check.detail == "node-t4 GPU 1: busy: 97% utilisation > 50%"
    assert check.fix.startswith("free those GPUs, pick others with gpus, or relax min_free_memory_fraction")


def test_gpus_left_out_because_not_requested_do_not_fail_idle_thresholds():
    selection = GpuSelection(selected=(0,), skipped=((1, "not requested"),))
    check = checks_of(inventories=[real_node("node-a", selection=selection)], expected=("node-a",))[
        "idle_thresholds"
    ]
    assert check.ok


def test_idle_gpus_pass_idle_thresholds():
    node = sim_node("node-t4", gpu(0), gpu(1), max_utilization=0.5)
    assert checks_of(inventories=[node], expected=("node-t4",))["idle_thresholds"].ok


def test_idle_gpus_not_picked_by_minus_one_do_not_fail_idle_thresholds():
    node = sim_node("lab", gpu(0), gpu(1), gpu(2, used_gib=4), gpu(3, used_gib=8), select="-1,-1")
    assert node.selection.selected == (0, 1)
    assert checks_of(inventories=[node], expected=("lab",))["idle_thresholds"].ok


# ---------------------------------------------------------------------------------------------- versions


def test_differing_driver_versions_on_real_nodes_fail_naming_each_node():
    other = {**DRIVER, "driver_version": "535.104.05"}
    check = checks_of(inventories=[real_node("node-a"), real_node("node-b", driver=other)])[
        "versions_consistent"
    ]
    assert not check.ok
    assert check.detail == "driver_version: node-a=550.54.15, node-b=535.104.05"


def test_several_differing_versions_are_all_listed():
    other = {**DRIVER, "driver_version": "535.104.05", "torch_version": "2.3.1"}
    check = checks_of(inventories=[real_node("node-a"), real_node("node-b", driver=other)])[
        "versions_consistent"
    ]
    assert not check.ok
    assert check.detail.split("; ") == [
        "driver_version: node-a=550.54.15, node-b=535.104.05",
        "torch_version: node-a=2.4.0, node-b=2.3.1",
    ]


def test_equal_versions_on_real_nodes_pass_and_say_which():
    check = checks_of()["versions_consistent"]
    assert check.ok
    assert (
        check.detail
        == "driver_version 550.54.15, cuda_driver_version 12.4, torch_version 2.4.0 on all 2 nodes"
    )


def test_simulated_nodes_have_no_versions_to_compare():
    nodes = [sim_node("s1", gpu(0)), sim_node("s2", gpu(0, "L4"))]
    check = checks_of(inventories=nodes, expected=("s1", "s2"))["versions_consistent"]
    assert check.ok
    assert check.detail == "simulated nodes: no driver versions to compare"


def test_a_real_node_without_a_driver_is_not_compared():
    checks = checks_of(inventories=[real_node("node-a"), real_node("node-b", driver={})])
    assert checks["versions_consistent"].ok


# ---------------------------------------------------------------------------------------------- plan checks


def test_no_plan_fails_plan_feasible_with_the_error_and_stops():
    result = run_checks(
        inventories=[real_node("node-a")],
        failed_nodes={},
        expected_node_names=["node-a"],
        plan=None,
        plan_error="global batch 7 cannot be split in mode 'uniform'",
        thresholds=Thresholds(),
    )
    assert (result[-1].name, result[-1].ok, result[-1].detail) == (
        "plan_feasible",
        False,
        "global batch 7 cannot be split in mode 'uniform'",
    )
    assert result[-1].fix.startswith("a smaller global_batch or min_batch")
    assert "imbalance" not in {c.name for c in result}


def test_no_plan_without_an_error_message_still_fails():
    check = checks_of(plan=None)["plan_feasible"]
    assert (check.ok, check.detail) == (False, "no plan")


def test_a_device_below_the_minimum_batch_fails_min_batch_fits():
    excluded = [
        ExcludedDevice(
            node="node-b",
            device_index=3,
            gpu="T4",
            reason="fits at most 3 samples < minimum batch 8",
            kind=ExclusionKind.BELOW_MIN_BATCH,
        ),
        ExcludedDevice(
            node="node-b",
            device_index=1,
            gpu="T4",
            reason="busy: 97% utilisation > 50%",
            kind=ExclusionKind.SKIPPED_BY_SELECTION,
        ),
    ]
    check = checks_of(plan=make_plan(excluded=excluded))["min_batch_fits"]
    assert not check.ok
    assert check.detail == "node-b GPU 3 (T4): fits at most 3 samples < minimum batch 8"


def test_exclusions_for_other_reasons_do_not_fail_min_batch_fits():
    excluded = [
        ExcludedDevice(
            node="node-c",
            device_index=None,
            gpu=None,
            reason="probe failed: timed out",
            kind=ExclusionKind.PROBE_FAILED,
        )
    ]
    assert checks_of(plan=make_plan(excluded=excluded))["min_batch_fits"].ok


def test_global_batch_reachable_is_checked_only_when_one_was_asked_for():
    assert "global_batch_reachable" not in checks_of(plan=make_plan(job_global_batch=None))
    check = checks_of(plan=make_plan(job_global_batch=512, accumulate=2))["global_batch_reachable"]
    assert check.ok
    assert check.detail == "512 = 256 × 2"


def test_a_global_batch_other_than_the_one_asked_for_fails():
    check = checks_of(plan=make_plan(job_global_batch=500, accumulate=2))["global_batch_reachable"]
    assert not check.ok
    assert check.detail == "512 = 256 × 2"


def test_imbalance_above_the_limit_fails_naming_the_idlest_rank():
    check = checks_of(plan=make_plan(idle=(0.0, 0.2, 0.05)))["imbalance"]
    assert not check.ok
    # the core names the threshold by its field; the CLI passes its flags (tests/planner/cli/test_cli_preflight.py)
    assert check.detail == "largest idle share 20.0% (rank 1, A100-SXM4-80GB); limit 15% (max_imbalance)"


def test_imbalance_within_the_limit_passes_and_the_limit_is_adjustable():
    assert checks_of(plan=make_plan(idle=(0.0, 0.15)))["imbalance"].ok
    assert not checks_of(plan=make_plan(idle=(0.0, 0.15)), max_imbalance=0.1)["imbalance"].ok
    assert checks_of(plan=make_plan(idle=(0.0, 0.2)), max_imbalance=0.25)["imbalance"].ok


def test_a_perfectly_balanced_plan_names_no_rank():
    check = checks_of(plan=make_plan(idle=(0.0, 0.0)))["imbalance"]
    assert check.ok
    assert check.detail == "largest idle share 0.0%; limit 15% (max_imbalance)"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_imbalance", 1.5),
        ("max_imbalance", -0.1),
        ("expect_nodes", 0),
        ("expect_gpus", True),
        ("min_subset_gain", 0.9),
    ],
)
def test_thresholds_are_checked_in_their_type_naming_the_field(field, value):
    from planner.errors import FieldError

    with pytest.raises(FieldError) as info:
        Thresholds(**{field: value})
    assert info.value.field == field
    assert str(info.value).startswith(f"{field} {value} is invalid")


def test_dropping_slow_gpus_being_much_faster_fails_with_the_advice():
    advice = Advice(
        AdviceKind.DROP_GROUPS,
        "dropping the 2 T4 ranks (ranks 2-3) would be 1.30× faster (1,300 vs 1,000 samples/s)",
    )
    plan = make_plan(
        alternatives={"balanced": 1000.0, "best_group_subset": 1300.0, "best_single_group": 1200.0},
        advice=[Advice(AdviceKind.MODE, "mode 'max' would be 1.10× faster"), advice],
    )
    check = checks_of(plan=plan)["slow_gpus_worth_it"]
    assert not check.ok
    assert check.detail == advice


def test_a_single_group_alone_being_much_faster_fails_even_without_advice_text():
    plan = make_plan(
        alternatives={"balanced": 1000.0, "best_group_subset": 1050.0, "best_single_group": 1250.0}
    )
    check = checks_of(plan=plan)["slow_gpus_worth_it"]
    assert not check.ok
    assert check.detail == "best_single_group would be 1.25× faster"


def test_a_small_subset_gain_passes_and_the_threshold_is_adjustable():
    plan = make_plan(
        alternatives={"balanced": 1000.0, "best_group_subset": 1050.0, "best_single_group": 900.0}
    )
    check = checks_of(plan=plan)["slow_gpus_worth_it"]
    assert check.ok
    assert check.detail == "every GPU type adds throughput"
    assert not checks_of(plan=plan, min_subset_gain=1.04)["slow_gpus_worth_it"].ok


def test_one_gpu_type_has_nothing_to_drop():
    check = checks_of(plan=make_plan(alternatives={"uniform": 1000.0, "balanced": 1000.0}))[
        "slow_gpus_worth_it"
    ]
    assert check.ok
    assert check.detail == "one GPU type: nothing to drop"
