"""Which Ray cluster is "the one running here" (no ``--address``, or ``--address auto``), and whether this user
may trust it.

Ray finds it through ``RAY_ADDRESS`` or the address file ``ray start --head`` writes
(``$RAY_TMPDIR``, else ``$TMPDIR``, else ``/tmp``, then ``ray/ray_current_cluster``). Ray makes that directory
mode 0777 so that users can share it: anyone on the machine can put a file there that names their own cluster,
whose workers then run what this run sends them and send back objects the driver unpickles (code run as this
user), and whose answers decide the plan. So the file is used only where

- batchplan does not run under ``sudo`` (root's run must not join a cluster a user's file names);
- the file is owned by this user or root and writable by no one else, in a directory no other user can write,
  and so is every directory above it (``planner.trust``: OpenSSH's ``StrictModes``);
- the GCS it names, where it is on this machine, listens as this user or root (``/proc/net/tcp``): a stale
  file whose port another user took names that user's cluster.

A file that fails is not used: without ``--address`` a stderr line says why and how to join it deliberately (an
embedded Ray is started instead); with ``--address auto`` it is an error. ``RAY_ADDRESS`` and ``--address
HOST:PORT`` are the user's own choice and are joined, with a line saying whose cluster it is where it runs here.
"""

from __future__ import annotations

import logging
import os
import shlex
import stat
import sys
from dataclasses import dataclass

from planner.errors import ClusterUnreachableError, ConfigError
from planner.probing.gcs_probe import is_this_machine, listening_uid, split_host_port
from planner.trust import UntrustedPathError, owner_name, read_trusted
from torchkit.terminal_text import printable

log = logging.getLogger(__name__)

#: an address file holds one ``host:port``; anything longer is not one
_MAX_ADDRESS_FILE_BYTES = 4096
#: seconds to wait for a TCP connection to a GCS on another machine that the file names (a stale file is dropped)
_CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True, kw_only=True)
class FoundCluster:
    """A Ray cluster this machine points to, and where that came from."""

    address: str
    """the GCS address, ``host:port`` (or what ``RAY_ADDRESS`` holds)"""
    source: str
    """``RAY_ADDRESS``, or the path of the address file"""
    owner: str | None
    """whose process listens at the GCS (``uid 0 (root)``) where it runs on this machine, else None"""

    def describe(self) -> str:
        """``127.0.0.1:6379 (from RAY_ADDRESS; its GCS runs as uid 0 (root))``"""
        whose = f"its GCS runs as {self.owner}" if self.owner else "its GCS is not on this machine"
        return f"{self.address} (from {self.source}; {whose})"


def ray_temp_root() -> tuple[str, str]:
    """(Ray's temporary directory on this machine, the variable that chose it): the same rule as Ray's
    ``ray._common.utils.get_default_ray_temp_dir`` (Ray 2.60), repeated here so that checks run before ``ray`` is
    imported: ``$RAY_TMPDIR``, else ``$TMPDIR`` on Linux, else ``/tmp``; then ``ray``."""
    if "RAY_TMPDIR" in os.environ:
        return os.path.join(os.environ["RAY_TMPDIR"], "ray"), "RAY_TMPDIR"
    if sys.platform.startswith("linux") and "TMPDIR" in os.environ:
        return os.path.join(os.environ["TMPDIR"], "ray"), "TMPDIR"
    return os.path.join("/tmp", "ray"), "the default /tmp"


def ray_address_file() -> str:
    """Where ``ray start --head`` records the cluster address for ``ray.init()`` on this machine
    (:func:`ray_temp_root`, then ``ray_current_cluster``)."""
    return os.path.join(ray_temp_root()[0], "ray_current_cluster")


def under_sudo() -> bool:
    """Whether this process is root by ``sudo`` (which leaves ``SUDO_UID``): a user's environment and files."""
    return os.geteuid() == 0 and "SUDO_UID" in os.environ


