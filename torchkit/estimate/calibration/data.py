"""The calibration data: public measured training throughput (``measured_throughput.csv``).

Each row is one measurement as its source reports it (see the file's header for the columns): one GPU, or
per GPU of a data-parallel run of ``gpus_in_run``, in one software ``stack`` (``calibration/stacks.py``).
Reading checks every row: a source, a catalog GPU, a workload the estimator has, a precision the GPU can
run, positive batch and throughput, a known stack. Rows are kept in file order.
"""

from __future__ import annotations

import csv
import hashlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from torchkit.errors import ConfigError
from torchkit.estimate.calibration.stacks import REFERENCE_STACK, STACKS
from torchkit.hardware.catalog import GpuCatalog
from torchkit.workloads.registry import WORKLOAD_NAMES

DATA_PATH = Path(__file__).resolve().parent / "measured_throughput.csv"
COLUMNS = (
    "id",
    "model",
    "gpu",
    "precision",
    "layout",
    "batch",
    "samples_per_s",
    "optimizer",
    "source",
    "software",
    "oom_batch",
    "gpus_in_run",
    "stack",
)
OPTIONAL_COLUMNS: tuple[str, ...] = ("oom_batch", "gpus_in_run", "stack")
"""columns a file may leave out (in this order after the required ones): files written before a column
existed still read"""
REQUIRED_COLUMNS = tuple(c for c in COLUMNS if c not in OPTIONAL_COLUMNS)
Precision = Literal["fp16", "bf16", "tf32", "fp32"]
PRECISIONS: tuple[str, ...] = ("fp16", "bf16", "tf32", "fp32")
LAYOUTS: tuple[str, ...] = ("nchw", "nhwc")
CALIBRATION_MODELS: tuple[str, ...] = WORKLOAD_NAMES
"""workloads a row may name: the built-in ones (``torchkit.workloads.registry``)"""


@dataclass(frozen=True, kw_only=True)
class MeasuredRow:
    """One public measurement."""

    id: str
    model: str
    """built-in workload name"""
    gpu: str
    """catalog GPU type"""
    precision: Precision
    layout: Literal["nchw", "nhwc"]
    batch: int
    samples_per_s: float
    optimizer: str
    source: str
    software: str
    oom_batch: int | None = None
    """a larger batch the source tried on the same card and ran out of memory at (None: not reported)"""
    gpus_in_run: int = 1
    """GPUs of the measured run: 1 for a single-GPU measurement, N for a throughput per GPU of an N-GPU
    data-parallel run (its gradient synchronisation included)"""
    stack: str = REFERENCE_STACK
    """the software stack (``calibration/stacks.py``): only ``pytorch-eager`` rows are absolute throughput of
    what the estimator predicts; the others count as ratios between GPU types inside their stack"""

    @property
    def kind(self) -> str:
        """``single GPU`` or ``per GPU of N``, and the stack: what the row is honest for"""
        where = "single GPU" if self.gpus_in_run == 1 else f"per GPU of {self.gpus_in_run}"
        return f"{where}, {self.stack}"

    @property
    def amp(self) -> str:
        """the estimator's amp mode: fp16/bf16 autocast, else off (TF32 vs FP32 follows the GPU)"""
        return self.precision if self.precision in ("fp16", "bf16") else "off"

    @property
    def channels_last(self) -> bool:
        return self.layout == "nhwc"


def held_out_ids(rows: Sequence[MeasuredRow], catalog: GpuCatalog) -> frozenset[str]:
    """The deterministic held-out split, stratified: within each (GPU architecture, precision, stack) the
    rows in the order of a hash of their id, and every third one from the second on is held out. So the fit
    sees every (architecture, precision, stack) the held-out rows ask about (a group of one row is never
    held out); leaving whole GPU types, models or an architecture's eager rows out is the benchmark's
    cross-validation."""
    from torchkit.estimate.time_model import architecture

    groups: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for r in rows:
        groups[(architecture(catalog.get(r.gpu)), r.precision, r.stack)].append(r.id)
    held = set()
    for ids in groups.values():
        ordered = sorted(ids, key=lambda i: hashlib.sha256(i.encode()).hexdigest())
        held.update(ordered[1::3])
    return frozenset(held)


