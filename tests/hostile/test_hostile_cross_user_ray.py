"""Another local user's Ray cluster and root's ``batchplan plan`` (issue #34, item 1): ``nobody`` listens where a
Ray GCS would and writes its address into the address file Ray's shared (0777) directory holds, as the round did
with a real head whose workers imported a ``sitecustomize.py``. Root's plan must not join it: one stderr line
says why and how to join a cluster deliberately, and the plan is made on an embedded Ray of root's own; with
``--address auto`` it is one error line. Under ``sudo`` the file is never used, even root's own.

Run as root with ``nobody`` acting through ``setpriv`` (``tests/other_user.py``); skipped with the reason
elsewhere, never in CI. Each plan is a real process (``run_cli_process``): it starts or refuses a Ray of its
own, and Ray's state would outlive an in-process run (the suite's own cluster could no longer start actors). On 173e00e the first case joined the "cluster" and hung in ``ray.init``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.other_user import other_user_listener, shared_place, write_as_other_user
from tests.planner.cli_helpers import TINY_MODEL, assert_user_error, describe, run_cli_process

pytestmark = [pytest.mark.slow, pytest.mark.ray]


@pytest.fixture
def planted() -> Iterator[tuple[Path, str]]:
    """(root's TMPDIR, the address nobody planted): Ray's ``ray`` directory there is 0777, as Ray leaves it, and
    nobody's file in it names nobody's listener."""
    with shared_place() as place, other_user_listener() as port:
        (place / "ray").mkdir()
        (place / "ray").chmod(0o777)
        address = f"127.0.0.1:{port}"
        write_as_other_user(place / "ray" / "ray_current_cluster", address)
        yield place, address


def _env(tmpdir: Path, **extra: str) -> dict[str, str]:
    return {"TMPDIR": str(tmpdir), "RAY_ADDRESS": "", **extra}


def test_plan_does_not_join_a_cluster_another_user_planted_and_says_so(planted, tmp_path: Path) -> None:
    place, address = planted
    result = run_cli_process(
        "plan", *TINY_MODEL, "--no-cache", "--no-write", cwd=tmp_path, env=_env(place), timeout=300
    )
    assert "Traceback" not in result.stderr, describe(result)
    assert "found a running Ray cluster" not in result.stderr, describe(result)
    [said] = [line for line in result.stderr.splitlines() if line.startswith("not joining the Ray cluster")]
    assert f"{place}/ray/ray_current_cluster names" in said and "writable by every user" in said, said
    assert f"give --address {address} once you know whose it is" in said, said
    assert "starting an embedded local Ray on 127.0.0.1" in result.stderr, describe(result)
    # the embedded Ray is root's own, on this GPU-less machine: no usable GPU, said in one line (exit 1)
    assert result.returncode == 1 and result.stderr.strip().splitlines()[-1].startswith(
        "error: no usable GPU"
    ), describe(result)


def test_address_auto_refuses_the_planted_file_in_one_line(planted, tmp_path: Path) -> None:
    place, address = planted
    result = run_cli_process(
        "plan",
        "--address",
        "auto",
        *TINY_MODEL,
        "--no-cache",
        "--no-write",
        cwd=tmp_path,
        env=_env(place),
        timeout=120,
    )
    assert_user_error(
        result,
        2,
        "--address auto does not use the Ray address file",
        "writable by every user",
        f"--address {address}",
    )


def test_under_sudo_even_root_s_own_address_file_is_not_used(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("sudo makes root: the case needs the test to run as root (CI does)")
    private = Path(
        tempfile.mkdtemp(prefix="bpsudo", dir="/tmp")
    )  # root's, 0700: a file here is root's to trust
    try:
        (private / "ray").mkdir()
        (private / "ray" / "ray_current_cluster").write_text("127.0.0.1:6379")
        result = run_cli_process(
            "plan",
            "--address",
            "auto",
            *TINY_MODEL,
            "--no-cache",
            "--no-write",
            cwd=tmp_path,
            env=_env(private, SUDO_UID="65534", SUDO_USER="nobody"),
            timeout=120,
        )
        assert_user_error(result, 2, "batchplan runs under sudo")
    finally:
        import shutil

        shutil.rmtree(private, ignore_errors=True)