def _owner_of(address: str) -> tuple[str | None, int | None]:
    """(whose process listens at ``address`` here, its uid), or (None, None) where it is not seen here."""
    parts = split_host_port(address)
    if parts is None:
        return None, None
    uid = listening_uid(*parts)
    return (owner_name(uid) if uid is not None else None), uid


class _NotUsed(Exception):
    """The address file names a cluster this user may not trust; the message says why."""

    def __init__(self, reason: str, address: str | None = None) -> None:
        super().__init__(reason)
        self.address = address


def find_running_cluster(*, explicit: bool) -> FoundCluster | None:
    """The cluster ``ray.init()`` would join here, where this user may trust it (module docstring); None where
    there is none.

    Args:
        explicit: the user asked for it (``--address auto``): a file that may not be used is an error. Else
            (no ``--address``) it is one stderr line, and None.

    Raises:
        ClusterUnreachableError: ``explicit`` and the address file may not be used.
    """
    env_address = os.environ.get("RAY_ADDRESS", "").strip()
    if env_address and env_address != "auto":
        owner, _ = _owner_of(env_address)
        return FoundCluster(address=env_address, source="RAY_ADDRESS", owner=owner)
    path = ray_address_file()
    try:
        return _from_address_file(path)
    except _NotUsed as refused:
        join = f"--address {shlex.quote(refused.address)}" if refused.address else "--address HOST:PORT"
        if explicit:
            raise ClusterUnreachableError(
                f"--address auto does not use the Ray address file {printable(path)}: {refused} (name the cluster "
                f"yourself, {join}, once you know whose it is)"
            ) from None
        log.warning(
            "not joining the Ray cluster the address file %s names: %s (to join it, give %s once you know "
            "whose it is); starting an embedded Ray instead",
            printable(path),
            refused,
            join,
        )
        return None


def _from_address_file(path: str) -> FoundCluster | None:
    fix = "this is Ray's own file: give the cluster's address instead"
    if under_sudo():
        if os.path.lexists(path):
            raise _NotUsed(
                "batchplan runs under sudo, and a file a user's session wrote may name a cluster of anyone's"
            )
        return None
    try:
        raw = read_trusted(path, what="the Ray address file", fix=fix, max_bytes=_MAX_ADDRESS_FILE_BYTES)
    except UntrustedPathError as exc:
        raise _NotUsed(f"{exc.problem}, so anyone could have written it", _address_in(path)) from None
    except ConfigError as exc:  # too large, unreadable: as good as no file, but said
        raise _NotUsed(f"it cannot be read ({exc})") from None
    if raw is None:
        return None
    address = raw.decode("utf-8", "replace").strip()
    if split_host_port(address) is None or not address.isprintable():
        raise _NotUsed(f"it holds '{printable(address, max_chars=80)}', not a HOST:PORT")
    owner, uid = _owner_of(address)
    host, port = split_host_port(address)  # type: ignore[misc]
    if uid is None and (is_this_machine(host) or not _accepts_connections(host, port)):
        log.debug("the Ray address file %s names %s, where nothing listens: a stale file", path, address)
        return None
    if uid is not None and uid not in (0, os.geteuid()):
        raise _NotUsed(
            f"it names {address}, where a GCS of {owner} listens, not one of this user's or root's", address
        )
    return FoundCluster(address=address, source=path, owner=owner)


def _accepts_connections(host: str, port: int) -> bool:
    import socket

    try:
        with socket.create_connection((host, port), timeout=_CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False


def _address_in(path: str) -> str | None:
    """The ``host:port`` a file holds, for the line that tells how to join it deliberately; None otherwise (read
    without following a link or blocking on a FIFO: the file is not trusted)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = os.read(fd, _MAX_ADDRESS_FILE_BYTES).decode("utf-8", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)
    return text if split_host_port(text) is not None and text.isprintable() else None
