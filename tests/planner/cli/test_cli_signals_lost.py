"""A signal that lands in a callback Python does not let raise (an at-fork hook, a ``__del__``) is delivered
again to the run's own code (``planner.cli.signals``): CI saw SIGTERM land in logging's at-fork
``_releaseLock`` while Ray started its processes; Python printed "Exception ignored ... Terminated: SIGTERM"
and the run went on to finish with exit 0."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from planner.cli.signals import Terminated, handle_signals

    handle_signals()

    class SignalledWhileFinalised:
        def __del__(self):
            os.kill(os.getpid(), signal.{name})  # its handler runs here, inside __del__, where nothing may raise
            for _ in range(1000):
                pass

    try:
        SignalledWhileFinalised()  # finalised at once
        for _ in range(1000):  # the run goes on: the signal reaches it again within milliseconds
            time.sleep(0.01)
    except Terminated as exc:
        print("unwound by", exc.signum)
    else:
        print("went on")
""")


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_swallowed_in_a_finaliser_still_unwinds_the_run(name: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(name=name)], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == f"unwound by {int(getattr(__import__('signal'), name))}", (
        done.stdout + done.stderr
    )
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr
