"""stdout carries only the result: while the work runs, anything written to stdout goes to stderr.

Ray's driver prints the errors its raylets report (``(raylet) A worker died or was killed ...``, in colour) on
``sys.stdout`` from a background thread, whatever ``log_to_driver`` says; a library may ``print`` too. A
``--json`` reader would then get text before the JSON. So the commands run their Ray work inside
``stdout_to_stderr()``, which points both ``sys.stdout`` and file descriptor 1 (for C/C++ code) at stderr,
and print their result after it.

The result itself can fail to arrive: stdout on a full device (``> /dev/full``), a file over its size limit.
``guarded_result_stream()`` turns such a write error into one ``error:`` line and exit 2 instead of a traceback
(or Python's "Exception ignored" at exit), and sends what is still buffered nowhere.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from planner.errors import ConfigError


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


def unusable_stdout() -> str | None:
    """Why stdout cannot carry a result (closed: ``batchplan plan >&-``), or None. Where it can, a stream whose
    encoding cannot write every character (``PYTHONIOENCODING=latin-1``: the tables' ×, σ, ±) writes an escape
    for it instead of failing; so does stderr."""
    stream = sys.stdout
    closed = (
        "stdout is closed: batchplan prints its result there (redirect it, e.g. > plan.txt or > /dev/null, "
        "rather than closing it)"
    )
    if stream is None or getattr(stream, "closed", False):
        return closed
    try:
        descriptor = stream.fileno()
    except (
        io.UnsupportedOperation,
        AttributeError,
    ):  # a stream without a descriptor (a test's): usable as it is
        descriptor = None
    except (OSError, ValueError):
        return closed
    if descriptor is not None:
        try:
            os.fstat(descriptor)
        except OSError:
            return closed
    for text_stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(text_stream, "reconfigure", None)
        if callable(reconfigure):
            with contextlib.suppress(Exception):
                reconfigure(errors="backslashreplace")
    return None


#: whether a result stream was written to in this process (``stdout_written``)
_wrote: list[bool] = [False]
#: whether the result stream's reader went away (a closed pipe) in this process (``stdout_closed_by_reader``)
_closed: list[bool] = [False]


def stdout_written() -> bool:
    """Whether anything was written (or tried) on the result stream: a second document must not follow it
    (``planner.cli.json_error``)."""
    return _wrote[0]


def stdout_closed_by_reader() -> bool:
    """Whether a write of the result met a closed pipe (``batchplan plan | head``): the reader's choice, and
    the only ``BrokenPipeError`` that ``planner.cli.main`` takes for a finished run."""
    return _closed[0]


def forget_writes() -> None:
    """A new run of ``main`` in this process (tests call it several times) starts with nothing written."""
    _wrote[0] = False
    _closed[0] = False


class _ResultStream:
    """``sys.stdout`` whose write errors (other than a closed pipe, which ``main`` treats as the reader's
    choice) are ConfigErrors naming stdout."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        if text:
            _wrote[0] = True
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            _closed[0] = True
            raise
        except OSError as exc:
            raise _discarded(exc) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            _closed[0] = True
            raise
        except OSError as exc:
            raise _discarded(exc) from None

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, buffer: the real stream's
        return getattr(self._stream, name)


def _discarded(exc: OSError) -> ConfigError:
    """The error for a failed result write; what is still buffered goes to /dev/null (a second failure at
    interpreter exit would print "Exception ignored ...")."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.__stdout__.fileno())
        os.close(devnull)
    return ConfigError(
        f"cannot write the result to stdout: {exc.strerror or exc} (free space where stdout goes, or redirect it)"
    )


@contextlib.contextmanager
def wrapped_stream(name: str, wrapper: type) -> Iterator[None]:
    """While the block runs, ``sys.<name>`` (``stdout``, ``stderr``) is the stream wrapped in ``wrapper`` (once:
    a block inside another leaves it), and the stream it was after."""
    original = getattr(sys, name)
    if original is None or isinstance(original, wrapper):
        yield
        return
    setattr(sys, name, wrapper(original))
    try:
        yield
    finally:
        if isinstance(getattr(sys, name), wrapper):
            setattr(sys, name, original)


def guarded_result_stream() -> contextlib.AbstractContextManager[None]:
    """While the block runs, write errors on stdout are one-line errors (see the module docstring)."""
    return wrapped_stream("stdout", _ResultStream)
