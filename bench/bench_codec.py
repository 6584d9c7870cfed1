"""Is msgspec (``planner.codec``) the right library to read batchplan's documents? Issue #29 asked for a
well-kept library (pydantic v2, or msgspec) unless a measurement shows it worse here; this is the measurement:
a 65,536-rank plan (built as ``bench/bench_plan_sizes.py`` builds it, written by our codec) read back by each
reader in a fresh process, and the import time of ``planner.runtime`` (what every rank of a training job imports).

Usage: ``python bench/bench_codec.py [--ranks 65536] [--repeat 5]`` (half a minute on a loaded 2-core machine;
a minute with ``--repeat 9``). Prints a table on stdout (progress on stderr) and writes bench/results/codec.json.

Readers, each from the same bytes already in memory (reading the file is the same for all):

- ``plan_from_bytes``: planner's real read path (what ``load_plan`` and ``show`` run after reading the file; a
  rank's ``load_rank_plan`` reads only its part, by the index): the codec decodes and checks every field, then
  the ``Plan`` is constructed and its identities checked (``planner.plan.derived``);
- ``codec_decode``: decode only, msgspec through our codec (``planner.codec.decode_fields``): every field read,
  typed and checked (bounds, patterns, records), the ``Plan`` itself not constructed, so no identities;
- ``pydantic_plan`` and ``pydantic_decode``: pydantic v2 ``TypeAdapter(...).validate_json(raw, strict=True)``
  over the same frozen dataclasses, with and without the ``Plan``'s identities (pydantic calls
  ``__post_init__``). Three tweaks, here and not in the product (:func:`pydantic_types`): ``memory_fit`` is
  typed by a plain base class that only our codec resolves by its ``kind`` tag, so a ``DeviceProfile``
  subclass declares it ``AffineMemoryFit | LogLogMemoryFit`` with pydantic's ``discriminator="kind"``; the
  program-only ``Plan.advice`` (``tuple[Advice, ...]``, never in a file; ``Advice`` is no dataclass) is
  re-declared ``tuple[Any, ...]``; ``pydantic_decode``'s ``Plan`` subclass has a ``__post_init__`` that checks
  nothing. Pydantic ignores msgspec's ``Meta`` bounds and patterns and does not keep a newer writer's
  unknown keys (``Plan.extra``): it checks less, so its figure is the least it would cost. Its
  ``TypeAdapter`` is built inside the timed read (a process reading one plan pays for it; the ``setup``
  column says how much); our codec builds its decoders on first use, also inside the read;
- ``json_loads``: the standard library's ``json.loads`` to dicts and lists, typed nothing: the floor.

Each figure is the median of ``--repeat`` fresh processes, the readers taking turns round by round. Time: wall
clock and CPU time (``time.process_time``, less sensitive to the load) of the read. Memory: peak RSS
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``) after the read minus the same process's peak just before it
(after its imports and after reading the file's bytes): what the read adds. (The plan is written by a separate
process: Linux carries a parent's ``ru_maxrss`` into its children.) The 1-minute load average before
each run is printed (median, min-max): the machine is shared, so compare readers measured together, not with
figures from another run. Imports are timed in fresh interpreters, which also say whether msgspec or pydantic
came with them: ``import planner.runtime`` (its names load lazily, so it imports neither), ``from planner.runtime
import load_rank_plan`` (what a rank runs to read its plan), and ``import msgspec`` and ``from pydantic import
TypeAdapter`` (``import pydantic`` alone loads lazily) by themselves.
"""

# no ``from __future__ import annotations``: pydantic_types' classes are local, and pydantic must see their
# annotations as types, not as strings it would look up in this module's globals

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

REPO = Path(__file__).resolve().parents[1]
READERS = ("plan_from_bytes", "codec_decode", "pydantic_plan", "pydantic_decode", "json_loads")
#: what each reader's process imports before its baseline (imports are not the read)
IMPORTS = {
    "plan_from_bytes": "planner.plan.validate",
    "codec_decode": "planner.plan.types",
    "pydantic_plan": "pydantic",
    "pydantic_decode": "pydantic",
    "json_loads": "json",
}

