"""Which library reads batchplan's documents: a 65,536-rank plan read into its records by each candidate, in
a fresh process each (wall and CPU time, peak memory), and the import time of ``planner.runtime``.

Usage: ``python bench/bench_codec.py [--ranks 65536] [--repeat 3]``. Prints one line per reader,
``reader=R wall_s=W cpu_s=C peak_mib=M`` (medians over ``--repeat`` fresh processes; peak: ``ru_maxrss``),
then ``import_planner_runtime_s=I``, and writes bench/results/codec.json.

Readers, each from the file's bytes:

- ``msgspec``: ``planner.codec.decode`` of the whole ``Plan`` (what ``show`` and ``load_plan`` run): every
  record typed and checked, the plan's identities included (``planner.plan.derived``);
- ``msgspec_bulk`` and ``pydantic_bulk``: the same library task for each, the whole file parsed and its bulk
  (the 65,536 ``RankEntry`` and 8,192 ``NodeEntry`` records, the plan's own dataclasses) typed, the rest
  skipped: ``msgspec.json.decode`` and pydantic v2's ``TypeAdapter(...).validate_json(strict=True)`` (when
  pydantic is installed: ``ray[train]`` brings it with the test extra). Pydantic cannot see the bounds and
  patterns (msgspec ``Meta``), so its figure is the least it would cost;
- ``json``: the standard library's ``json.loads`` to dicts and lists, typed nothing: the old reader's first step.

The timings are wall-clock on whatever load the machine has (the load average is printed); compare the readers
with each other, measured together, not with figures from another run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

_BULK = ("from typing import TypedDict\nfrom planner.plan.types import NodeEntry, RankEntry\n"
         "class Bulk(TypedDict, total=False):\n    ranks: tuple[RankEntry, ...]\n    nodes: tuple[NodeEntry, ...]\n")
READERS = {
    "msgspec": "from planner.plan.validate import plan_from_bytes\nplan_from_bytes(raw, where='bench')",
    "msgspec_bulk": _BULK + "import msgspec\nmsgspec.json.decode(raw, type=Bulk)",
    "pydantic_bulk": _BULK + "import pydantic\npydantic.TypeAdapter(Bulk).validate_json(raw, strict=True)",
    "json": "import json\njson.loads(raw)",
}

CHILD = """
import resource, sys, time
raw = open(sys.argv[1], "rb").read()
wall, cpu = time.perf_counter(), time.process_time()
{code}
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
print(wall, cpu, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def write_plan_file(num_ranks: int, where: Path) -> Path:
    sys.path.insert(0, str(REPO / "bench"))
    from bench_plan_sizes import profiles, slots

    from planner.job import JobSpec
    from planner.plan.build import build_plan
    from planner.plan.io import write_plan

    return write_plan(build_plan(JobSpec(model="bench"), slots(num_ranks), profiles()), where / "plan.json")


def run_reader(name: str, path: Path, repeat: int) -> dict | None:
    runs = []
    for _ in range(repeat):
        done = subprocess.run([sys.executable, "-c", CHILD.format(code=READERS[name]), str(path)], capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
        if done.returncode != 0:
            if "No module named 'pydantic'" in done.stderr:
                return None
            raise RuntimeError(f"{name}: {done.stderr.strip().splitlines()[-1]}")
        runs.append([float(v) for v in done.stdout.split()])
    wall, cpu, peak = (statistics.median(r[i] for r in runs) for i in range(3))
    return {"reader": name, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "peak_mib": round(peak)}


def import_time_s(repeat: int) -> float:
    code = "import time; t = time.perf_counter(); import planner.runtime; print(time.perf_counter() - t)"
    times = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
                                  env={**os.environ, "PYTHONPATH": str(REPO)}).stdout) for _ in range(repeat)]
    return round(statistics.median(times), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=65536)
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per reader (median)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-codec-") as tmp:
        path = write_plan_file(args.ranks, Path(tmp))
        print(f"plan: {args.ranks} ranks, {path.stat().st_size / 1e6:.1f} MB", flush=True)
        for name in READERS:
            row = run_reader(name, path, args.repeat)
            if row is None:
                print(f"reader={name} skipped (not installed)", flush=True)
                continue
            rows.append(row)
            print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    runtime_s = import_time_s(args.repeat)
    load = os.getloadavg()[0]
    print(f"import_planner_runtime_s={runtime_s} load_average_1min={load:.1f}")
    out = REPO / "bench" / "results" / "codec.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"ranks": args.ranks, "rows": rows, "import_planner_runtime_s": runtime_s,
                               "load_average_1min": load}, indent=2))


if __name__ == "__main__":
    main()
