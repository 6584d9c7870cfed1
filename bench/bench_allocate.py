"""Time ``planner.allocate.solver.allocate`` on random mixed clusters of 8 to 100,000 ranks.

Usage: ``python bench/bench_allocate.py [--repeat R] [--sizes 8,64,...] [--clusters mixed,distinct]``.
Prints one line per size and cluster, ``ranks=N allocate_ms=X allocate_global_batch_ms=Y cluster=...``
(median of R calls, advice included), and writes bench/results/allocate.json. Goals: 10,000 ranks
< 100 ms, 100,000 ranks < 1 s (for the ``mixed`` cluster).

Cluster: each rank draws one of five GPU types (ResNet-50-like, AMP, rough figures: t1 from published
training throughputs, intercepts of 10-30 ms, caps from 60% of memory at ~50 MiB/sample; the exact figures
do not matter for timing). A fifth of the ranks are "busy" and get a cap cut to 30-100% (other processes
hold memory), so distinct (cap, t0, t1) profiles grow with the cluster, as on a real shared cluster.
The global-batch run asks for 1024 samples per rank, multiple of 8 (accumulation is needed on most mixes).
The ``distinct`` cluster is the worst case: every rank has its own cap, intercept and slope (drawn
uniformly between the types' extremes), so nothing can be merged.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from planner.allocate.allocation import allocate

# name: (cap samples, t0 s, t1 s/sample); rough ResNet-50 AMP figures, see the module docstring.
GPU_TYPES = {
    "H100": (1400, 0.008, 1 / 5000),
    "A100": (896, 0.010, 1 / 2600),
    "V100": (184, 0.015, 1 / 1100),
    "L4": (280, 0.020, 1 / 700),
    "T4": (176, 0.025, 1 / 300),
}
SIZES = (8, 64, 512, 4096, 10000, 32768, 100000)


def random_cluster(num_ranks: int, seed: int, cluster: str = "mixed") -> tuple[np.ndarray, ...]:
    """Per rank: cap, t0, t1 and the GPU type's name (the advice groups)."""
    rng = np.random.default_rng(seed)
    names = np.array(list(GPU_TYPES))
    kind = rng.integers(0, len(names), num_ranks)
    if cluster == "distinct":
        cap = rng.integers(8, 1400, num_ranks)
        t0 = rng.uniform(0.008, 0.025, num_ranks)
        t1 = rng.uniform(1 / 5000, 1 / 300, num_ranks)
        return cap, t0, t1, names[kind]
    cap = np.array([GPU_TYPES[n][0] for n in names])[kind]
    t0 = np.array([GPU_TYPES[n][1] for n in names])[kind]
    t1 = np.array([GPU_TYPES[n][2] for n in names])[kind]
    busy = rng.random(num_ranks) < 0.2
    cap = np.where(busy, (cap * rng.uniform(0.3, 1.0, num_ranks)).astype(np.int64), cap)
    return cap, t0, t1, names[kind]


def time_ms(repeat: int, **kwargs) -> tuple[float, object]:
    samples, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = allocate(**kwargs)
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples), result


def bench_one(num_ranks: int, cluster: str, repeat: int) -> dict:
    cap, t0, t1, groups = random_cluster(num_ranks, seed=num_ranks, cluster=cluster)
    common = dict(max_batch=cap, time_intercept_s=t0, time_per_sample_s=t1, multiple_of=8, groups=groups)
    repeat = repeat if num_ranks < 32768 else max(1, repeat // 2)
    plain_ms, plain = time_ms(repeat, **common)
    global_batch = 1024 * num_ranks
    batch_ms, with_b = time_ms(repeat, global_batch=global_batch, **common)
    distinct = len({(int(c), float(a), float(b)) for c, a, b in zip(cap // 8, t0, t1, strict=True)})
    print(
        f"ranks={num_ranks} allocate_ms={plain_ms:.1f} allocate_global_batch_ms={batch_ms:.1f} "
        f"cluster={cluster} distinct_profiles={distinct} accumulate={with_b.accumulate} "
        f"balance_efficiency={plain.balance_efficiency:.3f}",
        flush=True,
    )
    return {
        "ranks": num_ranks,
        "cluster": cluster,
        "allocate_ms": round(plain_ms, 2),
        "allocate_global_batch_ms": round(batch_ms, 2),
        "distinct_profiles": distinct,
        "throughput_samples_per_s": round(plain.throughput_samples_per_s, 1),
        "balance_efficiency": round(plain.balance_efficiency, 4),
        "global_batch": global_batch,
        "accumulate": with_b.accumulate,
        "global_batch_balance_efficiency": round(with_b.balance_efficiency, 4),
        "repeat": repeat,
        "advice": list(plain.advice),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--clusters", default="mixed,distinct")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "allocate.json"))
    args = parser.parse_args()
    rows = []
    for cluster in args.clusters.split(","):
        for num_ranks in map(int, args.sizes.split(",")):
            rows.append(bench_one(num_ranks, cluster, args.repeat))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"bench": "allocate", "gpu_types": GPU_TYPES, "results": rows}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
