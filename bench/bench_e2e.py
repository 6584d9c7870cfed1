"""End-to-end ``plan`` over Ray on simulated clusters of 2/4/8 nodes (plus the demo config): wall time split
into Ray start, probing, profiling and allocation. Goal (issue #5): 4 nodes < 60 s on a 2-core machine.

    python bench/bench_e2e.py [--model resnet50] [--nodes 2 4 8] [--warm-cold-only]

Each run starts its own local Ray cluster on 127.0.0.1 (up to the raylet cap) and profiles without the
cache, so every figure includes the fake passes. Writes bench/results/e2e.json.

First, warm and cold side by side (issue #15): the README's command on demo-mixed as a user runs it, the
``batchplan`` console script in a fresh process (interpreter, imports, Ray start and stop included), four
runs in a row: cold with Ray (empty profile cache), warm with Ray (the same cache), cold and warm with
``--no-ray``. Printed as ``name=value``; targets: warm ≤ 8 s with Ray, ≤ 3 s with ``--no-ray``, cold ≤ 25 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from planner.cluster import load_cluster
from planner.codec import encode
from planner.driver import DriverOptions, plan_with_ray
from planner.job import JobSpec

REPO = Path(__file__).resolve().parents[1]
GPU_CYCLE = ("A100-SXM4-80GB", "V100-SXM2-16GB", "T4", "A10")


def simulated_config(num_nodes: int, directory: Path) -> Path:
    nodes = [
        {"name": f"node-{i}", "gpus": [{"type": GPU_CYCLE[i % len(GPU_CYCLE)], "count": 2}]}
        for i in range(num_nodes)
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
    plan = encode(outcome.plan)
    return {
        "config": label,
        "nodes": len(cluster.nodes),
        "ranks": plan["world_size"],
        "gpu_types": len(plan["profiles"]),
        "ray_start_s": round(t.get("ray_start_s", 0.0), 2),
        "probe_s": round(t.get("probe_s", 0.0), 2),
        "profile_s": round(t.get("profile_s", 0.0), 2),
        "allocate_s": round(t.get("allocate_s", 0.0), 3),
        "total_s": round(total, 2),
        "throughput_samples_per_s": round(plan["throughput_samples_per_s"], 1),
    }


#: issue #15's targets for the demo-mixed plan (seconds of wall time, console script to exit)
TARGETS_S = {"warm_ray": 8.0, "warm_no_ray": 3.0, "cold_ray": 25.0, "cold_no_ray": 25.0}


def _timed_cli(argv: list[str], env: dict[str, str]) -> float:
    script = shutil.which("batchplan", path=str(Path(sys.executable).parent)) or "batchplan"
    start = time.monotonic()
    subprocess.run(
        [script, *argv], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO
    )
    return time.monotonic() - start


def warm_and_cold(model: str, global_batch: int) -> dict[str, float]:
    """The demo-mixed plan cold then warm, with Ray and without, each in a fresh ``batchplan`` process."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    )
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = [
            "plan",
            "--cluster",
            "cluster_configs/demo-mixed.yaml",
            "--model",
            model,
            "--global-batch",
            str(global_batch),
            "--no-write",
        ]
        for no_ray in (False, True):
            cache = ["--cache-dir", str(Path(tmp) / ("no-ray" if no_ray else "ray"))]
            flags = ["--no-ray"] if no_ray else []
            for state in ("cold", "warm"):
                name = f"{state}_{'no_ray' if no_ray else 'ray'}"
                figures[name] = round(_timed_cli([*base, *flags, *cache], env), 2)
                target = TARGETS_S[name]
                print(
                    f"demo_mixed_{name}_s={figures[name]} target_s={target} "
                    f"met={'yes' if figures[name] <= target else 'no'}",
                    flush=True,
                )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--global-batch", type=int, default=512)
    parser.add_argument("--warm-cold-only", action="store_true", help="only the warm/cold demo-mixed figures")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(f"load_average_1min={load:.1f} cpus={os.cpu_count()}", flush=True)
    warm_cold = warm_and_cold(args.model, 768)
    if args.warm_cold_only:
        return
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
    out.write_text(
        json.dumps(
            {
                "model": args.model,
                "global_batch": args.global_batch,
                "runs": rows,
                "demo_mixed_warm_cold_s": warm_cold,
                "load_average_1min": load,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
