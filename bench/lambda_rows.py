"""Read the calibration rows of Lambda's PyTorch benchmark from a clone of ``lambdal/deeplearning-benchmark``.

    python bench/lambda_rows.py PATH/TO/deeplearning-benchmark [--commit REV] > rows.csv

Prints the ResNet-50 rows of ``torchkit/estimate/calibration/measured_throughput.csv`` that come from it
(the file's columns, no header), one row per (GPU type, PyTorch build, precision), by a rule fixed before
any row was fitted:

* **single-GPU runs only**: the entries of ``pytorch/pytorch-train-throughput-{fp16,fp32}.csv`` with
  ``num_gpu`` 1 (their run directories from ``list_system_single`` of ``pytorch/scripts/
  compile_results_pytorch.py``) and of ``pytorch/pytorch-train-throughput-v2-{fp16,fp32}.csv`` whose
  directory names one GPU (``_1x<GPU>``);
* each run's GPU and PyTorch build are read from its ``sys_pytorch.txt``; its batch from its
  ``PyTorch_resnet50_{AMP,FP32}/benchmark.para`` (checked against ``pytorch-train-bs-*.csv`` for v1 entries);
  its data backend, memory format and loss scaling from the log's ``PARAMETER`` line (every run: synthetic
  data made on the GPU, NCHW, SGD with momentum, AMP with a static loss scale of 256 or fp32);
* the runs of one GPU type, PyTorch build and precision are one row: the median of their published
  throughputs (the spread between machines is printed to stderr), since repeats of one configuration are
  not independent evidence about the model;
* runs on a GPU the catalog lacks (GH200, B200) or of a PyTorch build with fewer than two GPU types
  (nothing to place it against) are left out and listed on stderr.

The script of every run is NVIDIA DeepLearningExamples' ``PyTorch/Classification/ConvNets/main.py`` from
Lambda's fork (``LambdaLabsML/DeepLearningExamples``, branch ``lambda/benchmark``), launched by
``pytorch/scripts/run_benchmark_pytorch.sh`` in the NGC PyTorch container of the PyTorch build named.
"""

from __future__ import annotations

import argparse
import ast
import csv
import io
import re
import statistics
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from torchkit.hardware.catalog import load_catalog  # noqa: E402

STACK_OF_BUILD = {
    "1.13.0a0+d0d6b1f": "lambda-pt113",
    "2.3.0a0+40ec155e58.nv24.03": "lambda-pt23",
}
"""PyTorch build (``sys_pytorch.txt``) -> calibration stack (``calibration/stacks.py``)"""
CONTAINER_OF_BUILD = {
    "1.13.0a0+d0d6b1f": "NGC PyTorch 22.10 (PyTorch 1.13.0a0+d0d6b1f, CUDA 11.8.89)",
    "2.3.0a0+40ec155e58.nv24.03": "NGC PyTorch 24.03 (PyTorch 2.3.0a0+40ec155e58, CUDA 12.4.99)",
}
PRECISIONS = {"fp16": "AMP", "fp32": "FP32"}
"""Lambda's precision -> the run directory's suffix (``PyTorch_resnet50_AMP``)"""


@dataclass(frozen=True, kw_only=True)
class Run:
    directory: str
    """``results/<dir>`` or ``results_v2/<dir>``"""
    gpu: str
    build: str
    precision: str
    batch: int
    throughput: float
    table: str
    """the published csv the throughput is read from"""


def git_show(repo: Path, rev: str, path: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "show", f"{rev}:{path}"], check=True, capture_output=True, text=True
    ).stdout


