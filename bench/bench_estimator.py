"""Accuracy and speed of the fake-tensor estimator on CPU.

Accuracy: for every reference workload at 3 batch sizes, the estimated CPU peak (fake pass + CPU
kernel-workspace model, ``cpu_peak_bytes``) against the peak of the same training step really run on CPU
in a fresh process (``torch.profiler`` allocation records, ``torchkit.estimate.cpu_truth``). Held out
beside them: library models the estimator was not written against (timm, torchvision, Hugging Face from
config, Ultralytics YAMLs, an LSTM and the stock TransformerEncoder on token ids; the LSTM backward-scratch
rule was fitted on 1-layer LSTMs, the 2-layer classifier with an embedding here is not one of them). A
library that cannot import here is reported as skipped with its reason.
Speed: ``estimate_curves`` (3 fake passes) for ResNet-50@224 and the YOLO-likes@640, in a fresh process.

Prints a table and writes ``bench/results/estimator.json``. The full run takes ~10-20 min on 2 contended
cores (the real CPU steps dominate); ``--quick`` uses small inputs and takes ~2 min.

    python bench/bench_estimator.py [--quick] [--models reference|library|all] [--only resnet50,yolo-n] [--skip-truth]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from torchkit.units import MIB

RESULTS = Path(__file__).resolve().parent / "results" / "estimator.json"

# (workload, size kwargs, batches, optimizer, amp): reference input sizes, batches a CPU step can run in
# about a minute; both optimizers and two AMP rows appear
FULL_CASES = [
    ("resnet18", {"imgsz": 224}, (4, 8, 16), "sgd", "off"),
    ("resnet50", {"imgsz": 224}, (2, 4, 8), "sgd", "off"),
    ("yolo-n", {"imgsz": 640}, (1, 2, 4), "adamw", "off"),
    ("yolo-s", {"imgsz": 640}, (1, 2, 4), "sgd", "off"),
    ("vit-b16", {"imgsz": 224}, (2, 4, 8), "adamw", "off"),
    ("gpt2-small", {"seq_len": 512}, (1, 2, 4), "adamw", "off"),
    (
        "resnet18",
        {"imgsz": 64},
        (4, 8, 16),
        "sgd",
        "off",
    ),  # small spatial: oneDNN 2x2-conv scratch at the peak
    ("yolo-n", {"imgsz": 320}, (2, 4, 8), "sgd", "fp16"),
    ("resnet18", {"imgsz": 112}, (8, 16, 32), "adamw", "bf16"),
]
QUICK_CASES = [
    ("resnet18", {"imgsz": 64}, (4, 8, 16), "sgd", "off"),
    ("resnet50", {"imgsz": 96}, (2, 4, 8), "sgd", "off"),
    ("yolo-n", {"imgsz": 128}, (2, 4, 8), "adamw", "off"),
    ("yolo-s", {"imgsz": 128}, (2, 4, 8), "sgd", "off"),
    ("vit-b16", {"imgsz": 64}, (4, 8, 16), "adamw", "off"),
    ("gpt2-small", {"seq_len": 64}, (1, 2, 4), "sgd", "off"),
]

# held-out library models: (model, size kwargs, batches, optimizer, amp)
LIBRARY_FULL_CASES = [
    ("timm:resnet50", {"imgsz": 224}, (2, 4), "sgd", "off"),
    ("timm:convnext_tiny", {"imgsz": 224}, (2, 4), "adamw", "off"),
    ("timm:vit_small_patch16_224", {}, (2, 4), "adamw", "off"),
    ("torchvision:mobilenet_v3_large", {"imgsz": 224}, (4, 8), "sgd", "off"),
    ("hf:gpt2", {"seq_len": 256}, (1, 2), "adamw", "off"),
    ("hf:bert", {"seq_len": 128}, (2, 4), "adamw", "off"),
    ("ultralytics:yolov8n.yaml", {"imgsz": 640}, (1, 2), "sgd", "off"),
    ("ultralytics:yolo11s.yaml", {"imgsz": 640}, (1, 2), "adamw", "off"),
    (
        "tests.planner.tiny_models:lstm_classifier",
        {"seq_len": 256, "vocab_size": 1000},
        (16, 64),
        "adamw",
        "off",
    ),
    (
        "tests.planner.tiny_models:transformer_encoder",
        {"seq_len": 256, "vocab_size": 1000},
        (16, 64),
        "sgd",
        "off",
    ),
]
LIBRARY_QUICK_CASES = [
    ("timm:resnet18", {"imgsz": 64}, (2, 4), "sgd", "off"),
    ("timm:vit_tiny_patch16_224", {"imgsz": 64}, (2, 4), "adamw", "off"),
    ("torchvision:mobilenet_v3_small", {"imgsz": 64}, (2, 4), "sgd", "off"),
    ("hf:gpt2", {"seq_len": 32}, (1, 2), "sgd", "off"),
    ("hf:bert", {"seq_len": 32}, (2, 4), "adamw", "off"),
    ("ultralytics:yolov8n.yaml", {"imgsz": 320}, (1, 2), "sgd", "off"),
    ("ultralytics:yolo11n.yaml", {"imgsz": 320}, (1, 2), "adamw", "off"),
    (
        "tests.planner.tiny_models:lstm_classifier",
        {"seq_len": 64, "vocab_size": 1000},
        (8, 32),
        "adamw",
        "off",
    ),
    (
        "tests.planner.tiny_models:transformer_encoder",
        {"seq_len": 64, "vocab_size": 1000},
        (8, 32),
        "sgd",
        "off",
    ),
]

SPEED_SNIPPET = r"""
import json, sys, time
start = time.perf_counter()
from torchkit.hardware.catalog import load_catalog
from torchkit.estimate import estimate_curves
from torchkit.workloads import get_workload
gpu = load_catalog().get("A100-SXM4-80GB")
rows = []
for name in sys.argv[1:]:
    t = time.perf_counter()
    curves = estimate_curves(get_workload(name), gpu)
    rows.append({"workload": name, "wall_s": time.perf_counter() - t, "fake_passes": curves.num_fake_passes,
                 "probes": [b for b, _ in curves.memory_points]})
