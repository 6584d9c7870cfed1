"""Another local user, for the cross-user tests (issue #34): as root, commands run as ``nobody`` through
``setpriv`` (util-linux), with nobody's own uid, gid and no supplementary groups; a place both can reach.

Where the test process is not root, or ``setpriv`` or the ``nobody`` account is missing, the tests skip with
that reason, except in CI (``CI=true``, run as root), where it is a failure: the cases exist for CI to run.
"""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

OTHER_USER = "nobody"


def other_uid_gid() -> tuple[int, int]:
    """(uid, gid) of :data:`OTHER_USER`; skips (fails in CI) where no test can act as another user."""
    problem = None
    if os.geteuid() != 0:
        problem = "the test runs as a user who cannot act as another (run as root: CI does)"
    elif shutil.which("setpriv") is None:
        problem = "setpriv (util-linux) is not installed"
    else:
        try:
            entry = pwd.getpwnam(OTHER_USER)
            return entry.pw_uid, entry.pw_gid
        except KeyError:
            problem = f"there is no {OTHER_USER!r} account"
    reason = f"cross-user case needs another uid: {problem}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI runs as root, so there this is a failure")
    pytest.skip(reason)


def run_as_other_user(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    input_text: str | None = None,
    timeout: float = 120.0,
) -> subprocess.CompletedProcess[str]:
    """``argv`` run as :data:`OTHER_USER` (its uid, gid, no other groups); fails the test where it fails."""
    uid, gid = other_uid_gid()
    command = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *argv]
    result = subprocess.run(
        command,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        input=input_text,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"as {OTHER_USER}: {argv}: {result.stdout}\n{result.stderr}"
    return result


def write_as_other_user(path: Path, text: str) -> None:
    """``path`` written by :data:`OTHER_USER`: created by it (so owned by it, mode 0644) where new, rewritten in
    place (still its owner's) where it exists and the other user may write it."""
    run_as_other_user(["sh", "-c", 'umask 022 && cat > "$1"', "sh", str(path)], input_text=text)


@contextmanager
def reachable_place() -> Iterator[Path]:
    """A fresh directory of this user's that every user can reach (mode 0755, directly under ``/tmp``), removed
    afterwards: where a directory others can write is exposed to them. pytest's own temporary directories are
    0700, a private directory that shields everything below it from other users (``planner.trust``)."""
    root = Path(tempfile.mkdtemp(prefix="bp-open-", dir="/tmp"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def shared_place() -> Iterator[Path]:
    """:func:`reachable_place`, where :data:`OTHER_USER` acts (skips, or fails in CI, where none can)."""
    other_uid_gid()
    with reachable_place() as root:
        yield root


@functools.cache
def other_user_python() -> str:
    """A Python interpreter :data:`OTHER_USER` may run (the test's own may live under root's 0700 home); skips (fails
    in CI) where there is none."""
    for candidate in ("/usr/bin/python3", sys.executable, shutil.which("python3") or ""):
        if (
            candidate
            and subprocess.run(
                [
                    "setpriv",
                    f"--reuid={other_uid_gid()[0]}",
                    f"--regid={other_uid_gid()[1]}",
                    "--clear-groups",
                    "--",
                    candidate,
                    "-I",
                    "-c",
                    "pass",
                ],
                capture_output=True,
                timeout=60,
            ).returncode
            == 0
        ):
            return candidate
    reason = f"cross-user case needs a Python interpreter {OTHER_USER} may run (apt-get install python3)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; in CI this is a failure")
    pytest.skip(reason)


_LISTEN = """
import socket, sys
listener = socket.socket(socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET)
listener.bind((sys.argv[1], 0))
listener.listen(8)
print(listener.getsockname()[1], flush=True)
sys.stdin.read()
"""


@contextmanager
def other_user_listener(host: str = "127.0.0.1") -> Iterator[int]:
    """A TCP port on ``host`` that :data:`OTHER_USER` listens on (a stand-in for that user's Ray GCS: the socket
    is theirs in ``/proc/net/tcp``); closed afterwards."""
    uid, gid = other_uid_gid()
    process = subprocess.Popen(
        [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={gid}",
            "--clear-groups",
            "--",
            other_user_python(),
            "-I",
            "-c",
            _LISTEN,
            host,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline()  # type: ignore[union-attr]
        assert line.strip().isdigit(), f"the listener of {OTHER_USER} did not start: {line!r}"
        yield int(line)
    finally:
        process.stdin.close()  # type: ignore[union-attr]
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