def git_ls(repo: Path, rev: str, path: str) -> list[str]:
    out = subprocess.run(
        ["git", "-C", str(repo), "ls-tree", "--name-only", rev, path + "/"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.split()


def _single_systems(repo: Path, rev: str) -> dict[str, str]:
    """Display name in the v1 tables -> its run directory (``list_system_single`` of the compile script)."""
    tree = ast.parse(git_show(repo, rev, "pytorch/scripts/compile_results_pytorch.py"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "list_system_single":
            table = ast.literal_eval(node.value)
            return {entry[1]: directory for directory, entry in table.items()}
    raise SystemExit("compile_results_pytorch.py has no list_system_single")


def _sys_field(text: str, field: str) -> str:
    match = re.search(rf"^{field}: (.*)$", text, re.M)
    if not match:
        raise SystemExit(f"sys_pytorch.txt has no {field!r} line")
    return match.group(1).strip()


def _run(repo: Path, rev: str, directory: str, precision: str, throughput: float, table: str) -> Run:
    sys_text = git_show(repo, rev, f"pytorch/{directory}/sys_pytorch.txt")
    run_dir = f"pytorch/{directory}/PyTorch_resnet50_{PRECISIONS[precision]}"
    para = dict(
        line.split(maxsplit=1)
        for line in git_show(repo, rev, f"{run_dir}/benchmark.para").splitlines()
        if line.strip()
    )
    if para.get("GPU") != "1":
        raise SystemExit(f"{run_dir}: GPU {para.get('GPU')} (expected a single-GPU run)")
    log = next(p for p in git_ls(repo, rev, run_dir) if p.endswith(".txt"))
    params = next(line for line in git_show(repo, rev, log).splitlines() if "PARAMETER data :" in line)
    expected = {
        "data_backend": "synthetic",
        "memory_format": "nchw",
        "optimizer": "sgd",
        "momentum": "0.9",
        "amp": "True" if precision == "fp16" else "False",
    }
    for key, value in expected.items():
        if not re.search(rf"\b{key} : {re.escape(value)}\b", params):
            raise SystemExit(f"{log}: {key} is not {value} ({params[:200]}...)")
    return Run(
        directory=directory,
        gpu=_sys_field(sys_text, "GPU").replace("_", " "),
        build=_sys_field(sys_text, "PyTorch Version"),
        precision=precision,
        batch=int(para["GLOBAL_BATCH"]),
        throughput=throughput,
        table=table,
    )


def read_runs(repo: Path, rev: str) -> list[Run]:
    """Every single-GPU ResNet-50 run of the published tables (v1 and v2), fp16 and fp32."""
    systems = _single_systems(repo, rev)
    runs = []
    for precision in PRECISIONS:
        table = f"pytorch/pytorch-train-throughput-{precision}.csv"
        batches = {
            r["name_gpu"]: int(float(r["resnet50"]))
            for r in csv.DictReader(
                io.StringIO(git_show(repo, rev, f"pytorch/pytorch-train-bs-{precision}.csv"))
            )
        }
        for r in csv.DictReader(io.StringIO(git_show(repo, rev, table))):
            if float(r["num_gpu"]) != 1:
                continue
            run = _run(repo, rev, f"results/{systems[r['name_gpu']]}", precision, float(r["resnet50"]), table)
            if batches.get(r["name_gpu"]) != run.batch:
                raise SystemExit(f"{run.directory}: batch {run.batch}, bs table {batches.get(r['name_gpu'])}")
            runs.append(run)
        table_v2 = f"pytorch/pytorch-train-throughput-v2-{precision}.csv"
        for r in csv.DictReader(io.StringIO(git_show(repo, rev, table_v2))):
            name = r[""]
            if not re.search(r"_1x[A-Z]", name) or name.endswith("_bk"):
                continue
            runs.append(_run(repo, rev, f"results_v2/{name}", precision, float(r["resnet50"]), table_v2))
    return runs


def rows(repo: Path, rev: str) -> list[list[str]]:
    catalog = load_catalog()
    groups: dict[tuple[str, str, str], list[Run]] = defaultdict(list)
    for run in read_runs(repo, rev):
        spec = catalog.resolve(run.gpu)
        if spec is None or run.build not in STACK_OF_BUILD:
            why = "GPU not in the catalog" if spec is None else f"PyTorch {run.build}: no stack"
            print(f"left out: {run.directory} {run.precision} ({run.gpu}; {why})", file=sys.stderr)
            continue
        groups[(spec.name, run.build, run.precision)].append(run)
    builds = defaultdict(set)
    for gpu, build, _ in groups:
        builds[build].add(gpu)
    out = []
    for (gpu, build, precision), runs in sorted(
        groups.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])
    ):
        if len(builds[build]) < 2:
            print(f"left out: {gpu} {build} (the only GPU type of its build)", file=sys.stderr)
            continue
        if len({r.batch for r in runs}) != 1:
            raise SystemExit(f"{gpu} {build} {precision}: runs at batches {sorted({r.batch for r in runs})}")
        value = statistics.median(r.throughput for r in runs)
        figures = sorted(r.throughput for r in runs)
        print(
            f"{gpu} {build} {precision}: {len(runs)} runs {figures[0]:g}..{figures[-1]:g}, median {value:g}",
            file=sys.stderr,
        )
        cc8 = str(catalog.get(gpu).compute_capability) >= "8"
        ours = "fp16" if precision == "fp16" else ("tf32" if cc8 else "fp32")
        stack = STACK_OF_BUILD[build]
        tables = sorted({r.table for r in runs})
        where = "; ".join(sorted(r.directory for r in runs))
        counted = f"median of {len(runs)} single-GPU runs" if len(runs) > 1 else "1 single-GPU run"
        bs_table = (
            f" and pytorch/pytorch-train-bs-{precision}.csv"
            if any(r.directory.startswith("results/") for r in runs)
            else ""
        )
        source = (
            f"lambdal/deeplearning-benchmark@{rev[:8]} {' + '.join(tables)}, column resnet50, {counted} "
            f"({where}); batch from each run's benchmark.para{bs_table}"
        )
        software = (
            f"{CONTAINER_OF_BUILD[build]}; NVIDIA DeepLearningExamples ConvNets main.py (Lambda's fork, "
            f"branch lambda/benchmark) --data-backend synthetic, NCHW, SGD momentum 0.9"
            + (", --amp --static-loss-scale 256" if precision == "fp16" else "")
        )
        row_id = f"lambda-r50-{gpu.lower()}-{ours}-{stack.removeprefix('lambda-')}"
        out.append(
            [
                row_id,
                "resnet50",
                gpu,
                ours,
                "nchw",
                str(runs[0].batch),
                f"{value:g}",
                "sgd",
                source,
                software,
                "",
                "1",
                stack,
            ]
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", type=Path, help="a clone of lambdal/deeplearning-benchmark")
    parser.add_argument("--commit", default="HEAD", help="the revision to read (default HEAD)")
    args = parser.parse_args()
    rev = subprocess.run(
        ["git", "-C", str(args.repo), "rev-parse", args.commit], check=True, capture_output=True, text=True
    ).stdout.strip()
    writer = csv.writer(sys.stdout, lineterminator="\n")
    for row in rows(args.repo, rev):
        writer.writerow(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
