"""On a lent GPU: measured vs estimated memory and step time for the reference workloads, and our AutoBatch
pick vs the seed's log-log and linear rules on the same probes. Sized to finish in < 4 minutes.

    python bench/gpu_check.py [--workloads resnet50,yolo-n,vit-b16,gpt2-small] [--budget-s 200]

Per workload (bf16 where the GPU has it, SGD): the measured curve (``torchkit.step.measure.measure_curve``:
peak reserved + CUDA context, peak allocated, median step time) at doubling batches, and the estimate for
the same catalog GPU type at the same batches (``torchkit.estimate``). Then, from the measured probe points,
the batch each rule picks for 60% of the available memory, and the measured memory at the nearest probe.
Also prints the fragmentation factor the estimator should use (reserved / allocated). Writes
bench/results/gpu_check.json. Exits 2 without a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from torchkit.units import GIB

REPO = Path(__file__).resolve().parents[1]


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--workloads", default="resnet50,yolo-n,vit-b16,gpt2-small")
    parser.add_argument(
        "--budget-s", type=float, default=200.0, help="stop starting new workloads after this"
    )
    parser.add_argument("--seq-len", type=int, default=512, help="gpt2-small sequence length")
    return parser.parse_args()


def _compare_rows(measured, estimated) -> list[dict]:
    """One row per measured batch, measured beside estimated memory and step time, printed as a table."""
    from torchkit.estimate.overhead import DEFAULT_CUDA_OVERHEAD

    est_mem = dict(estimated.memory_points)
    est_alloc = dict(estimated.allocated_points)
    est_time = dict(estimated.time_points)
    print(
        f"{'batch':>6} {'meas dev GiB':>12} {'est dev GiB':>11} {'err %':>6} {'meas alloc':>10} "
        f"{'est alloc':>9} {'err %':>6} {'frag':>5} {'meas ms':>8} {'est ms':>7}"
    )
    rows = []
    for (b, dev), (_, alloc), (_, step) in zip(
        measured.memory_points, measured.allocated_points, measured.time_points, strict=True
    ):
        reserved = dev - DEFAULT_CUDA_OVERHEAD.context_bytes  # measure_curve adds the context constant
        row = {
            "batch": b,
            "measured_device_bytes": dev,
            "estimated_device_bytes": est_mem[b],
            "measured_allocated_bytes": alloc,
            "estimated_allocated_bytes": est_alloc[b],
            "measured_step_s": step,
            "estimated_step_s": est_time[b],
        }
        rows.append(row)
        print(
            f"{b:>6} {dev / GIB:>12.2f} {est_mem[b] / GIB:>11.2f} {100 * (est_mem[b] / dev - 1):>6.1f} "
            f"{alloc / GIB:>10.2f} {est_alloc[b] / GIB:>9.2f} {100 * (est_alloc[b] / alloc - 1):>6.1f} "
            f"{reserved / max(alloc, 1):>5.2f} {step * 1000:>8.1f} {est_time[b] * 1000:>7.1f}"
        )
    return rows


def _rule_picks(measured, total_bytes: int, free_bytes: int) -> dict[str, int]:
    """The batch each rule (ours and the seed's two) picks from the measured probes for 60% of the free memory."""
    from torchkit.seed_api.batch_choice import choose_batch

    probe_bytes = [v for _, v in measured.memory_points] + ([None] if measured.oom_batch else [])
    probe_batches = [b for b, _ in measured.memory_points] + (
        [measured.oom_batch] if measured.oom_batch else []
    )
    picks = {}
    for rule in ("affine", "seed-linear", "seed-loglog"):
        choice = choose_batch(
            probe_batches,
            probe_bytes,
            total_bytes=total_bytes,
            available_bytes=free_bytes,
            fraction=0.6,
            fit=rule,
        )
        picks[rule] = choice.batch
    print("picks at 60% of available: " + ", ".join(f"{k} {v}" for k, v in picks.items()))
    return picks


def _backward_shares(measured, estimated) -> list[dict]:
    """The backward pass's share of forward + backward per batch, measured beside estimated, printed."""
    est_share = dict(estimated.backward_shares)
    shares = [(b, s, est_share.get(b)) for b, s in measured.backward_shares]
    print(
        "backward share of forward + backward (DDP's overlap), measured vs estimated: "
        + ", ".join(f"batch {b} {s:.2f}" + ("" if e is None else f" vs {e:.2f}") for b, s, e in shares)
    )
    return [{"batch": b, "measured": s, "estimated": e} for b, s, e in shares]


def _check_workload(
    workload_name: str, seq_len: int, device, gpu, amp: str, total_bytes: int, free_bytes: int
) -> dict:
    """Measure one workload's curve, estimate the same batches, print both and what each rule picks."""
    from torchkit.estimate import estimate_curves
    from torchkit.estimate.overhead import DEFAULT_CUDA_OVERHEAD
    from torchkit.step.measure import measure_curve
    from torchkit.workloads import get_workload

    workload = get_workload(workload_name, seq_len=seq_len if workload_name.startswith("gpt2") else None)
    t = time.monotonic()
    measured = measure_curve(
        workload,
        device,
        amp=amp,
        optimizer="sgd",
        stop_fraction=0.30,
        context_bytes=DEFAULT_CUDA_OVERHEAD.context_bytes,
    )
    batches = [b for b, _ in measured.memory_points]
    estimated = estimate_curves(workload, gpu, amp=amp, optimizer="sgd", batches=batches)
    print(f"\n{workload_name} ({time.monotonic() - t:.0f} s)")
    rows = _compare_rows(measured, estimated)
    picks = _rule_picks(measured, total_bytes, free_bytes)
    return {
        "workload": workload_name,
        "rows": rows,
        "oom_batch": measured.oom_batch,
        "picks": picks,
        "backward_shares": _backward_shares(measured, estimated),
    }


def main() -> int:
    args = _parse_args()

    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA GPU here (run this on a GPU machine)", file=sys.stderr)
        return 2
    from torchkit.hardware.catalog import load_catalog

    device = torch.device("cuda", 0)
    name = torch.cuda.get_device_name(device)
    gpu = load_catalog().resolve(name)
    if gpu is None:
        print(f"error: GPU '{name}' is not in the catalog", file=sys.stderr)
        return 2
    amp = "bf16" if gpu.supports_bf16 else "fp16"
    free, total = torch.cuda.mem_get_info(device)
    print(
        f"GPU {name} -> catalog {gpu.name}; {total / GIB:.1f} GiB total, {free / GIB:.1f} GiB free; amp {amp}"
    )
    start = time.monotonic()
    results = []
    for workload_name in args.workloads.split(","):
        if time.monotonic() - start > args.budget_s:
            print(f"skipping {workload_name}: time budget spent")
            continue
        results.append(_check_workload(workload_name, args.seq_len, device, gpu, amp, total, free))
    out = REPO / "bench" / "results" / "gpu_check.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"gpu": name, "catalog": gpu.name, "amp": amp, "results": results}, indent=2))
    print(f"\nwrote {out} ({time.monotonic() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
