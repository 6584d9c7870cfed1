"""Writing a result file (plan.json, a profile-cache entry) so that nothing is ever half-written or replaced.

What is at the path decides how it is written:

- nothing, or a regular file: a temporary file in the same directory, then a rename, so a reader sees the
  old file or the new one, never a part (a full disk, ``RLIMIT_FSIZE``, a signal: the temporary file is
  removed and the old file is left as it was);
- a symbolic link: the same, at the file it points to (the link stays a link);
- a FIFO or a character device (``-o /dev/stdout``, ``/dev/null``, a named pipe a scheduler reads): written
  through, never replaced by a regular file; a FIFO nobody reads is refused instead of blocking;
- anything else (a directory, a socket, a symbolic-link loop, a dangling link into a missing directory, a
  regular file that is this process's own stdout: ``-o /dev/stdout > out.txt``): a ``ConfigError`` naming the
  path, what it is and the fix.

Every OS error (read-only directory, full disk, file-size limit) is a one-line ``ConfigError`` too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

from planner.errors import ConfigError


def write_file_safely(
    path: str | os.PathLike, text: str, *, what: str, fix: str, mode: int | None = None
) -> Path:
    """Write ``text`` to ``path`` as the module docstring says; returns the path written.

    Args:
        what: the file's kind and name for messages (``"the plan"``, ``"profile cache entry"``).
        fix: what to do instead, for messages (``"choose another -o path"``).
        mode: permission bits of a new regular file (default: 0666 less the umask, as ``open`` gives).

    Raises:
        ConfigError: nothing could be written (nothing was left behind).
    """
    target = Path(path)
    try:
        status = os.stat(target)  # follows links: what a write would reach
    except FileNotFoundError:
        status = None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(
                f"cannot write {what} to {target}: it is a symbolic link loop ({fix})"
            ) from None
        raise _error(what, target, exc, fix) from None
    if status is not None and (stat.S_ISFIFO(status.st_mode) or stat.S_ISCHR(status.st_mode)):
        _write_through(target, text, what, fix, is_fifo=stat.S_ISFIFO(status.st_mode))
        return target
    if status is not None and not stat.S_ISREG(status.st_mode):
        kind = "a directory" if stat.S_ISDIR(status.st_mode) else "not a regular file"
        raise ConfigError(f"cannot write {what} to {target}: it is {kind} ({fix})")
    if status is not None and _is_a_standard_stream(status):
        raise ConfigError(
            f"cannot write {what} to {target}: it is this process's own stdin, stdout or stderr, a regular file "
            f"that replacing would cut off ({fix}; for the result on stdout: --json > FILE)"
        )
    real = Path(os.path.realpath(target)) if target.is_symlink() else target
    _replace_atomically(real, text, what, fix, mode)
    return target


def _is_a_standard_stream(status: os.stat_result) -> bool:
    """Whether ``status`` is the file of this process's fd 0, 1 or 2 (``-o /dev/stdout > plan.txt``)."""
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            own = os.fstat(fd)
            if (own.st_dev, own.st_ino) == (status.st_dev, status.st_ino):
                return True
    return False


def _replace_atomically(target: Path, text: str, what: str, fix: str, mode: int | None) -> None:
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise _error(what, target, exc, fix) from None
    try:
        if mode is None:  # mkstemp makes the file 0600; the usual 0666 & ~umask, as open() would
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _error(what, target, exc, fix) from None
        raise


def _write_through(target: Path, text: str, what: str, fix: str, *, is_fifo: bool) -> None:
    flags = os.O_WRONLY | (os.O_NONBLOCK if is_fifo else 0)
    try:
        fd = os.open(target, flags)
    except OSError as exc:
        if is_fifo and exc.errno == errno.ENXIO:
            raise ConfigError(
                f"cannot write {what} to {target}: it is a FIFO that no process reads ({fix})"
            ) from None
        raise _error(what, target, exc, fix) from None
    try:
        if is_fifo:
            os.set_blocking(fd, True)
        with os.fdopen(fd, "w", encoding="utf-8", closefd=True) as handle:
            handle.write(text)
    except OSError as exc:
        raise _error(what, target, exc, fix) from None


def _error(what: str, target: Path, exc: OSError, fix: str) -> ConfigError:
    return ConfigError(f"cannot write {what} to {target}: {exc.strerror or exc} ({fix})")
