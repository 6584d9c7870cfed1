"""``batchplan show`` on a plan saved by ``batchplan plan`` (table, --json, --emit env, a damaged copy), and the
other read-only commands' JSON as a user gets it from a subprocess (``catalog --json``, ``devices --json``).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.planner.cli_helpers import (
    DEMO_MIXED,
    TINY_MODEL,
    assert_ok,
    assert_user_error,
    check_plan,
    parse_json_stdout,
    run_cli,
)
from torchkit.hardware.catalog import load_catalog


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A plan saved by ``batchplan plan ... -o plans/demo.json`` (and that run, whose stdout is the table)."""
    where = tmp_path_factory.mktemp("saved_plan")
    result = run_cli(
        "plan",
        "--no-ray",
        "--cluster",
        DEMO_MIXED,
        "--no-cache",
        *TINY_MODEL,
        "--global-batch",
        "480",
        "--multiple-of",
        "8",
        "--script",
        "train_ddp.py",
        "-o",
        "plans/demo.json",
        cwd=where,
    )
    assert_ok(result)
    return where / "plans" / "demo.json", result


slow = pytest.mark.slow  # the module's fixture plans once, in the first test that asks for it


@slow
def test_show_prints_the_same_table_plan_printed(saved) -> None:
    path, planned = saved
    result = run_cli("show", path, cwd=path.parent)
    assert_ok(result)
    assert result.stdout == planned.stdout
    assert result.stderr == ""
    assert "global batch 480 = 480 per step × accumulate 1" in result.stdout
    assert "train_ddp.py --plan plans/demo.json" in result.stdout  # the path -o named


def test_show_json_is_the_saved_plan(saved) -> None:
    path, _ = saved
    result = run_cli("show", "--json", "demo.json", cwd=path.parent)  # a relative path
    assert_ok(result)
    plan = check_plan(parse_json_stdout(result))
    assert plan == json.loads(path.read_text())
    assert plan["global_batch"] == 480 and plan["job"]["multiple_of"] == 8
    assert all(r["batch"] % 8 == 0 for r in plan["ranks"])
    assert plan["launch"]["script"] == "train_ddp.py"


def test_show_emit_env_gives_each_node_its_launch_environment(saved) -> None:
    path, _ = saved
    plan = json.loads(path.read_text())
    for node in plan["nodes"]:
        result = run_cli("show", path, "--emit", "env", "--node", node["name"], cwd=path.parent)
        assert_ok(result)
        lines = result.stdout.splitlines()
        assert lines[0].startswith(
            f"# batchplan: environment of node {node['name']} (node rank {node['node_rank']}"
        )
        assert lines[1:] == [
            "export CUDA_DEVICE_ORDER=PCI_BUS_ID",
            "export CUDA_VISIBLE_DEVICES=0,1",
            "export NNODES=3",
            f"export NODE_RANK={node['node_rank']}",
            "export NPROC_PER_NODE=2",
            "export MASTER_ADDR=node-a100",
            "export MASTER_PORT=29500",
        ]


def _damage(plan: dict, how: str) -> tuple[dict, str]:
    """A copy of ``plan`` damaged ``how``, and a word the error must name."""
    plan = json.loads(json.dumps(plan))
    if how == "world-size":
        plan["world_size"] += 1
        return plan, "world_size"
    if how == "rank-field":
        del plan["ranks"][2]["batch"]
        return plan, "ranks[2]"
    if how == "batch-type":
        plan["ranks"][0]["batch"] = "186"
        return plan, "ranks[0].batch"
    if how == "profile-key":
        plan["ranks"][1]["profile"] = "no-such-profile"
        return plan, "no-such-profile"
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["world-size", "rank-field", "batch-type", "profile-key"])
def test_show_rejects_a_damaged_plan_naming_the_field(saved, tmp_path: Path, how: str) -> None:
    path, _ = saved
    damaged, word = _damage(json.loads(path.read_text()), how)
    target = tmp_path / "damaged.json"
    target.write_text(json.dumps(damaged))
    assert_user_error(run_cli("show", target, cwd=tmp_path), 2, str(target), word)


# ---------------------------------------------------------------------------------------------------------
# the other read-only commands, as JSON from a subprocess


def test_catalog_json_lists_every_canonical_type(tmp_path: Path) -> None:
    result = run_cli("catalog", "--json", cwd=tmp_path)
    assert_ok(result)
    doc = parse_json_stdout(result)
    assert set(doc) == {"schema", "gpus"} and doc["schema"] == "batchplan/catalog@1"
    names = [gpu["name"] for gpu in doc["gpus"]]
    assert names == list(load_catalog().names())
    canonical = {
        "T4",
        "V100-SXM2-16GB",
        "V100-SXM2-32GB",
        "A10",
        "A10G",
        "A100-SXM4-40GB",
        "A100-SXM4-80GB",
        "L4",
        "L40S",
        "H100-SXM5-80GB",
        "H100-PCIe-80GB",
        "H200-SXM-141GB",
        "RTX-2080Ti",
        "RTX-3090",
        "RTX-4090",
        "RTX-A6000",
    }
    assert canonical <= set(names)
    for gpu in doc["gpus"]:
        assert isinstance(gpu["memory_bytes"], int) and gpu["memory_bytes"] > 0
        assert gpu["fp16_tflops"] > 0 and gpu["fp32_tflops"] > 0 and gpu["memory_bandwidth_bytes_per_s"] > 0
        assert gpu["supports_bf16"] == (gpu["bf16_tflops"] is not None)
        assert gpu["source"]


def _has_nvml() -> bool:
    from torchkit.hardware.nvml import NvmlUnavailableError, read_local_inventory

    try:
        read_local_inventory()
    except NvmlUnavailableError:
        return False
    return True


@pytest.mark.skipif("_has_nvml()", reason="this machine has an NVIDIA driver")
def test_devices_json_without_a_driver_lists_the_host_and_warns_once(tmp_path: Path) -> None:
    result = run_cli("devices", "--json", cwd=tmp_path)
    assert_ok(result)
    doc = parse_json_stdout(result)
    assert doc["schema"] == "batchplan/devices@1"
    [node] = doc["nodes"]
    assert node["devices"] == [] and node["selected"] == [] and node["simulated"] is False
    assert node["host"]["cpu_count"] >= 1 and node["host"]["memory_total_bytes"] > 0
    warnings = result.stderr.strip().splitlines()
    assert len(warnings) == 1 and warnings[0].startswith("warning: ") and "NVML" in warnings[0]
    assert node["warnings"] and node["warnings"][0] in warnings[0]
