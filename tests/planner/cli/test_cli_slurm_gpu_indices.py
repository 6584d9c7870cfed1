"""Issue #34, item 2: ``plan --slurm`` numbers a node's GPUs 0..n-1 for any GRES layout, checked on the device
indices (a count of GPUs per node passed while ``gpu:t4:4`` was planned as cards 0, 2, 4, 6), against a real
slurmctld and two slurmd on 127.0.0.1 (``tests/planner/slurm_cluster.py``): a node of four T4s, and a node of two
T4s and two A10s (two GRES entries, printed by ``scontrol show job -d`` with their ``(IDX:..)``)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.planner.cli_helpers import REPO_ROOT, TINY_MODEL, cli_env
from tests.planner.slurm_cluster import SlurmCluster, SlurmNode

pytestmark = [pytest.mark.slow]

NODES = (SlurmNode("gpu-c", "t4", 4), SlurmNode("gpu-d", "t4", 2, more_gpus=(("a10", 2),)))

#: seconds for salloc and one plan: a plan of a tiny model takes 4-10 s on the loaded 2-core test machine, salloc
#: a second; generous so that load 10+ cannot fail it
SALLOC_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(NODES)
    try:
        yield cluster
    finally:
        cluster.stop()


def _plan_in_allocation(slurm: SlurmCluster, tmp_path: Path, *salloc_args: str) -> tuple[str, dict]:
    """``batchplan plan --slurm`` inside ``salloc SALLOC_ARGS``: its stdout and the plan it wrote."""
    plan_path = tmp_path / "plan.json"
    plan = shlex.join(
        [
            sys.executable,
            "-m",
            "planner.cli.main",
            "plan",
            "--slurm",
            *TINY_MODEL,
            "--cache-dir",
            str(tmp_path / "cache"),
            "-o",
            str(plan_path),
        ]
    )
    env = cli_env(slurm.env())
    env["PYTHONPATH"] = str(REPO_ROOT)
    result = subprocess.run(
        ["salloc", *salloc_args, "bash", "-c", plan],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=SALLOC_TIMEOUT_S,
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout, json.loads(plan_path.read_text())


def _ranks(plan: dict) -> list[tuple[str, int, str]]:
    return [(r["node"], r["device_index"], r["gpu"]) for r in plan["ranks"]]


def test_a_job_holding_four_gpus_on_each_node_plans_devices_0_to_3(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    stdout, plan = _plan_in_allocation(slurm, tmp_path, "-N", "2", "--gres=gpu:4")
    assert _ranks(plan) == [("gpu-c", i, "T4") for i in range(4)] + [
        ("gpu-d", 0, "T4"),
        ("gpu-d", 1, "T4"),
        ("gpu-d", 2, "A10"),
        ("gpu-d", 3, "A10"),
    ]
    assert [n["cuda_visible_devices"] for n in plan["nodes"]] == ["0,1,2,3", "0,1,2,3"]
    assert stdout.count("CUDA_VISIBLE_DEVICES=0,1,2,3 torchrun") == 2, stdout


def test_a_job_holding_gpu_t4_4_prints_cuda_visible_devices_0_1_2_3(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    stdout, plan = _plan_in_allocation(slurm, tmp_path, "-N", "1", "-w", "gpu-c", "--gres=gpu:t4:4")
    assert _ranks(plan) == [("gpu-c", i, "T4") for i in range(4)]
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3 torchrun" in stdout, stdout


def test_a_job_holding_part_of_a_mixed_node_numbers_its_own_cards(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    # the job holds one T4 and one A10 of gpu-d (node indices 0 and 2): it sees them as cards 0 and 1
    stdout, plan = _plan_in_allocation(slurm, tmp_path, "-N", "1", "-w", "gpu-d", "--gres=gpu:t4:1,gpu:a10:1")
    assert _ranks(plan) == [("gpu-d", 0, "T4"), ("gpu-d", 1, "A10")]
    assert "CUDA_VISIBLE_DEVICES=0,1 torchrun" in stdout, stdout
