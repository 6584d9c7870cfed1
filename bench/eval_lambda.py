"""The step-time model against Lambda's eager PyTorch ResNet-50 table: an independent evaluation.

    python bench/eval_lambda.py PATH/TO/deeplearning-benchmark [--commit REV] [--before OLD_time_model.json]

``lambdal/deeplearning-benchmark`` is kept out of the calibration on purpose (``measured_throughput.csv``'s
header; ``tests/torchkit/estimate/test_time_calibration.py`` asserts it): no row of it is fitted and no
constant is chosen from these errors. One design choice is not blind to it: Hopper's SM-side streaming term
(``calibration/fit.py`` ``SM_STREAM_PRIORS``) was first tried on a discarded branch whose fit held these rows;
here it is fitted on MLPerf rows only, its prior from datasheets. This script is the one place the table is
read. Its rows are ``bench/lambda_rows.py``'s (a fixed rule: single-GPU runs of the
published tables, one row per GPU type, PyTorch build and precision at the median of its runs), each priced
as the estimator prices an eager step: the ResNet-50 kernel table of a fake pass at the row's batch and
precision (NCHW, SGD with momentum), on the row's catalog GPU, with its architecture's calibrated constants
(``time_model.json``, or ``--before``'s file for the comparison column). Prints, per GPU type, predicted /
measured throughput with AMP and with fp32 (TF32 on compute capability 8 and later) and the σ the model
states for the type; the one-of-each mix of every (PyTorch build, precision), its batch split by predicted
speed and run at measured speed (achieved throughput / the bound); the share of rows within 2σ; and one
summary line per calibration:

    lambda[after]: rows=N types=T ratio_min=.. ratio_max=.. types_within_20pct=k/T mix_min=.. within_2sigma=..

A fake pass per distinct (batch, precision) the cached kernel tables lack (tens of seconds each).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from lambda_rows import rows as lambda_rows  # noqa: E402

from torchkit.estimate.roofline import KernelTable, PlacedTable  # noqa: E402
from torchkit.estimate.time_model import DEFAULT_TIME_MODEL_PATH, TimeModel, load_time_model  # noqa: E402
from torchkit.hardware.catalog import load_catalog  # noqa: E402


@dataclass(frozen=True, kw_only=True)
class Row:
    gpu: str
    build: str
    """the PyTorch build's stack label (``lambda-pt113`` NGC 22.10, ``lambda-pt23`` NGC 24.03)"""
    precision: str
    """fp16 (AMP), tf32 or fp32"""
    batch: int
    measured: float

    @property
    def amp(self) -> str:
        return "fp16" if self.precision == "fp16" else "off"


def read_rows(repo: Path, rev: str) -> list[Row]:
    out = []
    for r in lambda_rows(repo, rev):
        _, model, gpu, precision, layout, batch, value, *_rest, stack = r
        if model != "resnet50" or layout != "nchw":
            raise SystemExit(f"unexpected Lambda row {r[0]}: {model} {layout}")
        out.append(Row(gpu=gpu, build=stack, precision=precision, batch=int(batch), measured=float(value)))
    return out


def kernel_tables(rows: list[Row]) -> dict[tuple[int, str], KernelTable]:
    """The ResNet-50 kernel table of every (batch, amp) the rows need: the calibration's cache where it has
    it, else one fake pass (the very estimator the planner runs)."""
    import json

    from torchkit.estimate.calibration.tables import TABLES_PATH, table_key
    from torchkit.estimate.estimator import estimate_step
    from torchkit.estimate.roofline import kernel_table
    from torchkit.workloads import get_workload

    cached = json.loads(TABLES_PATH.read_text())["tables"]
    out = {}
    for batch, amp in sorted({(r.batch, r.amp) for r in rows}):
        key = table_key("resnet50", batch, amp)
        if key in cached:
            out[(batch, amp)] = KernelTable.from_json(cached[key])
            continue
        print(f"fake pass: resnet50 batch {batch} amp {amp}", file=sys.stderr, flush=True)
        estimate = estimate_step(get_workload("resnet50"), batch, amp=amp, optimizer="sgd")  # type: ignore[arg-type]
        out[(batch, amp)] = kernel_table(estimate.kernels)
    return out


@dataclass(frozen=True, kw_only=True)
class Priced:
    row: Row
    predicted: float
    log_sigma: float

    @property
    def ratio(self) -> float:
        return self.predicted / self.row.measured

    @property
    def within_2sigma(self) -> bool:
        return abs(math.log(self.ratio)) <= 2 * self.log_sigma


