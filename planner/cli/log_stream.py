"""stderr carries the logs, and a log reader that goes away must not change the result.

A scheduler script may pipe the log and stop reading it (``batchplan plan ... 2>&1 | head -3``). The next
progress line then raises ``BrokenPipeError`` long before the plan exists; left to propagate, it ended the run
with the previous ``plan.json`` still in place (and, taken for "the reader of the result went away", exit 0).
``guarded_log_stream()`` makes a closed stderr what it is for the run, nobody listening: the line and every
later one are dropped, file descriptor 2 is pointed at ``/dev/null`` (Ray's C++ code and the processes started
after it write there), and the work goes on to write its plan and exit as it would have. One thing cannot be
dropped: the result on stdout, which may be the same pipe (``2>&1``); ``planner.cli.stdout_guard`` and
``planner.cli.main`` decide what a closed stdout means.
"""

from __future__ import annotations

import contextlib
import errno
import os
from typing import Any, TextIO


class _LogStream:
    """``sys.stderr`` that stops writing, silently, once its reader has gone (a closed pipe)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.closed_by_reader = False

    def write(self, text: str) -> int:
        if not self.closed_by_reader:
            try:
                return self._stream.write(text)
            except OSError as exc:
                self._gone(exc)
        return len(text)

    def flush(self) -> None:
        if not self.closed_by_reader:
            try:
                self._stream.flush()
            except OSError as exc:
                self._gone(exc)

    def _gone(self, exc: OSError) -> None:
        """A closed pipe is the reader's choice: stop writing; any other write error is raised."""
        if not isinstance(exc, BrokenPipeError) and exc.errno != errno.EPIPE:
            raise exc
        self.closed_by_reader = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            descriptor = self._stream.fileno()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, descriptor)  # what is still buffered, and C-level writers, go nowhere
            os.close(devnull)
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()  # now into /dev/null: nothing left to fail at interpreter exit

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, buffer: the real stream's
        return getattr(self._stream, name)


def guarded_log_stream() -> contextlib.AbstractContextManager[None]:
    """While the block runs, a closed stderr drops the logs instead of stopping the run (module docstring)."""
    from planner.cli.stdout_guard import wrapped_stream

    return wrapped_stream("stderr", _LogStream)
