"""``batchplan plan`` driven in subprocesses as a user would: the README's main command (through Ray, once),
then the output forms (--json, the table with ./plan.json, --emit env, --plot) and GPU selection, planned
in-process with ``--no-ray`` on the tiny test CNN so each run takes seconds.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.planner.cli_helpers import (
    DEMO_MIXED,
    REPO_ROOT,
    SHARED_NODE,
    TINY_MODEL,
    assert_ok,
    assert_user_error,
    check_plan,
    describe,
    is_png,
    parse_json_stdout,
    readme_batchplan_command,
    run_cli,
)

README_COMMAND = [
    "batchplan",
    "plan",
    "--cluster",
    "cluster_configs/demo-mixed.yaml",
    "--model",
    "resnet50",
    "--global-batch",
    "768",
]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One profile cache for the module: the second plan of the same GPU type reads it."""
    return tmp_path_factory.mktemp("profile_cache")


def _no_ray(config: Path, cache: Path) -> tuple[str, ...]:
    return ("plan", "--no-ray", "--cluster", str(config), "--cache-dir", str(cache), *TINY_MODEL)


# ---------------------------------------------------------------------------------------------------------
# the README's main command


def test_readme_shows_the_main_command() -> None:
    assert readme_batchplan_command() == README_COMMAND


@pytest.mark.slow
@pytest.mark.ray
def test_readme_main_command_plans_the_demo_cluster_through_ray(tmp_path: Path) -> None:
    """`batchplan plan --cluster cluster_configs/demo-mixed.yaml --model resnet50 --global-batch 768`, run by
    the console script in a fresh directory: a real local Ray cluster, one probe per simulated node."""
    argv = readme_batchplan_command()[1:]
    config_at = argv.index("--cluster") + 1
    argv[config_at] = str(REPO_ROOT / argv[config_at])  # the README runs from the repository root
    result = run_cli(
        *argv,
        cwd=tmp_path,
        env={"BATCHPLAN_CACHE_DIR": str(tmp_path / "cache")},
        console_script=True,
        timeout=600,
    )
    assert_ok(result)

    plan = check_plan(json.loads((tmp_path / "plan.json").read_text()))
    assert plan["probing"]["backend"] == "ray" and plan["probing"]["simulated"] is True
    assert plan["job"]["model"] == "resnet50" and plan["job"]["global_batch"] == 768
    assert plan["world_size"] == 6
    assert plan["global_batch"] == 768 == plan["step_batch"] * plan["accumulate"]
    # the demo figures: balanced beats plain DDP by >= 1.5x, balance efficiency >= 0.95
    assert plan["alternatives"]["balanced"] >= 1.5 * plan["alternatives"]["uniform"]
    assert plan["balance_efficiency"] >= 0.95
    assert [n["name"] for n in plan["nodes"]] == ["node-a100", "node-v100", "node-t4"]
    assert [r["gpu"] for r in plan["ranks"]] == ["A100-SXM4-80GB"] * 2 + ["V100-SXM2-16GB"] * 2 + ["T4"] * 2
    a100, v100, t4 = (plan["ranks"][i]["batch"] for i in (0, 2, 4))
    assert a100 > v100 > t4 >= 1, "balanced mode gives the faster GPUs more samples"
    assert len(list((tmp_path / "cache").glob("*.json"))) == 3, "one cached profile per GPU type"

    # stdout: the table, then the torchrun line of every node
    out = result.stdout
    assert "6 ranks on 3 node(s)" in out
    assert "global batch 768" in out
    torchrun = [line for line in out.splitlines() if "torchrun " in line]
    assert len(torchrun) == 3, describe(result)
    for node_rank, (line, node) in enumerate(zip(torchrun, plan["nodes"], strict=True)):
        assert line.strip().startswith(f"[{node['name']}]")
        assert f"--nnodes 3 --node-rank {node_rank} --nproc-per-node 2" in line
        assert "--master-addr node-a100 --master-port 29500" in line
        assert "CUDA_VISIBLE_DEVICES=0,1 " in line
    assert "wrote plan.json" in result.stderr


# ---------------------------------------------------------------------------------------------------------
# output forms (no Ray)


@pytest.mark.slow  # draws a plot
def test_json_plot_and_output_file_agree(tmp_path: Path, cache_dir: Path) -> None:
    out = tmp_path / "out" / "my-plan.json"
    picture = tmp_path / "pictures" / "plan.png"
    result = run_cli(
        *_no_ray(DEMO_MIXED, cache_dir),
        "--global-batch",
        "512",
        "--json",
        "-o",
        out,
        "--plot",
        picture,
        cwd=tmp_path,
    )
    assert_ok(result)
    plan = check_plan(parse_json_stdout(result))
    assert json.loads(out.read_text()) == plan, "the file holds exactly the plan printed"
    assert not (tmp_path / "plan.json").exists(), "-o replaces the default ./plan.json"
    assert is_png(picture)
    assert f"wrote {out}" in result.stderr and f"wrote {picture}" in result.stderr

    assert plan["schema"] == "batchplan/plan@1"
    assert plan["job"]["model"] == "tests.planner.tiny_models:convnet"
    assert plan["job"]["input_shape"] == [3, 32, 32] and plan["job"]["global_batch"] == 512
    assert plan["world_size"] == 6 and plan["global_batch"] == 512 and plan["mode"] == "balanced"
    assert [r["node_rank"] for r in plan["ranks"]] == [0, 0, 1, 1, 2, 2]
    assert [r["local_rank"] for r in plan["ranks"]] == [0, 1, 0, 1, 0, 1]
    assert {r["profile"] for r in plan["ranks"]} == set(plan["profiles"]) and len(plan["profiles"]) == 3
    assert plan["probing"]["backend"] == "local"
    for node in plan["nodes"]:
        assert node["nproc_per_node"] == 2 and node["cuda_visible_devices"] == "0,1"
        assert f"--node-rank {node['node_rank']} " in node["torchrun"]
    # the calibrated time model: the expected real balance as a range, every estimate's uncertainty, and a
    # warning for the GPU type without measured rows (T4: Turing is not in the calibration data)
    low, high = plan["balance_efficiency_range"]
    assert low < plan["balance_efficiency"] <= high <= 1
    assert all(p["time_log_sigma"] > 0 and p["time_model"] for p in plan["profiles"].values())
    assert any(w.startswith("T4: no measured training throughput") for w in plan["warnings"])
    assert not any(w.startswith("V100-SXM2-16GB: no measured") for w in plan["warnings"])


