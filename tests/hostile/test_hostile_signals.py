"""Signals at any moment of a local Ray cluster's start-up, and a working directory that shadows the modules the
watchdog imports: every process a run started is stopped, counted over all runs (each run has its own
``RAY_TMPDIR``, so its processes are recognised by that and nothing else; see test_hostile_processes.py).

The moments are drawn from a seeded generator over the first seconds of a run, where the head, the raylets
and the driver's connection are being started; on a loaded machine a late moment may fall after start-up, in
the profiling, which must end as cleanly. Run time: 20 runs of a few seconds each (Ray start cut short).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.hostile.test_hostile_processes import Run
from tests.planner.cli_helpers import describe

pytestmark = [pytest.mark.slow, pytest.mark.ray]

#: how many runs get a signal, and the window (seconds after the run's first stderr line, "starting a local Ray
#: cluster") the moments are drawn from: the start of a one-raylet simulated cluster takes 3-12 s here
NUM_SIGNAL_RUNS = 20
WINDOW_S = (0.0, 8.0)
SEED = 25
#: seconds a signalled run may take to stop (Ray's shutdown, then the watchdog's sweep)
STOP_TIMEOUT_S = 90.0
#: seconds after a run's exit by which none of its processes may be left (issue #34: the line says everything was
#: stopped, so it must be; the run waits for the watchdog's sweep before it exits, so this is slack for a loaded
#: machine's process table, not for the sweep)
LEFT_AFTER_EXIT_S = 10.0

#: modules of the standard library the watchdog imports, shadowed in the working directory: each leaves a mark
SHADOWED = ("uuid", "signal", "subprocess", "contextlib")
SHADOW = """
import os
open(os.path.join(os.environ["HOSTILE_MARKS"], "SHADOWED-{name}-" + str(os.getpid())), "w").close()
raise ImportError("the {name}.py of the working directory was imported instead of the standard library")
"""


def _plan_args() -> tuple[str, ...]:
    return (
        "plan",
        "--cluster",
        "three.yaml",
        "--model",
        "resnet18",
        "--imgsz",
        "32",
        "--no-cache",
        "--no-write",
    )


class _Watched:
    """A Run whose stderr is read as it comes, so that the moment of a signal can follow its first line."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.lines: list[str] = []
        self.started = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.run.proc.stderr:
            self.lines.append(line)
            self.started.set()
        self.started.set()

    def finish(self, timeout_s: float) -> subprocess.CompletedProcess[str]:
        self.run.proc.wait(timeout=timeout_s)
        self.reader.join(timeout=10)
        out = self.run.proc.stdout.read()
        return subprocess.CompletedProcess(
            self.run.proc.args, self.run.proc.returncode, out, "".join(self.lines)
        )


def test_sigint_and_sigterm_at_random_moments_of_start_up_leave_nothing_running(tmp_path) -> None:
    """The moment is drawn after the run's first stderr line (batchplan is running its own code by then:
    a signal during the interpreter's start-up is Python's, not ours)."""
    rng = random.Random(SEED)
    left: dict[str, list[str]] = {}
    outcomes = []
    runs = []
    dumps = 0
    try:
        for i in range(NUM_SIGNAL_RUNS):
            signum = (signal.SIGINT, signal.SIGTERM)[i % 2]
            delay_s = rng.uniform(*WINDOW_S)
            where = tmp_path / f"run{i}"
            where.mkdir()
            run = Run(where, *_plan_args(), hang=False, shadow_json=False)
            runs.append(run)
            watched = _Watched(run)
            assert watched.started.wait(timeout=120), "the run printed nothing in 120 s"
            time.sleep(delay_s)
            if run.proc.poll() is None:
                run.proc.send_signal(signum)
            result = watched.finish(timeout_s=STOP_TIMEOUT_S)
            outcomes.append((signal.Signals(signum).name, round(delay_s, 2), result.returncode))
            assert result.returncode in (0, 128 + signum), describe(result)
            assert "Traceback" not in result.stderr, describe(result)
            if result.returncode:
                assert result.stderr.strip().splitlines()[-1].startswith("error: "), describe(result)
            # Known limitation: a SIGTERM that lands on one of Ray's own threads while its core worker starts
            # is seen by Ray's C++ handler first, which prints a stack dump before ours runs (once in 20 runs);
            # the exit code, the one error line and the teardown are still ours. Counted, not failed.
            dumps += "*** SIGTERM received" in result.stderr
            remaining = run.wait_until_no_ray_processes(LEFT_AFTER_EXIT_S)
            if remaining:
                left[f"run {i} ({signal.Signals(signum).name} at {delay_s:.1f} s)"] = remaining
            run.cleanup()
    finally:
        for run in runs:
            run.cleanup()
    assert left == {}, (left, outcomes)
    assert dumps <= NUM_SIGNAL_RUNS // 4, (dumps, outcomes)
    assert any(code != 0 for _, _, code in outcomes), outcomes  # some signal did land during the run


def test_modules_in_the_working_directory_cannot_disarm_the_watchdog(tmp_path) -> None:
    run = Run(tmp_path, *_plan_args(), hang=False, shadow_json=False)
    for name in SHADOWED:
        (run.cwd / f"{name}.py").write_text(SHADOW.format(name=name))
    try:
        deadline = time.monotonic() + 120
        while not any("raylet" in " ".join(p.cmdline()) for p in run.ray_processes()):
            assert run.proc.poll() is None and time.monotonic() < deadline, describe(run.finish())
            time.sleep(0.2)
        run.proc.kill()  # SIGKILL: only the watchdog can stop what it started
        run.proc.communicate()
        assert run.wait_until_no_ray_processes(LEFT_AFTER_EXIT_S) == []
        assert sorted(p.name for p in Path(run.marks).glob("SHADOWED-*")) == []
    finally:
        run.cleanup()
    assert os.path.isdir(run.marks)
