"""``batchplan catalog``: the GPU types batchplan knows (memory, peak throughputs, bf16, NVML aliases).

With ``--cluster FILE`` the types a cluster config adds under ``gpu_types:`` are listed too. ``--json``
prints ``{"schema": "batchplan/catalog@1", "gpus": [...]}`` with every figure in bytes and bytes/s.
"""

from __future__ import annotations

import argparse
from typing import Any

from planner.cli.output import format_gib, print_json, print_table
from torchkit.hardware.catalog import GpuCatalog, gpu_spec_to_dict

CATALOG_SCHEMA = "batchplan/catalog@1"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "catalog",
        help="list the GPU types in the catalog",
        description="List the GPU types batchplan knows: memory as the driver reports it, dense FP16/BF16 "
        "tensor and FP32 peaks, memory bandwidth, bf16 support and the names NVML reports.",
    )
    p.add_argument("--json", action="store_true", help="print JSON (schema batchplan/catalog@1)")
    p.add_argument(
        "--cluster",
        metavar="FILE",
        help="also list the types this cluster config defines under gpu_types:",
    )
    p.set_defaults(func=run)
    return p


def catalog_to_json(catalog: GpuCatalog) -> dict[str, Any]:
    """The catalog as the ``batchplan/catalog@1`` JSON document."""
    return {"schema": CATALOG_SCHEMA, "gpus": [gpu_spec_to_dict(spec) for spec in catalog]}


def _tflops(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def catalog_of_args(args: argparse.Namespace) -> GpuCatalog:
    """The catalog a command's ``--cluster FILE`` says applies (``planner.cluster.catalog_for``)."""
    from planner.cluster import catalog_for, load_cluster

    return catalog_for(load_cluster(args.cluster) if getattr(args, "cluster", None) else None)


def run(args: argparse.Namespace) -> int:
    catalog = catalog_of_args(args)
    if args.json:
        print_json(catalog_to_json(catalog))
        return 0
    rows = [
        (
            spec.name,
            format_gib(spec.memory_bytes),
            _tflops(spec.fp16_tflops),
            _tflops(spec.bf16_tflops),
            _tflops(spec.fp32_tflops),
            f"{spec.memory_bandwidth_bytes_per_s / 1e9:g}",
            "yes" if spec.supports_bf16 else "no",
            spec.compute_capability or "-",
            ", ".join(spec.aliases) or "-",
        )
        for spec in catalog
    ]
    print_table(
        f"GPU catalog ({len(rows)} types; dense tensor peaks; source: {catalog.source})",
        (
            "GPU",
            "memory GiB",
            "FP16 TFLOP/s",
            "BF16 TFLOP/s",
            "FP32 TFLOP/s",
            "bandwidth GB/s",
            "bf16",
            "CC",
            "NVML names",
        ),
        rows,
    )
    return 0
