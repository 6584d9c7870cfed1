"""Plans at the size limit: what one rank, ``show`` and the size check cost at 1,024 to 65,536 ranks.

Usage: ``python bench/bench_plan_sizes.py [--sizes 1024,8192,65536] [--repeat R]``.
Prints one line per size, ``ranks=N file_mb=M build_s=B write_s=W load_rank_plan_s=L load_rank_plan_whole_s=F
show_s=S show_env_s=E``, then ``oversized_refusal_s=X`` for a 200 MiB (sparse) file, and writes
bench/results/plan_sizes.json. Goals (issue #25, "Sizes"): at 65,536 ranks ``load_rank_plan`` < 1 s and
``batchplan show`` < 10 s; a file over the limit refused before it is read.

The plan is a real one (``planner.plan.build.build_plan``, written by ``write_plan``): 8 GPUs per node, nodes
cycling through an A100, a T4 and a V100 profile (estimated-looking affine curves; the figures do not change
the timing). ``load_rank_plan_s`` is the median over R ranks spread over the plan, each read in a fresh
call with torchrun's environment, as a rank of the job reads it (only its part: ``planner.plan.rank_view``);
``load_rank_plan_whole_s`` reads the same plan saved without its index (what an older file or a plan
re-indented by a tool costs). ``show_s``/``show_env_s`` run ``batchplan show`` (the table to /dev/null;
one node's ``--emit env``) as a user would, interpreter start included. Timings are wall-clock on whatever
load the machine has: they are figures, not assertions, and the load average is printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from planner.codec import encode  # noqa: E402
from planner.job import JobSpec  # noqa: E402
from planner.plan.build import build_plan  # noqa: E402
from planner.plan.io import write_plan  # noqa: E402
from planner.plan.types import RankSlot  # noqa: E402
from planner.profiles.profile import DeviceProfile  # noqa: E402
from planner.runtime.rank_plan import load_rank_plan  # noqa: E402

GIB = 2**30
MIB = 2**20
GPUS_PER_NODE = 8
# name: (GPU type, t0 s, t1 s/sample, total GiB); rough figures, see the module docstring
TYPES = {
    "a100": ("A100-SXM4-80GB", 0.010, 0.0005, 80),
    "t4": ("T4", 0.010, 0.002, 15),
    "v100": ("V100-SXM2-16GB", 0.010, 0.001, 16),
}


def profiles() -> dict[str, DeviceProfile]:
    batches = (1, 16, 64, 256)
    return {
        key: DeviceProfile.from_points(
            gpu=gpu,
            method="estimate",
            amp="fp16",
            memory_points=[(b, 2 * GIB + 16 * MIB * b) for b in batches],
            time_points=[(b, t0 + t1 * b) for b in batches],
        )
        for key, (gpu, t0, t1, _) in TYPES.items()
    }


def slots(num_ranks: int) -> list[RankSlot]:
    keys = list(TYPES)
    out = []
    for i in range(num_ranks):
        key = keys[(i // GPUS_PER_NODE) % len(keys)]
        gpu, _, _, total_gib = TYPES[key]
        out.append(
            RankSlot(
                node=f"node-{i // GPUS_PER_NODE:05d}",
                device_index=i % GPUS_PER_NODE,
                gpu=gpu,
                profile=key,
                memory_budget_bytes=int(0.6 * total_gib * GIB),
                total_memory_bytes=total_gib * GIB,
            )
        )
    return out


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def cli_s(*args: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "planner.cli.main", *args], check=True, stdout=subprocess.DEVNULL, env=env
    )
    return time.perf_counter() - start


def rank_env(plan, rank: int) -> dict[str, str]:
    entry = plan.ranks[rank]
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(plan.world_size),
        "LOCAL_RANK": str(entry.local_rank),
        "GROUP_RANK": str(entry.node_rank),
    }


def measure(num_ranks: int, repeat: int, where: Path) -> dict:
    start = time.perf_counter()
    plan = build_plan(JobSpec(model="bench"), slots(num_ranks), profiles())
    build_s = time.perf_counter() - start
    path = where / f"plan-{num_ranks}.json"
    write_s = timed(lambda: write_plan(plan, path))
    ranks = sorted({int(i * (num_ranks - 1) / max(repeat - 1, 1)) for i in range(repeat)})
    part_s = statistics.median(timed(lambda r=r: load_rank_plan(path, env=rank_env(plan, r))) for r in ranks)
    unindexed = where / f"plan-{num_ranks}-unindexed.json"
    unindexed.write_text(json.dumps(encode(plan), indent=2))
    whole_s = timed(lambda: load_rank_plan(unindexed, env=rank_env(plan, ranks[-1])))
    return {
        "ranks": num_ranks,
        "file_mb": round(path.stat().st_size / 1e6, 1),
        "build_s": round(build_s, 2),
        "write_s": round(write_s, 2),
        "load_rank_plan_s": round(part_s, 3),
        "load_rank_plan_whole_s": round(whole_s, 2),
        "show_s": round(cli_s("show", str(path)), 2),
        "show_env_s": round(cli_s("show", str(path), "--emit", "env", "--node-rank", "1"), 2),
    }


def oversized_refusal_s(where: Path) -> float:
    path = where / "huge.json"
    with path.open("wb") as handle:
        handle.truncate(200 * MIB)  # sparse: costs no disk
    start = time.perf_counter()
    try:
        load_rank_plan(path, rank=0, env={})
    except Exception as exc:  # noqa: BLE001  the refusal is what is timed
        assert "over the limit" in str(exc), exc
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--sizes", default="1024,8192,65536", help="comma-separated rank counts")
    parser.add_argument("--repeat", type=int, default=5, help="ranks timed per size (median)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-plan-sizes-") as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            row = measure(size, args.repeat, Path(tmp))
            rows.append(row)
            print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        refusal = oversized_refusal_s(Path(tmp))
    load = os.getloadavg()[0]
    print(f"oversized_refusal_s={refusal:.4f} load_average_1min={load:.1f}")
    out = REPO / "bench" / "results" / "plan_sizes.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"rows": rows, "oversized_refusal_s": refusal, "load_average_1min": load}, indent=2)
    )


if __name__ == "__main__":
    main()
