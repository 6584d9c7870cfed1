"""Plan quality on every shipped cluster config: uniform (plain DDP) vs max (per-GPU AutoBatch) vs balanced,
and the gap between balanced and the exact integer optimum.

    python bench/bench_plan_quality.py [--model resnet50]

For each config (planned in-process, profiles estimated for each GPU type), two jobs: no global batch
(maximise throughput) and a global batch of 256 per rank (minimise the step time, with accumulation where
needed). The exact optimum is found by brute force over every candidate step time t_i(b) (all ranks, all
batches that are multiples of the job's multiple-of): throughput(T) = Σ_i b_i(T) / T with
b_i(T) = min(cap_i, largest batch with t_i(b) ≤ T); with a global batch, the smallest T whose Σ b_i(T)
reaches it. Ranks with the same profile are merged, so the search stays small. Writes
bench/results/plan_quality.json.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from planner.allocate.allocation import allocate
from planner.cluster import load_cluster, shipped_cluster_configs
from planner.codec import encode
from planner.driver import plan_without_ray
from planner.errors import InfeasiblePlanError
from planner.job import JobSpec

REPO = Path(__file__).resolve().parents[1]


def exact_optimum(
    caps: np.ndarray, t0: np.ndarray, t1: np.ndarray, k: int, global_batch: int | None
) -> float:
    """Best throughput (no global batch) or best samples/s at exactly ``global_batch`` per step."""
    groups: dict[tuple, int] = {}
    for cap, a, b in zip(caps, t0, t1, strict=True):
        groups[(int(cap), float(a), float(b))] = groups.get((int(cap), float(a), float(b)), 0) + 1
    keys = list(groups)
    counts = np.array([groups[g] for g in keys])
    g_cap = np.array([g[0] for g in keys])
    g_t0 = np.array([g[1] for g in keys])
    g_t1 = np.array([g[2] for g in keys])
    candidates = np.unique(np.concatenate([a + b * np.arange(k, c + 1, k) for c, a, b in keys if c >= k]))

    def samples_at(step_time: float) -> int:
        with np.errstate(divide="ignore", invalid="ignore"):
            fit = np.where(g_t1 > 0, np.floor((step_time - g_t0) / np.where(g_t1 > 0, g_t1, 1) + 1e-9), g_cap)
        fit = np.where(step_time + 1e-15 >= g_t0 + g_t1 * k, np.minimum(fit, g_cap) // k * k, 0)
        return int((np.maximum(fit, 0) * counts).sum())

    if global_batch is None:
        return max(samples_at(t) / t for t in candidates)
    for t in candidates:  # ascending
        if samples_at(t) >= global_batch:
            return global_batch / t
    return float("nan")


def evaluate(config: Path, model: str, per_rank_global: int | None) -> list[dict]:
    cluster = load_cluster(config)
    base = JobSpec(model=model, multiple_of=8)
    reference = encode(plan_without_ray(base, cluster).plan)
    ranks = reference["ranks"]
    profiles = reference["profiles"]
    caps = np.array([r["max_batch"] for r in ranks])
    t0 = np.array([profiles[r["profile"]]["time_fit"]["intercept_s"] for r in ranks])
    t1 = np.array([profiles[r["profile"]]["time_fit"]["s_per_sample"] for r in ranks])
    global_batch = None if per_rank_global is None else per_rank_global * len(ranks)
    rows = []
    for mode in ("uniform", "max", "balanced"):
        job = replace(base, mode=mode, global_batch=global_batch)
        try:
            a = allocate(
                caps, t0, t1, mode=job.mode, global_batch=job.global_batch, multiple_of=8, min_batch=1
            )
        except InfeasiblePlanError as exc:
            rows.append(
                {"config": config.stem, "mode": mode, "global_batch": global_batch, "error": str(exc)}
            )
            continue
        rows.append(
            {
                "config": config.stem,
                "ranks": len(ranks),
                "mode": mode,
                "global_batch": a.global_batch,
                "accumulate": a.accumulate,
                "throughput_samples_per_s": a.throughput_samples_per_s,
                "step_time_ms": a.step_time_s * 1000,
                "balance_efficiency": a.balance_efficiency,
            }
        )
    optimum = exact_optimum(caps, t0, t1, 8, None if global_batch is None else _step_batch(rows))
    for row in rows:
        if row.get("mode") == "balanced" and "error" not in row:
            row["exact_optimum_samples_per_s"] = optimum
            row["gap_to_optimum_percent"] = 100 * (1 - row["throughput_samples_per_s"] / optimum)
    return rows


def _step_batch(rows: list[dict]) -> int | None:
    balanced = next((r for r in rows if r["mode"] == "balanced" and "error" not in r), None)
    return None if balanced is None else balanced["global_batch"] // balanced["accumulate"]


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--model", default="resnet50")
    args = parser.parse_args()
    results = []
    print(
        f"{'config':18} {'ranks':>5} {'global':>7} {'mode':9} {'samples/s':>10} {'step ms':>8} {'eff':>5} {'gap %':>6}"
    )
    for config in shipped_cluster_configs().values():
        for per_rank in (None, 256):
            for row in evaluate(config, args.model, per_rank):
                results.append(row)
                if "error" in row:
                    print(
                        f"{row['config']:18} {'':>5} {row['global_batch'] or '-':>7} {row['mode']:9} {row['error'][:60]}"
                    )
                    continue
                gap = f"{row['gap_to_optimum_percent']:.2f}" if "gap_to_optimum_percent" in row else ""
                print(
                    f"{row['config']:18} {row['ranks']:>5} {row['global_batch'] if per_rank else '-':>7} "
                    f"{row['mode']:9} {row['throughput_samples_per_s']:>10.0f} {row['step_time_ms']:>8.1f} "
                    f"{row['balance_efficiency']:>5.2f} {gap:>6}"
                )
    out = REPO / "bench" / "results" / "plan_quality.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": args.model, "rows": results}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
