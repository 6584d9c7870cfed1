"""SIGTERM handled as Ctrl-C is: the signal becomes an exception in the main thread, so every ``with`` block
and ``finally`` on the way out runs (Ray clusters, probes and temporary files this run started are
stopped), and ``main`` prints one line and exits with 128 + the signal number, as a shell reports a process
ended by that signal (130 for Ctrl-C, 143 for SIGTERM).

A scheduler that cancels a job with SIGTERM (Slurm, Kubernetes, systemd) thus gets the same clean teardown
as a user pressing Ctrl-C. Ray's ``ray.init`` replaces the SIGTERM handler with one that calls
``sys.exit(15)``; ``planner`` puts this one back after connecting (``restore_sigterm_handler``).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType


class Terminated(KeyboardInterrupt):
    """The process was asked to stop by ``signum`` (a KeyboardInterrupt, so teardown paths treat it the same)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


#: the signal that ended the run; kept apart from the exception because Ray, when the signal arrives inside
#: one of its blocking calls, re-raises it as a plain KeyboardInterrupt
_received: list[int] = []


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    # one teardown at a time: a second SIGTERM while stopping must not abort the teardown half-way
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _received.append(signum)
    raise Terminated(signum)


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    raise Terminated(signum)


def handle_signals() -> None:
    """Install the SIGTERM handler, and a SIGINT handler that records the Ctrl-C before raising it as Python's
    does (main thread only, as Python requires): a KeyboardInterrupt that no signal preceded was raised by code
    (:func:`raised_by_code`)."""
    if threading.current_thread() is threading.main_thread():
        _received.clear()
        signal.signal(signal.SIGTERM, _raise_terminated)
        signal.signal(signal.SIGINT, _raise_interrupted)


def raised_by_code(exc: KeyboardInterrupt) -> bool:
    """Whether ``exc`` was raised by code (a model factory's ``raise KeyboardInterrupt``) rather than by a
    signal this process received: a Ctrl-C reported for it would send the user looking for a key they never
    pressed."""
    return not isinstance(exc, Terminated) and not _received


def exit_code_and_line(exc: KeyboardInterrupt) -> tuple[int, str]:
    """What ``main`` prints and returns for an interrupt: Ctrl-C or a Terminated signal."""
    signum = getattr(exc, "signum", None) or (_received[0] if _received else signal.SIGINT)
    what = "interrupted (Ctrl-C)" if signum == signal.SIGINT else f"terminated ({signal.Signals(signum).name})"
    return 128 + signum, f"error: {what}; everything this run started was stopped (run it again to plan)"