def price(rows: list[Row], tables: dict[tuple[int, str], KernelTable], model: TimeModel) -> list[Priced]:
    catalog = load_catalog()
    out = []
    for r in rows:
        gpu = catalog.get(r.gpu)
        step_s = PlacedTable.of(tables[(r.batch, r.amp)], gpu, channels_last=False).time_s(
            model.constants_for(gpu)
        )
        out.append(Priced(row=r, predicted=r.batch / step_s, log_sigma=model.uncertainty_for(gpu).log_sigma))
    return out


def mix_efficiency(priced: list[Priced]) -> float:
    """One GPU of each type, the batch split by predicted speed, run at measured speed: achieved / bound."""
    p = [x.predicted for x in priced]
    m = [x.row.measured for x in priced]
    return sum(p) * min(mi / pi for mi, pi in zip(m, p, strict=True)) / sum(m)


def summary(priced: list[Priced]) -> dict[str, float]:
    by_type: dict[str, list[float]] = defaultdict(list)
    for x in priced:
        by_type[x.row.gpu].append(x.ratio)
    groups: dict[tuple[str, str], list[Priced]] = defaultdict(list)
    for x in priced:
        groups[(x.row.build, "amp" if x.row.precision == "fp16" else "fp32")].append(x)
    mixes = {g: mix_efficiency(v) for g, v in groups.items() if len({x.row.gpu for x in v}) > 1}
    return {
        "rows": len(priced),
        "types": len(by_type),
        "ratio_min": min(x.ratio for x in priced),
        "ratio_max": max(x.ratio for x in priced),
        "types_within_20pct": sum(all(0.8 <= r <= 1.2 for r in v) for v in by_type.values()),
        "mix_min": min(mixes.values(), default=1.0),  # one GPU type: nothing to split
        "within_2sigma": sum(x.within_2sigma for x in priced) / len(priced),
        "mixes": mixes,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "repo", type=Path, help="a clone (or bare git directory) of lambdal/deeplearning-benchmark"
    )
    parser.add_argument("--commit", default="HEAD", help="the revision to read (default HEAD)")
    parser.add_argument("--before", type=Path, help="another time_model.json to compare with (e.g. main's)")
    args = parser.parse_args()
    found = subprocess.run(
        ["git", "-C", str(args.repo), "rev-parse", "--verify", f"{args.commit}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if found.returncode != 0:
        raise SystemExit(
            f"eval_lambda: {args.repo} has no revision {args.commit!r} ({found.stderr.strip()}); "
            "give a clone of lambdal/deeplearning-benchmark"
        )
    rev = found.stdout.strip()
    rows = read_rows(args.repo, rev)
    tables = kernel_tables(rows)
    models = {"after": load_time_model(DEFAULT_TIME_MODEL_PATH)}
    if args.before:
        models = {"before": load_time_model(args.before), **models}
    priced = {name: price(rows, tables, m) for name, m in models.items()}
    print(
        f"lambdal/deeplearning-benchmark@{rev[:8]}: {len(rows)} rows (bench/lambda_rows.py); "
        + "; ".join(f"{name}: {m.source}" for name, m in models.items())
    )
    names = list(models)
    head = " ".join(f"{n + ' AMP':>11s} {n + ' fp32':>11s} {n + ' σ':>9s}" for n in names)
    print(f"{'gpu':16s} {'build':13s} {'AMP meas':>9s} {'fp32 meas':>9s} {head}")
    keys = sorted({(x.row.build, x.row.gpu) for x in priced[names[0]]})
    for build, gpu in keys:
        cells = []
        measured = {}
        for n in names:
            mine = {
                ("amp" if x.row.precision == "fp16" else "fp32"): x
                for x in priced[n]
                if x.row.gpu == gpu and x.row.build == build
            }
            measured = {k: v.row.measured for k, v in mine.items()}
            sigma = next(iter(mine.values())).log_sigma
            cells.append(
                " ".join(f"{mine[k].ratio:11.2f}" if k in mine else f"{'-':>11s}" for k in ("amp", "fp32"))
                + f" {math.exp(sigma) - 1:8.0%}"
            )
        print(
            f"{gpu:16s} {build:13s} "
            + " ".join(f"{measured[k]:9.0f}" if k in measured else f"{'-':>9s}" for k in ("amp", "fp32"))
            + " "
            + " ".join(cells)
        )
    for n in names:
        s = summary(priced[n])
        print(
            f"mix by (build, precision) [{n}]: "
            + ", ".join(f"{b} {p} {v:.3f}" for (b, p), v in sorted(s["mixes"].items()))
        )
    for n in names:
        s = summary(priced[n])
        print(
            f"lambda[{n}]: rows={s['rows']} types={s['types']} ratio_min={s['ratio_min']:.2f} "
            f"ratio_max={s['ratio_max']:.2f} types_within_20pct={s['types_within_20pct']}/{s['types']} "
            f"mix_min={s['mix_min']:.3f} within_2sigma={s['within_2sigma']:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