print(json.dumps({"process_wall_s": time.perf_counter() - start, "rows": rows}))
"""


def accuracy_rows(cases: list, skip_truth: bool) -> list[dict]:
    from torchkit.errors import WorkloadError
    from torchkit.estimate import cpu_peak_bytes, estimate_step
    from torchkit.estimate.cpu_truth import measure_cpu_peak_in_subprocess
    from torchkit.workloads import get_workload

    rows = []
    for name, size, batches, optimizer, amp in cases:
        try:
            workload = get_workload(name, **size)
        except WorkloadError as e:  # a library that is missing or cannot import here
            print(f"{name:<44} skipped: {e}", flush=True)
            rows.append({"workload": name, "size": size, "skipped": str(e)})
            continue
        for batch in batches:
            estimate = estimate_step(workload, batch, amp=amp, optimizer=optimizer, target="cpu")
            row = {
                "workload": name,
                "size": size,
                "batch": batch,
                "optimizer": optimizer,
                "amp": amp,
                "fake_peak_bytes": estimate.peak_allocated_bytes,
                "estimated_cpu_peak_bytes": cpu_peak_bytes(estimate),
                "peak_phase": estimate.peak_phase,
                "peak_op": estimate.peak_op,
                "cpu_peak_op": estimate.cpu_peak_op,
                "estimator_wall_s": round(estimate.wall_s, 3),
                "fake_passes": 1,
            }
            if not skip_truth:
                truth = measure_cpu_peak_in_subprocess(name, batch, amp=amp, optimizer=optimizer, **size)
                row["measured_cpu_peak_bytes"] = truth.peak_bytes
                row["measured_wall_s"] = round(truth.wall_s, 2)
                row["error_pct"] = 100 * (row["estimated_cpu_peak_bytes"] / truth.peak_bytes - 1)
                row["fake_only_error_pct"] = 100 * (row["fake_peak_bytes"] / truth.peak_bytes - 1)
            rows.append(row)
            _print_row(row)
    return rows


def _print_row(row: dict) -> None:
    size = ",".join(f"{k}={v}" for k, v in row["size"].items())
    measured = row.get("measured_cpu_peak_bytes")
    text = (
        f"{row['workload']:<44} {size:<24} {row['optimizer']:<5} {row['amp']:<4} b{row['batch']:<3} "
        f"est {row['estimated_cpu_peak_bytes'] / MIB:9.1f} MiB"
    )
    if measured is not None:
        text += f"  real {measured / MIB:9.1f} MiB  err {row['error_pct']:+6.2f}%  (fake only {row['fake_only_error_pct']:+6.2f}%)"
    text += f"  peak@{row['cpu_peak_op']}  est {row['estimator_wall_s']:.2f}s"
    if measured is not None:
        text += f"  real step {row['measured_wall_s']:.1f}s"
    print(text, flush=True)


def speed_run(names: list[str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", SPEED_SNIPPET, *names],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        check=True,
    )
    return json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--quick", action="store_true", help="small inputs (minutes instead of ~15)")
    parser.add_argument("--only", help="comma-separated workload names")
    parser.add_argument(
        "--models",
        choices=("reference", "library", "all"),
        default="all",
        help="reference workloads, held-out library models, or both (default)",
    )
    parser.add_argument("--skip-truth", action="store_true", help="estimates only, no real CPU steps")
    parser.add_argument("--skip-speed", action="store_true")
    args = parser.parse_args()
    reference = QUICK_CASES if args.quick else FULL_CASES
    library = LIBRARY_QUICK_CASES if args.quick else LIBRARY_FULL_CASES
    cases = {"reference": reference, "library": library, "all": reference + library}[args.models]
    if args.only:
        keep = set(args.only.split(","))
        cases = [c for c in cases if c[0] in keep]
    import torch

    started = time.time()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, cpu capability "
        f"{torch.backends.cpu.get_cpu_capability()}"
    )
    print(
        "== accuracy: estimated CPU peak vs real CPU step (fresh process, torch.profiler allocation records)"
    )
    rows = accuracy_rows(cases, args.skip_truth)
    speed = {}
    if not args.skip_speed:
        print("== speed: estimate_curves (default probes) in a fresh process")
        for names in (["resnet50"], ["yolo-s"], ["yolo-n"], ["resnet50", "yolo-s"]):
            result = speed_run(names)
            speed[" + ".join(names)] = result
            parts = ", ".join(
                f"{r['workload']} {r['wall_s']:.1f}s/{r['fake_passes']} passes" for r in result["rows"]
            )
            print(
                f"{' + '.join(names):<20} {parts}  (process incl. imports {result['process_wall_s']:.1f}s)",
                flush=True,
            )
    from torchkit.workloads import WORKLOAD_NAMES

    errors = [abs(r["error_pct"]) for r in rows if "error_pct" in r]
    held_out = [abs(r["error_pct"]) for r in rows if "error_pct" in r and r["workload"] not in WORKLOAD_NAMES]
    if held_out:
        print(f"held-out library models: max |error| {max(held_out):.2f}% over {len(held_out)} points")
    summary = {
        "held_out_max_abs_error_pct": max(held_out) if held_out else None,
        "max_abs_error_pct": max(errors) if errors else None,
        "within_10pct": all(e <= 10 for e in errors) if errors else None,
        "within_5pct": all(e <= 5 for e in errors) if errors else None,
    }
    if errors:
        print(
            f"max |error| {summary['max_abs_error_pct']:.2f}% over {len(errors)} points "
            f"(±10%: {summary['within_10pct']}, ±5%: {summary['within_5pct']})"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                "quick": args.quick,
                "accuracy": rows,
                "speed": speed,
                "summary": summary,
                "bench_wall_s": round(time.time() - started, 1),
            },
            indent=2,
        )
    )
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
