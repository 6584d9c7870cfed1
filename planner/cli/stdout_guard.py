"""stdout carries only the result: while the work runs, anything written to stdout goes to stderr.

Ray's driver prints the errors its raylets report (``(raylet) A worker died or was killed ...``, in colour) on
``sys.stdout`` from a background thread, whatever ``log_to_driver`` says; a library may ``print`` too. A
``--json`` reader would then get text before the JSON. So the commands run their Ray work inside
``stdout_to_stderr()``, which points both ``sys.stdout`` and file descriptor 1 (for C/C++ code) at stderr,
and print their result after it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send everything written to stdout (Python or file descriptor 1) to stderr until the block ends."""
    original = sys.stdout
    original.flush()
    saved_fd = os.dup(1)
    try:
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        yield
    finally:
        sys.stdout = original
        # text a thread wrote to the original object while fd 1 pointed at stderr belongs to stderr too
        with contextlib.suppress(OSError, ValueError):
            original.flush()
        os.dup2(saved_fd, 1)
        os.close(saved_fd)
