"""A watchdog that stops the Ray processes a planning run started when the run dies without stopping them.

``ray_session`` stops everything it starts on a normal exit, an exception, Ctrl-C and SIGTERM. A SIGKILL (or
the OOM killer) runs no handler, and Ray's raylets, GCS, dashboard and runtime-env agents then live on. So
before it starts Ray, the session starts this watchdog, a small separate process, and marks its own
environment with a fresh token (``BATCHPLAN_RAY_SESSION``) that every Ray process it starts inherits. The
watchdog blocks reading a pipe from the session:

- the session ends (normally, on an exception, Ctrl-C or SIGTERM): after Ray's own shutdown it writes
  ``sweep`` and waits while the watchdog terminates whatever still carries the token (a head that was being
  started when the signal came, a worker a raylet spawned while stopping), then exits;
- the session dies: the pipe reaches end-of-file, and the watchdog does the same on its own.

Either way every process carrying the token is terminated (SIGTERM, then SIGKILL after ``GRACE_S``), and the
sweep goes on until none has been seen for ``QUIET_S`` (a raylet stopped mid-start spawns its agents a moment
later), so that when the run says everything was stopped, it was.

Only processes with this run's token are ever signalled, so other Ray clusters on the machine (another
user's, another run's) are never touched. The watchdog runs in its own session, so a Ctrl-C meant for the
planner does not stop it before the planner's own teardown is done, and with an isolated import path
(``python -I`` on this file: no working directory, no ``PYTHONPATH``, standard library and psutil only), so
a ``uuid.py`` or ``signal.py`` where the user runs batchplan cannot replace what it imports.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

SESSION_ENV = "BATCHPLAN_RAY_SESSION"
#: seconds between SIGTERM and SIGKILL for an orphaned Ray process (Ray's own shutdown waits about as long)
GRACE_S = 3.0
#: seconds the machine must show no process of the session, scanned every ``SCAN_INTERVAL_S``, before a sweep
#: that signalled anything ends: a raylet stopped in the middle of its start-up spawns its agents
#: (ray::DashboardAgent, ray::RuntimeEnvAgent) while it is being stopped, and one freshly forked may not yet show
#: its environment; a sweep that ended at its first empty scan left them alive for 20-63 s (3 runs in 22)
QUIET_S = 2.0
SCAN_INTERVAL_S = 0.25
#: the longest a sweep may take: a raylet that keeps spawning is signalled again until then
MAX_SWEEP_S = 30.0
_SWEEP = b"sweep\n"
#: seconds the session waits for the sweep
SWEEP_WAIT_S = MAX_SWEEP_S + GRACE_S + 10.0


@contextlib.contextmanager
def ray_watchdog() -> Iterator[str]:
    """Mark this process's environment with a fresh token and watch it until the block ends; yields the token."""
    token = uuid.uuid4().hex
    previous = os.environ.get(SESSION_ENV)
    env = {k: v for k, v in os.environ.items() if k != SESSION_ENV}
    watchdog = subprocess.Popen(
        [sys.executable, "-I", os.path.abspath(__file__), token],  # isolated: see the module docstring
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
        close_fds=True,
    )
    os.environ[SESSION_ENV] = token
    try:
        yield token
    finally:
        if previous is None:
            os.environ.pop(SESSION_ENV, None)
        else:
            os.environ[SESSION_ENV] = previous
        with contextlib.suppress(OSError):
            watchdog.stdin.write(_SWEEP)
            watchdog.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):  # a second Ctrl-C here leaves it to finish alone
            watchdog.wait(timeout=SWEEP_WAIT_S)


def stop_session_processes(
    token: str, *, grace_s: float = GRACE_S, quiet_s: float = QUIET_S, max_sweep_s: float = MAX_SWEEP_S
) -> int:
    """Terminate every process whose environment carries ``token``, and every child of one, until none has been
    seen for ``quiet_s`` (at most ``max_sweep_s``); returns how many were signalled."""
    import psutil

    signalled: set[int] = set()
    deadline = time.monotonic() + max_sweep_s
    quiet_since = time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - quiet_since < quiet_s:
        found = _with_token(psutil, token, signalled)
        if not found and not signalled:  # Ray's own shutdown stopped everything: the usual end, at once
            break
        if not found:
            time.sleep(SCAN_INTERVAL_S)
            continue
        for proc in found:
            with contextlib.suppress(psutil.Error):
                proc.terminate()
        _, alive = psutil.wait_procs(found, timeout=grace_s)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        signalled.update(proc.pid for proc in found)
        quiet_since = time.monotonic()
    return len(signalled)


def _with_token(psutil, token: str, parents: set[int]) -> list:
    """Live processes carrying ``token``, and children of ``parents`` (what the sweep signalled already: a
    raylet's agent forked but not yet readable is still its child)."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        with contextlib.suppress(psutil.Error):
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            ours = proc.ppid() in parents
            if not ours:
                with contextlib.suppress(psutil.Error):
                    ours = proc.environ().get(SESSION_ENV) == token
            if ours:
                found.append(proc)
    return found


def main(argv: list[str]) -> int:
    [token] = argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    line = sys.stdin.buffer.readline()  # blocks until the session asks for the sweep, or dies (end of file)
    if line != _SWEEP:
        time.sleep(0.5)  # let a dying session's own fate-sharing children go first
    count = stop_session_processes(token)
    if count and line != _SWEEP:
        sys.stderr.write(f"batchplan: the planner died; stopped {count} Ray process(es) it had started\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
