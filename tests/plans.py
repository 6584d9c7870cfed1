"""A minimal valid plan.json for tests of the in-job runtime (no planning needed)."""

from __future__ import annotations

from planner.plan.launch import NodeLaunch
from planner.runtime.weights import loss_weights


def _step_time_s(batch: int) -> float:
    """The step time the plan's one profile (``p0``: 0.01 s + 0.01 s per sample) gives ``batch``."""
    return 0.01 + 0.01 * batch


def make_plan(batches=(5, 3, 8), nodes=(("node-a", 3),), accumulate=1, gpus=None) -> dict:
    """A minimal plan that ``planner.plan.io.validate_plan`` accepts: ranks numbered node by node."""
    weights = loss_weights(batches)
    gpus = gpus or ["T4"] * len(batches)
    ranks, node_entries, rank = [], [], 0
    for node_rank, (name, nproc) in enumerate(nodes):
        for local_rank in range(nproc):
            ranks.append(
                {
                    "rank": rank,
                    "node": name,
                    "node_rank": node_rank,
                    "local_rank": local_rank,
                    "device_index": local_rank,
                    "gpu": gpus[rank],
                    "profile": "p0",
                    "batch": batches[rank],
                    "max_batch": 64,
                    "loss_weight": weights[rank],
                    "predicted_memory_bytes": 1_000_000,
                    "memory_budget_bytes": 2_000_000,
                    "total_memory_bytes": 4_000_000,
                    "predicted_step_time_s": _step_time_s(batches[rank]),
                }
            )
            rank += 1
        launch = NodeLaunch(
            nnodes=len(nodes),
            node_rank=node_rank,
            nproc_per_node=nproc,
            master_addr=nodes[0][0],
            master_port=29500,
            cuda_visible_devices=",".join(map(str, range(nproc))),
            script="train.py",
            plan_path="plan.json",
        )
        node_entries.append(
            {
                "name": name,
                "node_rank": node_rank,
                "cuda_visible_devices": launch.cuda_visible_devices,
                "nproc_per_node": nproc,
                "torchrun": launch.torchrun_line(),
                "env": launch.env(),
            }
        )
    step_batch = sum(batches)
    step_time_s = max(_step_time_s(b) for b in batches)
    return {
        "schema": "batchplan/plan@1",
        "created": "2025-01-01T00:00:00+00:00",
        "job": {"model": "mlp"},
        "world_size": len(batches),
        "global_batch": step_batch * accumulate,
        "accumulate": accumulate,
        "step_batch": step_batch,
        "predicted_step_time_s": step_time_s,
        "throughput_samples_per_s": step_batch / step_time_s,
        "balance_efficiency": 1.0,
        "mode": "balanced",
        "ranks": ranks,
        "nodes": node_entries,
        "launch": {
            "master_addr": nodes[0][0],
            "master_port": 29500,
            "script": "train.py",
            "plan_path": "plan.json",
        },
        "excluded": [],
        "profiles": {
            "p0": {
                "gpu": "T4",
                "method": "estimate",
                "amp": "off",
                "memory_points": [[1, 1_000_000], [8, 1_700_000]],
                "memory_fit": {"kind": "affine", "intercept_bytes": 900_000.0, "bytes_per_sample": 100_000.0},
                "time_points": [[1, 0.02], [8, 0.09]],
                "time_fit": {"kind": "affine", "intercept_s": 0.01, "s_per_sample": 0.01},
            }
        },
        "warnings": [],
    }
