"""Whether another user could have written a file batchplan reads back: OpenSSH's ``StrictModes``, for every
cache directory and entry (profiles, measured links, gradient layouts, measured synchronisation) and for the
address file of a Ray cluster found on this machine.

What is read there decides plans, and a cache entry's name and checksum are things anyone can compute: so who
could have written it is the question, not what it holds. A path is trusted when

- the file is a regular file (never a symbolic link: opened with ``O_NOFOLLOW``), owned by this user or root,
  and writable by neither its group nor others: checked with ``fstat`` on the open descriptor, so what was
  checked is what is read;
- its directory, and every directory above it up to ``/``, is owned by this user or root, and writable by
  neither group nor others, unless it is sticky and above the file's own (``/tmp``, ``drwxrwxrwt``: there no
  one else may rename or remove what is ours), or a private directory above it shields it (one of this user's
  or root's that neither group nor others may enter, such as a 0700 home: no one else can reach what is
  below). Each is opened with ``O_NOFOLLOW`` relative to the one above (``openat``) and checked with ``fstat``
  on that descriptor, starting from the path with its symbolic links resolved: a
  ``~/.cache -> /data/me/cache`` link is fine, and what it points to is what is checked.

A path that fails is an :class:`UntrustedPathError`: one line naming the path, what is wrong with it (whose it
is, its mode) and the fix. The API is small on purpose, for every reader of a cache to call:

- :func:`trusted_dir` checks a directory (a missing one: the directories that would hold it);
- :func:`make_trusted_dir` creates a missing one (mode 0755, whatever the umask) and checks it;
- :func:`read_trusted` returns a file's bytes (bounded) or None where it does not exist;
- :func:`open_trusted` opens it for reading, for a caller that reads it itself;
- :func:`write_trusted` writes one (its directory made and checked first; never through a symbolic link,
  atomically: ``planner.files``), so that what was written is what the next reader trusts.

Known limitations: POSIX ACLs and Linux capabilities are not read (a directory whose ACL lets another user write
it passes); a network file system that maps owners (NFS ``root_squash``, ``all_squash``) is judged by the
owners it reports.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from planner.errors import ConfigError
from planner.files import write_file_safely
from planner.jsonio import read_at_most

__all__ = [
    "UntrustedPathError",
    "make_trusted_dir",
    "open_trusted",
    "owner_name",
    "read_trusted",
    "trusted_dir",
    "write_trusted",
]

#: open flags of a directory on the walk: a path-only descriptor where the system has one (Linux: a directory
#: this user may search but not list, such as a 0711 home, can still be checked), never through a link
_DIR_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: open flags of a file: never through a link, and never blocking on a FIFO planted where a file should be
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class UntrustedPathError(ConfigError):
    """A file or directory another user could have written (or could write next); the message names the path,
    what is wrong and the fix, on one line."""

    def __init__(self, path: str | os.PathLike, problem: str, fix: str, *, in_directory: bool) -> None:
        self.path = str(path)
        """the file or directory that is not trusted"""
        self.problem = problem
        """what is wrong, naming the path and whose it is (without the fix)"""
        self.fix = fix
        self.in_directory = in_directory
        """a directory is not trusted (the file's own or one above): nothing under it can be, so a reader
        refuses; False where only the file is (a reader may ignore it and derive it again)"""
        super().__init__(f"{problem} ({fix})")

    def __reduce__(self):  # crosses Ray and process boundaries by pickle
        return _rebuild, (type(self), self.path, self.problem, self.fix, self.in_directory)


def _rebuild(
    kind: type[UntrustedPathError], path: str, problem: str, fix: str, in_directory: bool
) -> UntrustedPathError:
    return kind(path, problem, fix, in_directory=in_directory)


def owner_name(uid: int) -> str:
    """``uid 1000 (alice)``, or ``uid 1000`` where the user database has no name for it."""
    import pwd

    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _trusted_owner(uid: int) -> bool:
    return uid in (0, os.geteuid())


def _this_user() -> str:
    return "root" if os.geteuid() == 0 else f"this user ({owner_name(os.geteuid())}) or root"


def _is_private(info: os.stat_result) -> bool:
    """A directory of this user's or root's that neither group nor others may enter (no search bit): no other
    user can reach anything below it."""
    return _trusted_owner(info.st_uid) and not info.st_mode & (stat.S_IXGRP | stat.S_IXOTH)


def _check_directory(
    info: os.stat_result, current: str, *, subject: str, fix: str, holds_entries: bool, shielded: bool
) -> None:
    """``subject``: what the message is about (``the profile cache directory /c``), ``current`` the directory
    on its path being checked; ``holds_entries``: the directory the files are in, where sticky is no excuse
    (anyone could add one); ``shielded``: a private directory above it (:func:`_is_private`)."""
    where = subject if subject.endswith(f" {current}") else f"{subject}: {current} above it"
    mode = info.st_mode
    if not stat.S_ISDIR(mode):
        raise UntrustedPathError(current, f"{where} is not a directory", fix, in_directory=True)
    if not _trusted_owner(info.st_uid):
        raise UntrustedPathError(
            current,
            f"{where} is owned by {owner_name(info.st_uid)}, not by {_this_user()}: its owner could "
            "replace what batchplan reads there",
            fix,
            in_directory=True,
        )
    writable = mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and not shielded and (holds_entries or not mode & stat.S_ISVTX):
        who = "every user" if mode & stat.S_IWOTH else "its group"
        raise UntrustedPathError(
            current,
            f"{where} is writable by {who} (mode {stat.filemode(mode)}): others could plant or replace "
            "what batchplan reads there",
            fix,
            in_directory=True,
        )


def _check_file(info: os.stat_result, path: str, *, what: str, fix: str) -> None:
    mode = info.st_mode
    if not stat.S_ISREG(mode):
        raise UntrustedPathError(path, f"{what} {path} is not a regular file", fix, in_directory=False)
    if not _trusted_owner(info.st_uid):
        raise UntrustedPathError(
            path,
            f"{what} {path} is owned by {owner_name(info.st_uid)}, not by {_this_user()}",
            fix,
            in_directory=False,
        )
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "every user" if mode & stat.S_IWOTH else "its group"
        raise UntrustedPathError(
            path, f"{what} {path} is writable by {who} (mode {stat.filemode(mode)})", fix, in_directory=False
        )


def _resolved(path: str | os.PathLike) -> Path:
    """``path`` absolute with its symbolic links resolved, as far as it exists (the rest appended)."""
    return Path(os.path.realpath(os.path.abspath(path)))


@contextlib.contextmanager
def _directory_fd(directory: Path, *, subject: str, fix: str) -> Iterator[int | None]:
    """A descriptor of ``directory`` (resolved) after checking it and every directory above it, each opened
    relative to the one above; None where ``directory`` does not exist (the part of it that does was checked)."""
    fd = os.open("/", _DIR_FLAGS)
    try:
        current = Path("/")
        parts = directory.parts[1:]
        info = os.fstat(fd)
        _check_directory(
            info, str(current), subject=subject, fix=fix, holds_entries=not parts, shielded=False
        )
        shielded = _is_private(info)
        for depth, part in enumerate(parts, start=1):
            current = current / part
            try:
                below = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                yield None
                return
            except OSError as exc:
                if exc.errno in (
                    errno.ELOOP,
                    errno.ENOTDIR,
                ):  # swapped for a link or a file since it was resolved
                    raise UntrustedPathError(
                        current, f"{subject}: {current} is not a directory", fix, in_directory=True
                    ) from None
                raise UntrustedPathError(
                    current, f"{subject}: {current} cannot be opened: {exc.strerror}", fix, in_directory=True
                ) from None
            os.close(fd)
            fd = below
            info = os.fstat(fd)
            _check_directory(
                info,
                str(current),
                subject=subject,
                fix=fix,
                holds_entries=depth == len(parts),
                shielded=shielded,
            )
            shielded = shielded or _is_private(info)
        yield fd
    finally:
        os.close(fd)


def trusted_dir(path: str | os.PathLike, *, what: str, fix: str) -> Path:
    """``path`` resolved, where it and every directory above it are trusted (module docstring); a directory that
    does not exist yet is checked as far as it does.

    Args:
        what: how messages name it (``"the profile cache directory"``).
        fix: what the user can do (``"chmod go-w DIR, or choose another --cache-dir"``).

    Raises:
        UntrustedPathError: it or a directory above it is not trusted.
    """
    resolved = _resolved(path)
    with _directory_fd(resolved, subject=f"{what} {resolved}", fix=fix):
        pass
    return resolved


def make_trusted_dir(path: str | os.PathLike, *, what: str, fix: str) -> Path:
    """:func:`trusted_dir`, creating what is missing of it first (each new directory mode 0755, whatever the
    umask: never writable by others).

    Raises:
        UntrustedPathError: it or a directory above it is not trusted.
        ConfigError: it cannot be created (the message names the system's reason).
    """
    resolved = _resolved(path)
    trusted_dir(resolved, what=what, fix=fix)  # nothing is created under a directory others control
    missing = [p for p in (resolved, *resolved.parents) if not p.exists()]
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o755)
            os.chmod(directory, 0o755, follow_symlinks=False)  # mkdir's mode is cut by the umask only
        except FileExistsError:
            pass  # made meanwhile by another process: checked below like any other
        except OSError as exc:
            raise ConfigError(f"cannot create {what} {directory}: {exc.strerror or exc} ({fix})") from None
    return trusted_dir(resolved, what=what, fix=fix)


def open_trusted(path: str | os.PathLike, *, what: str, fix: str) -> BinaryIO | None:
    """``path`` opened for reading (binary) where it and its directories are trusted; None where it does not
    exist. The caller closes it.

    Raises:
        UntrustedPathError: it or a directory above it is not trusted (a link, a FIFO, another user's file).
        ConfigError: it cannot be opened (permissions, I/O).
    """
    target = Path(os.path.abspath(path))
    directory = _resolved(target.parent)
    with _directory_fd(directory, subject=f"{what} {target}", fix=fix) as dir_fd:
        if dir_fd is None:
            return None
        try:
            fd = os.open(target.name, _FILE_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UntrustedPathError(
                    target, f"{what} {target} is a symbolic link", fix, in_directory=False
                ) from None
            if exc.errno == errno.EISDIR:
                raise UntrustedPathError(
                    target, f"{what} {target} is not a regular file", fix, in_directory=False
                ) from None
            raise ConfigError(f"{what} {target} cannot be read: {exc.strerror or exc} ({fix})") from None
    try:
        _check_file(os.fstat(fd), str(target), what=what, fix=fix)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_trusted(path: str | os.PathLike, *, what: str, fix: str, max_bytes: int) -> bytes | None:
    """The bytes of ``path`` where it and its directories are trusted (:func:`open_trusted`), at most
    ``max_bytes`` (the size from ``fstat`` is refused before anything is read); None where it does not exist.

    Raises:
        UntrustedPathError: it or a directory above it is not trusted.
        ConfigError: too large, or unreadable.
    """
    handle = open_trusted(path, what=what, fix=fix)
    if handle is None:
        return None
    with handle:
        size = os.fstat(handle.fileno()).st_size
        if size > max_bytes:
            raise ConfigError(f"{what} {path} is {size} bytes, over the limit of {max_bytes} bytes ({fix})")
        return read_at_most(handle, max_bytes, what=f"{what} {path}", fix=fix)


def write_trusted(path: str | os.PathLike, text: str, *, what: str, fix: str, mode: int = 0o644) -> Path:
    """Write ``text`` to ``path`` for a later :func:`read_trusted`: its directory created where missing and
    checked (:func:`make_trusted_dir`), a symbolic link at ``path`` replaced rather than written through, the file
    written to a temporary name and renamed (``planner.files.write_file_safely``) with ``mode`` (never writable by
    others). Returns the path written.

    Raises:
        UntrustedPathError: its directory, or one above it, is not trusted.
        ConfigError: it cannot be written (nothing is left half-written).
    """
    target = Path(os.path.abspath(path))
    make_trusted_dir(target.parent, what=f"the directory of {what}", fix=fix)
    if target.is_symlink():
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
    return write_file_safely(target, text, what=what, fix=fix, mode=mode & ~0o022)