def _fail(line: int, what: str, fix: str) -> ConfigError:
    return ConfigError(f"{DATA_PATH.name} line {line}: {what} ({fix})")


def _parse(line: int, raw: dict[str, str], catalog: GpuCatalog) -> MeasuredRow:
    missing = [c for c in REQUIRED_COLUMNS if not (raw.get(c) or "").strip()]
    if missing:
        raise _fail(line, f"empty {', '.join(missing)}", "every row needs all columns, a source above all")
    if raw["gpu"] not in catalog:
        raise _fail(
            line, f"GPU {raw['gpu']!r} is not in the catalog", "use a name from cluster_configs/gpus.yaml"
        )
    if raw["model"] not in CALIBRATION_MODELS:
        raise _fail(
            line, f"model {raw['model']!r} is not a built-in workload", f"one of {CALIBRATION_MODELS}"
        )
    if raw["precision"] not in PRECISIONS or raw["layout"] not in LAYOUTS:
        raise _fail(line, f"precision/layout {raw['precision']}/{raw['layout']}", f"{PRECISIONS} / {LAYOUTS}")
    cc_major = int(str(catalog.get(raw["gpu"]).compute_capability or "0").split(".")[0])
    if (raw["precision"] == "tf32") != (cc_major >= 8) and raw["precision"] in ("tf32", "fp32"):
        raise _fail(
            line, f"{raw['precision']} on compute capability {cc_major}.x", "tf32 needs >= 8, fp32 rows < 8"
        )
    try:
        batch, tput = int(raw["batch"]), float(raw["samples_per_s"])
    except ValueError as e:
        raise _fail(line, f"batch/samples_per_s not numbers: {e}", "integer batch, float throughput") from e
    if batch < 1 or not tput > 0:
        raise _fail(line, f"batch {batch}, samples_per_s {tput}", "both must be positive")
    oom = (raw.get("oom_batch") or "").strip()
    if oom and (not oom.isdigit() or int(oom) <= batch):
        raise _fail(line, f"oom_batch {oom!r}", f"empty, or an integer batch above the row's batch {batch}")
    gpus = (raw.get("gpus_in_run") or "").strip() or "1"
    if not gpus.isdigit() or int(gpus) < 1:
        raise _fail(line, f"gpus_in_run {gpus!r}", "empty (one GPU), or the run's GPU count")
    stack = (raw.get("stack") or "").strip() or REFERENCE_STACK
    if stack not in STACKS:
        raise _fail(
            line, f"stack {stack!r}", f"one of {', '.join(STACKS)} (torchkit/estimate/calibration/stacks.py)"
        )
    return MeasuredRow(
        id=raw["id"],
        model=raw["model"],
        gpu=raw["gpu"],
        precision=raw["precision"],  # type: ignore[arg-type]
        layout=raw["layout"],
        batch=batch,
        samples_per_s=tput,  # type: ignore[arg-type]
        optimizer=raw["optimizer"],
        source=raw["source"],
        software=raw["software"],
        oom_batch=int(oom) if oom else None,
        gpus_in_run=int(gpus),
        stack=stack,
    )


def read_measured(path: Path = DATA_PATH, catalog: GpuCatalog | None = None) -> tuple[MeasuredRow, ...]:
    """Every row of the data file, checked.

    Raises:
        ConfigError: a row is incomplete or names something unknown; duplicate ids; wrong header.
    """
    if catalog is None:
        from torchkit.hardware.catalog import load_catalog

        catalog = load_catalog()
    lines = path.read_text().splitlines()
    body = [(n, text) for n, text in enumerate(lines, 1) if text.strip() and not text.startswith("#")]
    reader = csv.DictReader([text for _, text in body])
    header = tuple(reader.fieldnames or ())
    known_prefixes = {REQUIRED_COLUMNS + OPTIONAL_COLUMNS[:k] for k in range(len(OPTIONAL_COLUMNS) + 1)}
    if header not in known_prefixes:
        raise ConfigError(f"{path.name}: header {reader.fieldnames} (expected {', '.join(COLUMNS)})")
    rows = [_parse(body[i + 1][0], raw, catalog) for i, raw in enumerate(reader)]
    ids = [r.id for r in rows]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{path.name}: duplicate row ids {sorted({i for i in ids if ids.count(i) > 1})}")
    return tuple(rows)
