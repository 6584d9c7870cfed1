"""What a test costs, measured so that a loaded machine does not change the verdict (tests/conftest.py).

A test without a cost marker (``slow``, ``dist``, ``ray``, ``slurm``, a library's name: every marker
registered in pyproject.toml) must stay cheap: at most :data:`BUDGET_S` seconds, setup and teardown included.
Wall-clock time alone would flag cheap tests on a machine at load 10 (a process gets a fifth of a core there),
so two figures are checked, each robust to load in its own way:

- **CPU seconds** of this process (every thread). Load changes how long the work waits for a core, not how
  much CPU it needs. Children's CPU is not counted here: a process is billed to whichever test happens to reap
  it (``subprocess`` reaps earlier tests' finished processes when it starts a new one).
- **active seconds**: wall time minus the time this process's threads spent runnable but waiting for a core
  (the kernel's per-thread ``run_delay``, ``/proc/self/task/*/schedstat``, summed: a test whose main thread
  waits for torch's worker threads waits for their cores too). That is about what the test would take on an
  idle machine: its own CPU, its sleeps, its waits on children. A child's own wait for a core is not visible
  here, so for a test that ran children this figure is held against the budget times the load per core
  (1-minute load average over the number of cores, at least 1).

A test is over budget when either figure is. On an idle machine both reduce to "the test took more than 2 s".
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import asdict, dataclass

#: seconds an unmarked test may take (CPU, or active time at load 1 per core)
BUDGET_S = 2.0
#: children's CPU seconds below which a test is taken to have run none (a shell's ``true`` costs milliseconds)
CHILDREN_NOISE_S = 0.05


def _run_delay_s() -> float:
    """Seconds this process's threads have spent runnable but not running, summed over the threads alive now (0
    where the kernel does not say)."""
    total = 0
    for task in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ():
        try:
            with open(f"/proc/self/task/{task}/schedstat") as handle:
                total += int(handle.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9


@dataclass(frozen=True)
class Snapshot:
    wall_s: float
    cpu_self_s: float
    cpu_children_s: float
    run_delay_s: float

    @classmethod
    def now(cls) -> Snapshot:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return cls(
            wall_s=time.monotonic(),
            cpu_self_s=time.process_time(),
            cpu_children_s=children.ru_utime + children.ru_stime,
            run_delay_s=_run_delay_s(),
        )


@dataclass(frozen=True)
class Cost:
    """One test's figures (JSON-able: it travels from an xdist worker in the report's user_properties)."""

    wall_s: float
    cpu_s: float
    """this process's CPU seconds"""
    active_s: float
    load_per_core: float
    children_cpu_s: float
    """CPU seconds of the children reaped meanwhile (tells whether the test ran any, not what they cost it)"""

    @classmethod
    def between(cls, start: Snapshot, end: Snapshot) -> Cost:
        wall = end.wall_s - start.wall_s
        waited = max(0.0, end.run_delay_s - start.run_delay_s)
        return cls(
            wall_s=wall,
            cpu_s=end.cpu_self_s - start.cpu_self_s,
            active_s=max(0.0, wall - waited),
            load_per_core=os.getloadavg()[0] / (os.cpu_count() or 1),
            children_cpu_s=end.cpu_children_s - start.cpu_children_s,
        )

    def over_budget(self, budget_s: float = BUDGET_S) -> str | None:
        """Why this cost is over ``budget_s``, or None."""
        if self.cpu_s > budget_s:
            return f"{self.cpu_s:.1f} s of CPU"
        if self.children_cpu_s <= CHILDREN_NOISE_S:
            if self.active_s > budget_s:
                return f"{self.active_s:.1f} s active"
            return None
        allowed = budget_s * max(1.0, self.load_per_core)
        if self.active_s > allowed:
            return (
                f"{self.active_s:.1f} s active with subprocesses (allowed {allowed:.1f} s at load "
                f"{self.load_per_core:.1f} per core)"
            )
        return None

    def to_json(self) -> dict:
        return asdict(self)
