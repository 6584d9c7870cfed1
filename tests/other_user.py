"""Another local user, for the cross-user tests (issue #34): as root, commands run as ``nobody`` through
``setpriv`` (util-linux), with nobody's own uid, gid and no supplementary groups; a place both can reach.

Where the test process is not root, or ``setpriv`` or the ``nobody`` account is missing, the tests skip with
that reason, except in CI (``CI=true``, run as root), where it is a failure: the cases exist for CI to run.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
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


def run_as_other_user(argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
                      input_text: str | None = None, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """``argv`` run as :data:`OTHER_USER` (its uid, gid, no other groups); fails the test where it fails."""
    uid, gid = other_uid_gid()
    command = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *argv]
    result = subprocess.run(command, env=dict(env) if env is not None else None, cwd=cwd, input=input_text,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"as {OTHER_USER}: {argv}: {result.stdout}\n{result.stderr}"
    return result


def write_as_other_user(path: Path, text: str) -> None:
    """``path`` written by :data:`OTHER_USER`: created by it (so owned by it, mode 0644) where new, rewritten in
    place (still its owner's) where it exists and the other user may write it."""
    run_as_other_user(["sh", "-c", 'umask 022 && cat > "$1"', "sh", str(path)], input_text=text)


@contextmanager
def shared_place() -> Iterator[Path]:
    """A fresh directory both root and :data:`OTHER_USER` can reach: root's, mode 0755, directly under the
    system's temporary directory (pytest's own are 0700), removed afterwards."""
    other_uid_gid()
    root = Path(tempfile.mkdtemp(prefix="bp-xuser-", dir="/tmp"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
