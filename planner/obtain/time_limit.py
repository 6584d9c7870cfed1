"""A time limit on user code (``--model package.module:factory``): importing the module and building the model.

A factory that hangs (a network call, a lock, ``time.sleep(10**6)``) would hold the run forever in the driver,
which builds the model for the profile key, and in each probe. ``user_code_time_limit`` arms a real-time timer
(``SIGALRM``) around it; when it fires, the user's code is interrupted by an exception it cannot catch with
``except Exception`` and the block ends in a ``WorkloadError`` naming the model, the limit and the option that
sets it (``--user-code-timeout``; default ``planner.job.DEFAULT_USER_CODE_TIMEOUT_S``).

Known limitations: only the main thread of a process can take signals, so elsewhere (a Ray actor run off the
main thread) the block runs without this limit and the probe's own timeouts (``--profile-timeout``) apply;
code that never returns to the interpreter (a C extension's loop) is interrupted only when it does.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from torchkit.errors import WorkloadError


class _OutOfTime(BaseException):
    """Raised into the user's code when the timer fires (a BaseException: ``except Exception`` lets it pass)."""


@contextlib.contextmanager
def user_code_time_limit(seconds: float, model: str) -> Iterator[None]:
    """Run the block for at most ``seconds``; past that, a WorkloadError (see the module docstring)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def out_of_time(signum, frame) -> None:
        raise _OutOfTime

    previous = signal.signal(signal.SIGALRM, out_of_time)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _OutOfTime:
        raise WorkloadError(
            f"model {model!r}: importing and building it took more than {seconds:g} s, the user-code time limit "
            "(does the factory wait on something? raise --user-code-timeout if it really needs longer)"
        ) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
