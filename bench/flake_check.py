#!/usr/bin/env python3
"""Run the timing-sensitive tests N times under a CPU burner that holds the machine's load near a target, and
report each test's failures: a flaky test is a bug (GUIDE.md), and a loaded 2-core machine is where it shows.

    python bench/flake_check.py                     # 3 runs of `-m "dist or ray or slurm"` at load ~10
    python bench/flake_check.py --runs 5 --load 12 -- tests/planner/runtime   # other tests, other pytest args

The burner: busy-looping processes, started and stopped by a controller that reads the number of runnable
tasks (``procs_running`` in /proc/stat, the quantity the load average averages) every half second and keeps its
moving average at ``--load``, counting whatever else runs (the tests themselves, other users): on a machine
already at the target it burns nothing. The 1-minute load average is sampled throughout and reported.

Each run is the suite's own command (``python -m pytest``, so xdist as in CI) with a JUnit report; the table
lists every test that failed or errored in any run, with its count and the first line of its first failure.
Exit status 1 if any test failed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MARKERS = "dist or ray or slurm"
#: seconds between controller readings, and the weight of the newest reading in its moving average
TICK_S = 0.5
SMOOTHING = 0.1


def _runnable_tasks() -> int:
    """Tasks running or ready to run right now, on the whole machine (/proc/stat ``procs_running``)."""
    with open("/proc/stat") as handle:
        for line in handle:
            if line.startswith("procs_running"):
                return int(line.split()[1])
    raise RuntimeError("/proc/stat has no procs_running line (Linux only)")


class Burner:
    """Busy processes added or removed so that the average number of runnable tasks stays near ``target``."""

    def __init__(self, target: float, max_burners: int) -> None:
        self.target = target
        self.max_burners = max_burners
        self.burners: list[subprocess.Popen] = []
        self.loads: list[float] = []  # 1-minute load average, sampled every few seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._control, daemon=True)

    def __enter__(self) -> Burner:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        while self.burners:
            self._remove()

    def _add(self) -> None:
        self.burners.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))

    def _remove(self) -> None:
        burner = self.burners.pop()
        burner.terminate()
        burner.wait()

    def _control(self) -> None:
        average = float(_runnable_tasks())
        ticks = 0
        while not self._stop.wait(TICK_S):
            # procs_running counts this controller's own reading too: one task less is what others run
            average += SMOOTHING * (max(0, _runnable_tasks() - 1) - average)
            if average < self.target - 0.5 and len(self.burners) < self.max_burners:
                self._add()
                average += 1.0
            elif average > self.target + 0.5 and self.burners:
                self._remove()
                average -= 1.0
            ticks += 1
            if ticks % 10 == 0:
                self.loads.append(os.getloadavg()[0])


def _run_pytest(pytest_args: list[str], junit: Path, log: Path) -> tuple[int, float]:
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        f"--junitxml={junit}",
        *pytest_args,
    ]
    start = time.monotonic()
    with log.open("w") as out:
        code = subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT).returncode
    return code, time.monotonic() - start


def _outcomes(junit: Path) -> dict[str, str | None]:
    """test id -> None if it passed (or skipped), else the first line of its failure."""
    outcomes: dict[str, str | None] = {}
    if not junit.exists():
        return outcomes
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is None:
            outcomes[name] = None
        else:
            message = (problem.get("message") or problem.text or "").strip().splitlines()
            outcomes[name] = message[0][:160] if message else "(no message)"
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="how many times to run the tests (default 3)")
    parser.add_argument("--load", type=float, default=10.0, help="load to hold (runnable tasks; default 10)")
    parser.add_argument("--max-burners", type=int, default=16, help="most burner processes (default 16)")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs' logs and JUnit files here")
    parser.add_argument(
        "pytest_args", nargs="*", help=f'after --: pytest arguments (default: -m "{DEFAULT_MARKERS}")'
    )
    args = parser.parse_args(argv)
    pytest_args = args.pytest_args or ["-m", DEFAULT_MARKERS]
    out = args.out or Path(tempfile.mkdtemp(prefix="flake-check-"))
    out.mkdir(parents=True, exist_ok=True)

    failures: dict[str, list[tuple[int, str]]] = defaultdict(list)
    seen: set[str] = set()
    durations: list[float] = []
    codes: list[int] = []
    with Burner(args.load, args.max_burners) as burner:
        for run in range(1, args.runs + 1):
            junit, log = out / f"run{run}.xml", out / f"run{run}.log"
            code, seconds = _run_pytest(pytest_args, junit, log)
            codes.append(code)
            durations.append(seconds)
            outcomes = _outcomes(junit)
            seen |= set(outcomes)
            for name, problem in outcomes.items():
                if problem is not None:
                    failures[name].append((run, problem))
            failed = sum(1 for p in outcomes.values() if p is not None)
            print(
                f"run {run}/{args.runs}: pytest exit {code}, {len(outcomes)} tests, {failed} failed, "
                f"{seconds / 60:.1f} min (log {log})",
                flush=True,
            )
        loads = burner.loads

    print(f"\npytest {' '.join(pytest_args)}: {args.runs} runs, {len(seen)} tests")
    if loads:
        print(
            f"1-minute load average during the runs: mean {statistics.mean(loads):.1f}, min {min(loads):.1f}, "
            f"max {max(loads):.1f} ({len(loads)} samples; target {args.load:g} on {os.cpu_count()} cores)"
        )
    print(f"minutes per run: {', '.join(f'{d / 60:.1f}' for d in durations)}")
    if not failures:
        ok = all(c == 0 for c in codes)
        print(
            "failures: none"
            + ("" if ok else f" in the JUnit reports, but pytest exited {codes}: see the logs")
        )
        return 0 if ok else 1
    print(f"{'failed':>6}  test (first failure)")
    for name, problems in sorted(failures.items(), key=lambda item: -len(item[1])):
        print(f"{len(problems):>3}/{args.runs}  {name}\n         run {problems[0][0]}: {problems[0][1]}")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
