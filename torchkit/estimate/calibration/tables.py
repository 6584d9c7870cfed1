"""The estimator's kernel tables of the measured configurations, cached in ``kernel_tables.json``.

The fit prices each measured row's kernel table many times (and the memory benchmark needs each
configuration's CUDA peak, ``cuda_peak_bytes``, what ``cuda_device_bytes`` turns into device memory, also at
each row's ``oom_batch``); a fake pass per row would make it slow, so the
tables (GPU-independent: they depend on workload, batch and amp only) are computed once with the very
estimator the planner uses and kept in the repository. ``python bench/calibrate_time.py --refresh-tables``
recomputes them (needed after a change to the workloads or to op_costs); the file records the torch
version and each workload's fingerprint so a stale cache is noticed.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from torchkit.errors import ConfigError
from torchkit.estimate.calibration.data import MeasuredRow
from torchkit.estimate.roofline import KernelTable

TABLES_PATH = Path(__file__).resolve().parent / "kernel_tables.json"


def table_key(model: str, batch: int, amp: str) -> str:
    return f"{model}|{batch}|{amp}"


def build_tables(rows: Iterable[MeasuredRow], *, optimizer: str = "sgd", progress: bool = True) -> dict:
    """Run one fake pass per distinct (model, batch, amp) of ``rows``; returns the JSON document."""
    import torch

    from torchkit.estimate.estimator import estimate_step
    from torchkit.estimate.roofline import kernel_table
    from torchkit.workloads import get_workload, workload_fingerprint

    rows = list(rows)
    keys = sorted({(r.model, r.batch, r.amp) for r in rows})
    oom_keys = sorted({(r.model, r.oom_batch, r.amp) for r in rows if r.oom_batch} - set(keys))
    tables, fingerprints, peaks = {}, {}, {}
    for i, (model, batch, amp) in enumerate(keys + oom_keys, 1):
        workload = get_workload(model)
        if progress:
            print(
                f"[{i}/{len(keys) + len(oom_keys)}] fake pass {model} batch {batch} amp {amp}",
                file=sys.stderr,
                flush=True,
            )
        estimate = estimate_step(workload, batch, amp=amp, optimizer=optimizer)  # type: ignore[arg-type]
        key = table_key(model, batch, amp)
        if (model, batch, amp) in keys:  # an out-of-memory batch needs only its peak
            tables[key] = kernel_table(estimate.kernels).to_json()
        peaks[key] = max(
            estimate.cuda_peak_with_workspace_bytes,
            estimate.cuda_rounded_peak_bytes,
            estimate.peak_allocated_bytes,
        )
        fingerprints[model] = workload_fingerprint(workload)
    return {
        "torch": torch.__version__,
        "optimizer": optimizer,
        "fingerprints": fingerprints,
        "tables": tables,
        "cuda_peak_bytes": peaks,
    }


def write_tables(doc: dict, path: Path = TABLES_PATH) -> None:
    """Write atomically (temp name + rename)."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    os.replace(tmp, path)


def load_tables(rows: Iterable[MeasuredRow], path: Path = TABLES_PATH) -> dict[str, KernelTable]:
    """The cached table of every row's configuration.

    Raises:
        ConfigError: the cache is missing or lacks a configuration a row needs.
    """
    if not path.is_file():
        raise ConfigError(f"{path} is missing (run python bench/calibrate_time.py --refresh-tables)")
    doc = json.loads(path.read_text())
    out = {}
    for r in rows:
        key = table_key(r.model, r.batch, r.amp)
        if key not in doc["tables"]:
            raise ConfigError(
                f"{path.name} has no table for {key} (row {r.id}; run python bench/calibrate_time.py --refresh-tables)"
            )
        out[key] = KernelTable.from_json(doc["tables"][key])
    return out


def load_cuda_peaks(path: Path = TABLES_PATH) -> dict[str, int]:
    """Configuration key -> the estimator's CUDA peak bytes (before the device overhead model)."""
    return {k: int(v) for k, v in json.loads(path.read_text())["cuda_peak_bytes"].items()}
