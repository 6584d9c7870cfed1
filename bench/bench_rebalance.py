"""In-job re-balancing: steps to balance, idle before/after, and the throughput gained, at simulated speeds.

Usage: ``python bench/bench_rebalance.py [--steps 24] [--speeds 1,2,4] [--sample-ms 3] [--cases ...]``.

For each starting plan, three gloo ranks on 127.0.0.1 run ``examples/train_ddp.py --rebalance`` under
torchrun with the declared simulation ``--simulate-speed 1,2,4`` (rank i computes k_i × sample-ms per
sample, ``planner.runtime.simulate``). The plans are built by the planner itself (``planner.plan.build_plan``)
from profiles whose speed ratios are wrong by a known factor:

- ``correct``: the plan knows the simulated speeds (nothing to correct: 0 switches expected);
- ``wrong2x`` / ``wrong4x``: every speed ratio to rank 0 divided by 2 / 4;
- ``uniform``: the plan thinks all ranks equally fast (what plain DDP does).

Prints ``name=value`` lines per case: ``switches``, ``steps_to_balance``, ``max_idle_before`` /
``max_idle_after`` (idle = 1 − own compute / slowest compute, medians of the measured steps),
``throughput_before`` / ``throughput_after`` (samples/s of the step's slowest compute, the rate a step can
go at) and ``throughput_gain``; writes bench/results/rebalance.json. The times come from the re-balancer's
own measurements, written to the plan's ``measured`` section. Sleeps of tens of ms per step keep the noise
of a loaded machine small; the figures are still timings and vary with load.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from planner.job import JobSpec
from planner.plan.build import build_plan
from planner.plan.io import write_plan
from planner.plan.types import RankSlot
from planner.profiles.profile import DeviceProfile

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_ddp.py"
GPUS = ("T4", "V100-SXM2-16GB", "A10")  # labels only: the speeds are simulated
STEP_BATCH = 56
MULTIPLE_OF = 4
CAP = 64
#: per sample and fixed memory of the synthetic profile, chosen so that the budget gives every rank cap 64
BYTES_PER_SAMPLE = 100_000
FIXED_BYTES = 900_000
CASES = {"correct": 1.0, "wrong2x": 2.0, "wrong4x": 4.0, "uniform": None}


def plan_for(speeds: list[float], wrong_by: float | None, sample_s: float) -> dict:
    """A plan of 3 ranks whose time model is off by ``wrong_by`` (None: all ranks equal), via build_plan."""
    if wrong_by is None:
        planned = [sample_s] * len(speeds)
    else:
        planned = [sample_s * (k if i == 0 else k / wrong_by) for i, k in enumerate(speeds)]
    job = JobSpec(model="mlp", global_batch=STEP_BATCH, multiple_of=MULTIPLE_OF, min_batch=MULTIPLE_OF, amp="off")
    profiles, slots = {}, []
    for rank, slope in enumerate(planned):
        key = f"sim{rank}"
        profiles[key] = DeviceProfile.from_points(
            gpu=GPUS[rank], method="estimate", amp="off",
            memory_points=[(8, FIXED_BYTES + 8 * BYTES_PER_SAMPLE), (64, FIXED_BYTES + 64 * BYTES_PER_SAMPLE)],
            time_points=[(8, 8 * slope), (64, 64 * slope)])
        slots.append(RankSlot(node="bench", device_index=rank, gpu=GPUS[rank], profile=key,
                              memory_budget_bytes=FIXED_BYTES + CAP * BYTES_PER_SAMPLE, total_memory_bytes=10**9))
    return build_plan(job, slots, profiles).to_json()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_case(name: str, wrong_by: float | None, args: argparse.Namespace, work: Path) -> dict:
    speeds = [float(k) for k in args.speeds.split(",")]
    plan_path = work / f"{name}.json"
    write_plan(plan_for(speeds, wrong_by, args.sample_ms / 1e3), plan_path)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(len(speeds)),
               "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), str(EXAMPLE),
               "--plan", str(plan_path), "--steps", str(args.steps), "--dataset-size", str(10 * STEP_BATCH),
               "--rebalance", "--simulate-speed", args.speeds, "--simulate-sample-ms", str(args.sample_ms),
               "--cache-dir", str(work / "cache")]
    start = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    if result.returncode != 0:
        # the failing rank's own message lies above torchrun's summary: show both
        clues = [x for x in result.stderr.splitlines() if any(w in x for w in ("error", "Error", "terminate", "what()"))]
        sys.exit(f"{name}: the example failed ({result.returncode}):\n" + "\n".join(clues[:20])
                 + f"\n...\n{result.stderr[-2000:]}")
    line = next(x for x in result.stdout.splitlines() if x.startswith("rebalance: switches="))
    measured = json.loads(plan_path.read_text())["measured"]
    before, after = measured["step_time_first_s"], measured["step_time_last_s"]
    return {
        "case": name, "line": line, "wall_s": time.monotonic() - start,
        "switches": len(measured["switches"]), "steps_to_balance": measured["steps_to_balance"],
        "batches_before": measured["batches_first"], "batches_after": measured["batches_last"],
        "max_idle_before": measured["max_idle_first"], "max_idle_after": measured["max_idle_last"],
        "throughput_before": STEP_BATCH / before, "throughput_after": STEP_BATCH / after,
        "throughput_gain": before / after,
        "samples_once": line.endswith("samples_once=true"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--speeds", default="1,2,4")
    parser.add_argument("--sample-ms", type=float, default=3.0)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "rebalance.json"))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-rebalance-") as tmp:
        for name in args.cases.split(","):
            row = run_case(name, CASES[name], args, Path(tmp))
            rows.append(row)
            print(f"case={name} switches={row['switches']} steps_to_balance={row['steps_to_balance']} "
                  f"batches_before={row['batches_before']} batches_after={row['batches_after']} "
                  f"max_idle_before={row['max_idle_before']:.3f} max_idle_after={row['max_idle_after']:.3f} "
                  f"throughput_before={row['throughput_before']:.1f} throughput_after={row['throughput_after']:.1f} "
                  f"throughput_gain={row['throughput_gain']:.2f} samples_once={str(row['samples_once']).lower()}",
                  flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"bench": "rebalance", "speeds": args.speeds, "sample_ms": args.sample_ms,
                               "steps": args.steps, "results": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
