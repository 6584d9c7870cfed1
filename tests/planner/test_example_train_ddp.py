"""examples/train_ddp.py under torchrun: three gloo ranks on 127.0.0.1 train with the batches of a plan."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from planner.runtime.weights import loss_weights

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_ddp.py"

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(300)]


def write_plan(path: Path, batches: tuple[int, ...], accumulate: int = 1) -> Path:
    """A minimal valid plan.json: one node, one rank per device, fields per DESIGN.md."""
    weights = loss_weights(batches)
    ranks = [
        {
            "rank": r, "node": "node-a", "node_rank": 0, "local_rank": r, "device_index": r, "gpu": "T4",
            "profile": "p0", "batch": b, "max_batch": 64, "loss_weight": weights[r],
            "predicted_memory_bytes": 1_000_000, "memory_budget_bytes": 2_000_000,
            "total_memory_bytes": 4_000_000, "predicted_step_time_s": 0.1,
        }
        for r, b in enumerate(batches)
    ]
    nproc = len(batches)
    plan = {
        "schema": "batchplan/plan@1", "created": "2025-01-01T00:00:00+00:00", "job": {"model": "mlp"},
        "world_size": nproc, "global_batch": sum(batches) * accumulate, "accumulate": accumulate,
        "step_batch": sum(batches), "predicted_step_time_s": 0.1, "throughput_samples_per_s": 160.0,
        "balance_efficiency": 1.0, "mode": "balanced", "ranks": ranks,
        "nodes": [{
            "name": "node-a", "node_rank": 0, "cuda_visible_devices": ",".join(map(str, range(nproc))),
            "nproc_per_node": nproc, "torchrun": f"torchrun --nnodes 1 --node-rank 0 --nproc-per-node {nproc}",
        }],
        "excluded": [],
        "profiles": {"p0": {
            "gpu": "T4", "method": "estimate", "amp": "off",
            "memory_points": [[1, 1_000_000], [8, 1_700_000]],
            "memory_fit": {"kind": "affine", "intercept_bytes": 900_000.0, "bytes_per_sample": 100_000.0},
            "time_points": [[1, 0.02], [8, 0.09]],
            "time_fit": {"kind": "affine", "intercept_s": 0.01, "s_per_sample": 0.01},
        }},
        "warnings": [],
    }
    path.write_text(json.dumps(plan, indent=2))
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK"}}
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", **extra)
    return env


def test_example_trains_three_ranks_with_the_planned_batches_and_weights(tmp_path):
    plan = write_plan(tmp_path / "plan.json", (5, 3, 8), accumulate=2)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-addr", "127.0.0.1",
        "--master-port", str(free_port()), "--log-dir", str(tmp_path / "logs"), "--redirects", "3",
        str(EXAMPLE), "--plan", str(plan), "--steps", "3",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, env=child_env(), cwd=tmp_path)
    # each rank's stdout in its own file (torchrun --redirects): lines of three processes sharing one pipe
    # can interleave
    stdout = "".join(p.read_text() for p in sorted((tmp_path / "logs").rglob("stdout.log")))
    assert result.returncode == 0, result.stdout + result.stderr + stdout

    headers = {
        int(m["rank"]): (int(m["batch"]), float(m["weight"]), m["device"])
        for m in re.finditer(r"^rank (?P<rank>\d+)/3 .*device (?P<device>\S+): batch (?P<batch>\d+) "
                             r"weight (?P<weight>[\d.]+) step_batch 16 global_batch 32 accumulate 2$",
                             stdout, re.MULTILINE)
    }
    assert headers == {0: (5, 0.9375, "cpu"), 1: (3, 0.5625, "cpu"), 2: (8, 1.5, "cpu")}

    steps = re.findall(r"^rank (\d) step (\d)/3: batch (\d+) loss ([\d.]+) global_loss ([\d.]+)$",
                       stdout, re.MULTILINE)
    assert sorted((int(r), int(s), int(b)) for r, s, b, _, _ in steps) == [
        (r, s, b) for r, b in enumerate((5, 3, 8)) for s in (1, 2, 3)
    ]
    # the all-reduced mean loss of a step is one number, the same on every rank
    for step in ("1", "2", "3"):
        assert len({g for _, s, _, _, g in steps if s == step}) == 1
    for rank, batch in enumerate((5, 3, 8)):
        assert f"rank {rank} done: 3 steps, {3 * batch * 2} samples" in stdout


def test_example_with_a_launch_that_does_not_match_the_plan_fails_fast_with_the_fix(tmp_path):
    plan = write_plan(tmp_path / "plan.json", (5, 3, 8))
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--plan", str(plan)], capture_output=True, text=True, timeout=120,
        env=child_env(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0"),
    )
    assert result.returncode == 2
    assert "error: " in result.stderr
    assert "is for 3 ranks but WORLD_SIZE=2" in result.stderr
    assert "Traceback" not in result.stderr


def test_example_runs_a_one_rank_plan_without_torchrun(tmp_path):
    plan = write_plan(tmp_path / "plan.json", (16,))
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--plan", str(plan), "--steps", "2"], capture_output=True, text=True,
        timeout=120, env=child_env(),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rank 0/1 " in result.stdout
    assert "batch 16 weight 1.000000" in result.stdout
    assert "rank 0 done: 2 steps, 32 samples" in result.stdout
