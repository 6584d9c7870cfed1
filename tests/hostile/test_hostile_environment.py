"""The machine's own state against a run that starts Ray (issue #34, item 6): a temporary directory so long that
Ray's socket paths pass the Unix limit, or so full that Ray cannot write its session, is one line naming the
directory, the variable that chose it and the fix, before Ray starts (both were tracebacks, the second after a
minute of waiting)."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.planner.cli_helpers import TINY_MODEL, assert_user_error, run_cli

pytestmark = pytest.mark.slow

THREE_NODES = """name: three
nodes:
  - {name: n-a, gpus: [{type: T4, count: 1}]}
  - {name: n-b, gpus: [{type: T4, count: 1}]}
  - {name: n-c, gpus: [{type: T4, count: 1}]}
"""


def _plan(cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    (cwd / "three.yaml").write_text(THREE_NODES)
    return run_cli(
        "plan",
        "--cluster",
        "three.yaml",
        *TINY_MODEL,
        "--no-cache",
        "--no-write",
        cwd=cwd,
        env=env,
        timeout=120,
    )


@pytest.mark.parametrize("variable", ["RAY_TMPDIR", "TMPDIR"])
def test_a_temporary_directory_too_long_for_ray_s_sockets_is_one_line(tmp_path: Path, variable: str) -> None:
    long_dir = tmp_path / ("t" * 60)
    long_dir.mkdir()
    env = {variable: str(long_dir), **({"RAY_TMPDIR": ""} if variable == "TMPDIR" else {})}
    if variable == "TMPDIR":
        env.pop("RAY_TMPDIR")
    result = _plan(tmp_path, env)
    assert_user_error(
        result,
        2,
        f"Ray's temporary directory {long_dir}/ray (from {variable}) is too long",
        "over the 107 a Unix socket allows",
        "RAY_TMPDIR=/tmp",
    )


@pytest.fixture
def full_dir() -> Iterator[Path]:
    """A 1 MiB tmpfs, filled, at a short path (root only: CI runs as root; elsewhere skipped with the reason)."""
    where = Path(tempfile.mkdtemp(prefix="bpfull", dir="/tmp"))
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        where.rmdir()
        pytest.skip(f"a full file system needs a tmpfs mount, refused here: {mounted.stderr.strip()}")
    try:
        subprocess.run(["dd", "if=/dev/zero", f"of={where / 'fill'}", "bs=64k"], capture_output=True)
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True)
        where.rmdir()


def test_a_full_temporary_directory_is_one_line_before_ray_starts(tmp_path: Path, full_dir: Path) -> None:
    result = _plan(tmp_path, {"RAY_TMPDIR": str(full_dir)})
    assert_user_error(
        result,
        2,
        f"Ray's temporary directory {full_dir}/ray (from RAY_TMPDIR) has 0.0 MiB",
        "set RAY_TMPDIR to another directory",
    )