CHILD = """
import importlib, json, os, resource, sys, time
sys.path[:0] = [{repo!r}, {bench!r}]
import bench_codec
importlib.import_module(bench_codec.IMPORTS[{name!r}])
import planner.plan.types
raw = open(sys.argv[1], "rb").read()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start, cpu = time.perf_counter(), time.process_time()
read, setup_s = bench_codec.reader({name!r})
read(raw)
wall, cpu = time.perf_counter() - start, time.process_time() - cpu
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"wall_s": wall, "cpu_s": cpu, "setup_s": setup_s, "peak_mib": (peak - base) / 1024}}))
"""


def pydantic_types() -> tuple[type, type]:
    """The plan's own dataclasses as pydantic can read them (three tweaks, the module docstring's): the
    ``Plan`` with its identities checked, and one that checks none."""
    import pydantic

    from planner.plan.types import Plan
    from planner.profiles.profile import DeviceProfile
    from torchkit.step.fit import AffineMemoryFit, LogLogMemoryFit

    @dataclass(frozen=True, kw_only=True)
    class PydanticProfile(DeviceProfile):
        memory_fit: Annotated[AffineMemoryFit | LogLogMemoryFit, pydantic.Field(discriminator="kind")]

    @dataclass(frozen=True, kw_only=True)
    class PydanticPlan(Plan):
        profiles: dict[str, PydanticProfile]
        advice: tuple[Any, ...] = field(default=())

    @dataclass(frozen=True, kw_only=True)
    class PydanticPlanUnchecked(PydanticPlan):
        def __post_init__(self) -> None:
            pass

    return PydanticPlan, PydanticPlanUnchecked


def reader(name: str) -> tuple[Any, float]:
    """``name``'s read (bytes -> its result) and the seconds its setup took (0 where it has none)."""
    import time

    if name == "plan_from_bytes":
        from planner.plan.validate import plan_from_bytes

        return lambda raw: plan_from_bytes(raw, where="bench"), 0.0
    if name == "codec_decode":
        from planner.codec import decode_fields
        from planner.plan.types import Plan

        return lambda raw: decode_fields(Plan, raw, where="bench", fix="", without=()), 0.0
    if name in ("pydantic_plan", "pydantic_decode"):
        import pydantic

        start = time.perf_counter()
        checked, unchecked = pydantic_types()
        adapter = pydantic.TypeAdapter(checked if name == "pydantic_plan" else unchecked)
        return lambda raw: adapter.validate_json(raw, strict=True), time.perf_counter() - start
    if name == "json_loads":
        return json.loads, 0.0
    raise ValueError(f"unknown reader {name!r} (known: {', '.join(READERS)})")


def write_plan_file(num_ranks: int, path: Path) -> Path:
    """A plan of ``num_ranks`` ranks as ``bench/bench_plan_sizes.py`` builds it, written by our codec."""
    sys.path[:0] = [str(REPO), str(REPO / "bench")]
    from bench_plan_sizes import profiles, slots

    from planner.job import JobSpec
    from planner.plan.build import build_plan
    from planner.plan.io import write_plan

    return write_plan(build_plan(JobSpec(model="bench"), slots(num_ranks), profiles()), path)


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def read_once(name: str, path: Path) -> dict[str, float]:
    """One read by ``name`` in a fresh process, and the load average just before it."""
    load = os.getloadavg()[0]
    code = CHILD.format(repo=str(REPO), bench=str(REPO / "bench"), name=name)
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return {**json.loads(done.stdout), "load": load}


