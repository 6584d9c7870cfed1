"""``batchplan`` run in the test's own process: ``planner.cli.main.main(argv)`` with its stdout, stderr and exit
code captured, and every piece of process-wide state it touches put back afterwards.

Starting ``python -m planner.cli.main`` costs a few seconds of imports (torch) per call on a loaded 2-core
machine; calling ``main`` here costs nothing beyond the work. What a real process would differ in is
emulated, so a test reads the same ``stdout``/``stderr``/``returncode`` either way:

- **output**: file descriptors 1 and 2 are pipes while ``main`` runs (``main`` itself moves fd 1 to fd 2
  around Ray work, ``planner.cli.stdout_guard``), and ``sys.stdout``/``sys.stderr`` are fresh text streams on
  them (stdout block-buffered, stderr line-buffered, as in a process whose output is a pipe);
- **exit code**: ``main``'s return value, a ``SystemExit``'s code (argparse, ``--help``, ``--version``), or
  1 with the traceback on stderr for an exception that would have ended the process;
- **environment and working directory**: the run's own (``cwd``, ``env``), the test's put back after;
  ``sys.path`` gets the working directory first (what ``python -m`` does), and modules the run imported from
  outside the repository and the installed packages (a user's ``--model mymodule:build`` in a tmp_path) are
  forgotten again, so the next run imports the file as it then is;
- **logging**: the root logger starts without handlers, so ``main``'s ``logging.basicConfig`` writes to
  the captured stderr as in a fresh process; pytest's handlers and the level come back after;
- **signals**: the SIGINT/SIGTERM/SIGALRM handlers, the signal mask and the real-time timer (pytest-timeout's,
  which the user-code time limit re-arms) come back after;
- **warnings** filters, ``sys.argv``, ``sys.excepthook`` and ``sys.unraisablehook`` likewise;
- **Ray**: ``main`` never sees a Ray connection of the test's (the suite's cluster fixture is disconnected
  first and reconnects when a test next asks for it, ``tests/conftest.py``), and a Ray it started must be
  stopped when it returns, or the call fails. A run that starts or joins Ray belongs in a subprocess
  (``run_cli_process``): Ray keeps process-wide state that a second run here would inherit (the
  authentication token it read, constants read when it was imported).

Known limitations: no per-call timeout (pytest-timeout ends a hung test); C-level state a library keeps for
the life of a process (an imported module's globals, torch's thread pool) is shared between runs, as between
the tests of one process anyway.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

#: called before each in-process run while Ray is connected: disconnects the suite's Ray fixture (conftest)
ray_disconnect_hooks: list = []
#: seconds to wait, after ``main`` returned, for the end of its output
READER_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class CliRun:
    """One in-process run: the fields of ``subprocess.CompletedProcess`` that the tests read."""

    args: list[str]
    """``["batchplan", *argv]``"""
    returncode: int
    stdout: str
    stderr: str


def run_main_in_process(argv: Sequence[str], *, cwd: str | os.PathLike, env: Mapping[str, str]) -> CliRun:
    """``batchplan ARGV`` as a process started in ``cwd`` with environment ``env`` would run it."""
    from planner.cli.main import main

    argv = [str(a) for a in argv]
    _disconnect_ray()
    with _process_state(Path(cwd), env, argv), _captured_output() as captured:
        code = _exit_code_of(main, argv)
    _check_no_ray_left(argv)
    return CliRun(args=["batchplan", *argv], returncode=code, stdout=captured.stdout, stderr=captured.stderr)


def _exit_code_of(main, argv: list[str]) -> int:
    try:
        return int(main(argv) or 0)
    except SystemExit as exc:  # argparse errors, --help, --version: what the interpreter would do with it
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        sys.stderr.write(f"{exc.code}\n")
        return 1
    except Exception:  # would have ended the process with its traceback and exit status 1
        traceback.print_exc()
        return 1


# ------------------------------------------------------------------------------------------------ output


@dataclass
class _Captured:
    stdout: str = ""
    stderr: str = ""


@contextlib.contextmanager
def _captured_output() -> Iterator[_Captured]:
    """fds 1 and 2 into pipes (as a subprocess's ``capture_output`` gives it: ``/dev/stdout`` is a pipe, not a
    file), each drained by a thread, with fresh ``sys.stdout``/``sys.stderr`` on them, until the block ends."""
    captured = _Captured()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved_streams = (sys.stdout, sys.stderr)
    saved_fds = (os.dup(1), os.dup(2))
    chunks: tuple[list[bytes], list[bytes]] = ([], [])
    readers = []
    for fd, sink in ((1, chunks[0]), (2, chunks[1])):
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        reader = threading.Thread(target=_drain, args=(read_end, sink), daemon=True)
        reader.start()
        readers.append(reader)
    out_file, err_file = open(1, "wb", closefd=False), open(2, "wb", closefd=False)  # noqa: SIM115
    out = io.TextIOWrapper(out_file, encoding="utf-8", errors="backslashreplace")
    err = io.TextIOWrapper(err_file, encoding="utf-8", errors="backslashreplace", line_buffering=True)
    sys.stdout, sys.stderr = out, err
    try:
        yield captured
    finally:
        for stream in (out, err, sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        sys.stdout, sys.stderr = saved_streams
        os.dup2(saved_fds[0], 1)  # closes the pipes' last write ends: the readers see the end
        os.dup2(saved_fds[1], 2)
        for fd in saved_fds:
            os.close(fd)
        for stream in (out, err):
            with contextlib.suppress(Exception):
                stream.detach()
        # a process the run started and left running (it inherited the pipes) would keep a reader waiting
        for reader in readers:
            reader.join(timeout=READER_TIMEOUT_S)
        captured.stdout = b"".join(chunks[0]).decode("utf-8", errors="backslashreplace")
        captured.stderr = b"".join(chunks[1]).decode("utf-8", errors="backslashreplace")
        if any(reader.is_alive() for reader in readers):
            captured.stderr += (
                "\n(tests/cli_in_process.py: a process this run started still holds its stdout or stderr)\n"
            )


def _drain(fd: int, sink: list[bytes]) -> None:
    with open(fd, "rb", buffering=0) as pipe:
        while chunk := pipe.read(65536):
            sink.append(chunk)


# ------------------------------------------------------------------------------------------------ state


@contextlib.contextmanager
def _process_state(cwd: Path, env: Mapping[str, str], argv: list[str]) -> Iterator[None]:
    saved_environ = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_path = list(sys.path)
    saved_modules = set(sys.modules)
    saved_argv = list(sys.argv)
    saved_excepthook = sys.excepthook
    saved_unraisablehook = sys.unraisablehook
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    on_main_thread = threading.current_thread() is threading.main_thread()
    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)
    saved_signals = {s: signal.getsignal(s) for s in handled} if on_main_thread else {}
    saved_mask = signal.pthread_sigmask(signal.SIG_BLOCK, []) if on_main_thread else None
    # pytest-timeout's timer: the user-code time limit (planner/obtain/time_limit.py) re-arms and clears it
    saved_timer, started = signal.getitimer(signal.ITIMER_REAL), time.monotonic()
    try:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.path.insert(0, str(cwd.resolve()))  # python -m puts the working directory first
        importlib.invalidate_caches()  # files a test just wrote must be found
        sys.argv = ["batchplan", *argv]
        root.handlers = []
        with warnings.catch_warnings():
            yield
    finally:
        for handler in root.handlers:
            if handler not in saved_handlers:
                with contextlib.suppress(Exception):
                    handler.flush()
        root.handlers = saved_handlers
        root.setLevel(saved_level)
        for signum, handler in saved_signals.items():
            if handler is not None:
                signal.signal(signum, handler)
        if saved_timer[0] > 0:
            left = saved_timer[0] - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 0.001), saved_timer[1])
        if saved_mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, saved_mask)
        from planner.cli import signals as cli_signals

        cli_signals._received.clear()
        sys.excepthook = saved_excepthook
        sys.unraisablehook = saved_unraisablehook
        sys.argv = saved_argv
        sys.path[:] = saved_path
        _forget_modules_from_outside(set(sys.modules) - saved_modules)
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_environ)


def _installed_roots() -> tuple[str, ...]:
    roots = {str(REPO_ROOT), sys.prefix, sys.base_prefix, sys.exec_prefix}
    return tuple(os.path.realpath(r) + os.sep for r in roots)


def _forget_modules_from_outside(names: set[str]) -> None:
    """Drop modules imported from a test's directory (user code): the next run imports the file anew."""
    roots = _installed_roots()
    for name in names:
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None)
        if origin and not os.path.realpath(origin).startswith(roots):
            del sys.modules[name]


# ------------------------------------------------------------------------------------------------ Ray


def _disconnect_ray() -> None:
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        for hook in ray_disconnect_hooks:
            hook()
        if ray.is_initialized():
            ray.shutdown()


def _check_no_ray_left(argv: list[str]) -> None:
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
        raise AssertionError(
            f"batchplan {' '.join(argv)} returned with Ray still connected in this process "
            "(a run that starts or joins Ray belongs in run_cli_process)"
        )