def test_table_on_stdout_and_plan_json_in_the_working_directory(tmp_path: Path, cache_dir: Path) -> None:
    result = run_cli(*_no_ray(DEMO_MIXED, cache_dir), "--mode", "uniform", "--multiple-of", "8", cwd=tmp_path)
    assert_ok(result)
    plan = check_plan(json.loads((tmp_path / "plan.json").read_text()))
    assert plan["mode"] == "uniform" and plan["job"]["global_batch"] is None
    batches = {r["batch"] for r in plan["ranks"]}
    assert len(batches) == 1 and batches.pop() % 8 == 0, "uniform: one batch, a multiple of 8, for every rank"
    assert plan["ranks"][0]["batch"] == min(r["max_batch"] for r in plan["ranks"])

    lines = result.stdout.splitlines()
    assert lines[0].startswith("plan for tests.planner.tiny_models:convnet (uniform,")
    assert lines[0].endswith("6 ranks on 3 node(s)")
    header = lines[1].split()
    assert header[:7] == ["rank", "node", "local", "gpu#", "type", "batch", "cap"]
    rows = [line.split() for line in lines[2:8]]
    assert [row[0] for row in rows] == ["0", "1", "2", "3", "4", "5"]
    assert [row[5] for row in rows] == [str(r["batch"]) for r in plan["ranks"]]
    assert f"global batch {plan['global_batch']} = {plan['step_batch']} per step" in result.stdout
    assert "launch (one line per node):" in lines
    assert sum("torchrun --nnodes 3" in line for line in lines) == 3
    assert "{" not in result.stdout, "no JSON on stdout without --json"
    assert "wrote plan.json" in result.stderr


def test_emit_env_prints_one_nodes_export_lines(tmp_path: Path, cache_dir: Path) -> None:
    for node_rank, name in enumerate(["node-a100", "node-v100", "node-t4"]):
        result = run_cli(
            *_no_ray(DEMO_MIXED, cache_dir),
            "--emit",
            "env",
            "--node",
            name,
            "--master-port",
            "29611",
            "--no-write",
            cwd=tmp_path,
        )
        assert_ok(result)
        assert not (tmp_path / "plan.json").exists(), "--no-write"
        header, *lines = result.stdout.splitlines()
        assert header.startswith(f"# batchplan: environment of node {name} (node rank {node_rank} of 3)")
        env = {}
        for line in lines:
            key, _, value = line.removeprefix("export ").partition("=")
            assert line.startswith("export ") and re.fullmatch(r"[A-Z_]+", key) and value, line
            env[key] = value
        assert env == {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": "0,1",
            "NNODES": "3",
            "NODE_RANK": str(node_rank),
            "NPROC_PER_NODE": "2",
            "MASTER_ADDR": "node-a100",
            "MASTER_PORT": "29611",
        }


def test_emit_env_without_a_node_on_a_multi_node_plan_names_the_flags(
    tmp_path: Path, cache_dir: Path
) -> None:
    result = run_cli(*_no_ray(DEMO_MIXED, cache_dir), "--emit", "env", "--no-write", cwd=tmp_path)
    assert_user_error(result, 2, "--node NAME", "--node-rank N", "node-a100", "node-t4")


def test_gpus_minus_one_twice_picks_the_two_idle_cards(tmp_path: Path, cache_dir: Path) -> None:
    """shared-node.yaml: 4 × RTX A6000, GPU 2 half full and GPU 3 busy; ``--gpus -1,-1`` (argv rewriting lets a
    value start with '-') plans on the two idle ones and says why the others were left out."""
    result = run_cli(
        *_no_ray(SHARED_NODE, cache_dir), "--gpus", "-1,-1", "--json", "--no-write", cwd=tmp_path
    )
    assert_ok(result)
    plan = check_plan(parse_json_stdout(result))
    assert plan["job"]["gpus"] == "-1,-1"
    assert [(r["node"], r["device_index"]) for r in plan["ranks"]] == [("lab-server", 0), ("lab-server", 1)]
    assert plan["nodes"][0]["cuda_visible_devices"] == "0,1"
    assert sorted(e["device_index"] for e in plan["excluded"]) == [2, 3]
    assert all(e["reason"] for e in plan["excluded"])
