"""End-to-end ``plan`` over Ray on simulated clusters of 2/4/8 nodes (plus the demo config): wall time split
into Ray start, probing, profiling and allocation. Goal (issue #5): 4 nodes < 60 s on a 2-core machine.

    python bench/bench_e2e.py [--model resnet50] [--nodes 2 4 8]

Each run starts its own local Ray cluster on 127.0.0.1 (one raylet per node up to the raylet cap) and
profiles without the cache, so every figure includes the fake passes. Writes bench/results/e2e.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import yaml

from planner.cluster import load_cluster
from planner.driver import DriverOptions, plan_with_ray
from planner.job import JobSpec

REPO = Path(__file__).resolve().parents[1]
GPU_CYCLE = ("A100-SXM4-80GB", "V100-SXM2-16GB", "T4", "A10")


def simulated_config(num_nodes: int, directory: Path) -> Path:
    nodes = [
        {"name": f"node-{i}", "gpus": [{"type": GPU_CYCLE[i % len(GPU_CYCLE)], "count": 2}]} for i in range(num_nodes)
    ]
    path = directory / f"sim-{num_nodes}.yaml"
    path.write_text(yaml.safe_dump({"name": f"sim-{num_nodes}", "nodes": nodes}))
    return path


def run_one(label: str, config: Path, job: JobSpec) -> dict:
    cluster = load_cluster(config)
    start = time.monotonic()
    outcome = plan_with_ray(job, cluster=cluster, options=DriverOptions(cache=None))
    total = time.monotonic() - start
    t = outcome.timings_s
    return {
        "config": label,
        "nodes": len(cluster.nodes),
        "ranks": outcome.plan["world_size"],
        "gpu_types": len(outcome.plan["profiles"]),
        "ray_start_s": round(t.get("ray_start_s", 0.0), 2),
        "probe_s": round(t.get("probe_s", 0.0), 2),
        "profile_s": round(t.get("profile_s", 0.0), 2),
        "allocate_s": round(t.get("allocate_s", 0.0), 3),
        "total_s": round(total, 2),
        "throughput_samples_per_s": round(outcome.plan["throughput_samples_per_s"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--global-batch", type=int, default=512)
    args = parser.parse_args()
    job = JobSpec(model=args.model, global_batch=args.global_batch)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        configs = [("demo-mixed", REPO / "cluster_configs" / "demo-mixed.yaml")]
        configs += [(f"sim-{n}", simulated_config(n, Path(tmp))) for n in args.nodes]
        for label, path in configs:
            row = run_one(label, path, job)
            rows.append(row)
            print(
                f"config={row['config']} nodes={row['nodes']} ranks={row['ranks']} gpu_types={row['gpu_types']} "
                f"ray_start_s={row['ray_start_s']} probe_s={row['probe_s']} profile_s={row['profile_s']} "
                f"allocate_s={row['allocate_s']} total_s={row['total_s']}",
                flush=True,
            )
    out = REPO / "bench" / "results" / "e2e.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": args.model, "global_batch": args.global_batch, "runs": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