def measure_readers(path: Path, repeat: int) -> list[dict[str, Any]]:
    """Every reader ``repeat`` times, taking turns (round by round), so a change of load hits them alike."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in READERS}
    for round_ in range(repeat):
        for name in READERS:
            runs[name].append(read_once(name, path))
            print(
                f"round {round_ + 1}/{repeat} {name}: {runs[name][-1]['wall_s']:.3f} s "
                f"(load {runs[name][-1]['load']:.1f})",
                file=sys.stderr,
                flush=True,
            )
    return [
        {"reader": name, **{key: _summary([run[key] for run in rows]) for key in rows[0]}}
        for name, rows in runs.items()
    ]


#: ``import planner.runtime`` loads its names lazily (PEP 562); a rank reading its plan imports ``load_rank_plan``
IMPORTS_TIMED = (
    "import planner.runtime",
    "from planner.runtime import load_rank_plan",
    "import msgspec",
    "from pydantic import TypeAdapter",
)
IMPORT_CHILD = """
import sys, time
sys.path.insert(0, {repo!r})
start = time.perf_counter()
{statement}
print(time.perf_counter() - start, int("msgspec" in sys.modules), int("pydantic" in sys.modules))
"""


def measure_import(statement: str, repeat: int) -> dict[str, Any]:
    """Seconds of the import ``statement`` in a fresh interpreter, and whether msgspec and pydantic came with it."""
    times, loads, pulled = [], [], set()
    for _ in range(repeat):
        loads.append(os.getloadavg()[0])
        done = subprocess.run(
            [sys.executable, "-c", IMPORT_CHILD.format(repo=str(REPO), statement=statement)],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        )
        seconds, msgspec, pydantic = done.stdout.split()
        times.append(float(seconds))
        pulled |= {lib for lib, flag in (("msgspec", msgspec), ("pydantic", pydantic)) if flag == "1"}
    return {
        "statement": statement,
        "import_s": _summary(times),
        "load": _summary(loads),
        "imports": sorted(pulled),
    }


def _range(summary: dict[str, float], digits: int) -> str:
    return f"{summary['median']:.{digits}f} ({summary['min']:.{digits}f}-{summary['max']:.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=65536)
    parser.add_argument("--repeat", type=int, default=5, help="fresh processes per figure (median)")
    parser.add_argument("--write-plan", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write_plan:
        write_plan_file(args.ranks, args.write_plan)
        return
    with tempfile.TemporaryDirectory(prefix="bench-codec-") as tmp:
        print(f"writing a {args.ranks}-rank plan", file=sys.stderr, flush=True)
        path = Path(tmp) / "plan.json"
        # in its own process: a child's ru_maxrss starts at its parent's peak (Linux keeps it across fork and
        # exec), so this process stays as small as the readers' baselines
        subprocess.run(
            [sys.executable, __file__, "--write-plan", str(path), "--ranks", str(args.ranks)], check=True
        )
        size_mb = path.stat().st_size / 1e6
        rows = measure_readers(path, args.repeat)
    print("timing imports", file=sys.stderr, flush=True)
    imports = [measure_import(statement, args.repeat) for statement in IMPORTS_TIMED]

    print(f"{args.ranks}-rank plan, {size_mb:.1f} MB; median (min-max) of {args.repeat} fresh processes")
    print(
        f"{'reader':<16} {'read s':>19} {'CPU s':>19} {'of which setup s':>19} {'peak MiB':>16} {'load 1 min':>16}"
    )
    for row in rows:
        print(
            f"{row['reader']:<16} {_range(row['wall_s'], 3):>19} {_range(row['cpu_s'], 3):>19} "
            f"{_range(row['setup_s'], 3):>19} {_range(row['peak_mib'], 0):>16} {_range(row['load'], 1):>16}"
        )
    print(f"\n{'fresh interpreter':<44} {'s':>19} {'load 1 min':>16}  imported")
    for row in imports:
        print(
            f"{row['statement']:<44} {_range(row['import_s'], 3):>19} {_range(row['load'], 1):>16}  "
            f"{', '.join(row['imports']) or '-'}"
        )
    out = REPO / "bench" / "results" / "codec.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "ranks": args.ranks,
                "plan_mb": round(size_mb, 1),
                "repeat": args.repeat,
                "readers": rows,
                "imports": imports,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
