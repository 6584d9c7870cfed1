"""SIGTERM handled as Ctrl-C is: the signal becomes an exception in the main thread, so every ``with`` block
and ``finally`` on the way out runs (Ray clusters, probes and temporary files this run started are
stopped), and ``main`` prints one line and exits with 128 + the signal number, as a shell reports a process
ended by that signal (130 for Ctrl-C, 143 for SIGTERM).

A scheduler that cancels a job with SIGTERM (Slurm, Kubernetes, systemd) thus gets the same clean teardown
as a user pressing Ctrl-C. A signal that arrives while Python runs a callback whose exceptions it cannot
propagate (an at-fork hook such as logging's ``_releaseLock`` while Ray starts its processes, a finalizer) would
be lost there: Python prints "Exception ignored in ..." with a traceback and the run went on to finish with 0.
It is delivered again instead (:func:`_deliver_again`), to the main thread's ordinary code. Ray's ``ray.init`` replaces the SIGTERM handler with one that calls
``sys.exit(15)``; ``planner`` puts this one back after connecting (``restore_sigterm_handler``).
"""

from __future__ import annotations

import os
import signal
import sys
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
    (:func:`raised_by_code`). A signal whose exception Python swallowed is delivered again (:func:`_deliver_again`)."""
    if threading.current_thread() is threading.main_thread():
        _received.clear()
        signal.signal(signal.SIGTERM, _raise_terminated)
        signal.signal(signal.SIGINT, _raise_interrupted)
        if getattr(sys.unraisablehook, "__name__", "") != _deliver_again.__name__:
            _deliver_again.previous = sys.unraisablehook  # type: ignore[attr-defined]
            sys.unraisablehook = _deliver_again


def _deliver_again(unraisable: object) -> None:
    """``sys.unraisablehook``: a :class:`Terminated` that one of our handlers raised inside a callback Python does
    not let raise (at-fork hooks, ``__del__``, weakref callbacks) is not reported as "Exception ignored" but sent
    again to this process from another thread, after this hook has returned: the handler runs once more in the
    main thread's own code, where the exception unwinds the run as it should (sent from here, the handler would
    run inside this hook and be swallowed again; should the thread still be early, the same happens once more).
    Anything else goes to the hook that was there before."""
    exc = getattr(unraisable, "exc_value", None)
    if isinstance(exc, Terminated) and threading.current_thread() is threading.main_thread():
        if exc.signum == signal.SIGTERM:
            signal.signal(signal.SIGTERM, _raise_terminated)  # its handler had set SIG_IGN before raising
        hook_done = threading.Event()
        threading.Thread(
            target=_send_when_set, args=(hook_done, exc.signum), name="batchplan-signal-again", daemon=True
        ).start()
        hook_done.set()  # the thread (which needs the GIL this thread holds) sends it from here on
        return
    _deliver_again.previous(unraisable)  # type: ignore[attr-defined]


_deliver_again.previous = sys.unraisablehook  # type: ignore[attr-defined]


def _send_when_set(hook_done: threading.Event, signum: int) -> None:
    hook_done.wait()
    os.kill(os.getpid(), signum)


def raised_by_code(exc: KeyboardInterrupt) -> bool:
    """Whether ``exc`` was raised by code (a model factory's ``raise KeyboardInterrupt``) rather than by a
    signal this process received: a Ctrl-C reported for it would send the user looking for a key they never
    pressed."""
    return not isinstance(exc, Terminated) and not _received


def exit_code_and_line(exc: KeyboardInterrupt) -> tuple[int, str]:
    """What ``main`` prints and returns for an interrupt: Ctrl-C or a Terminated signal."""
    signum = getattr(exc, "signum", None) or (_received[0] if _received else signal.SIGINT)
    what = (
        "interrupted (Ctrl-C)" if signum == signal.SIGINT else f"terminated ({signal.Signals(signum).name})"
    )
    return 128 + signum, f"error: {what}; everything this run started was stopped (run it again to plan)"
