"""Which running Ray cluster batchplan joins without ``--address`` (``planner/probing/local_cluster.py``; issue
#34, item 1): ``RAY_ADDRESS`` as given; the address file only where this user may trust it (theirs or root's, in
a directory no other user can write, naming a GCS of theirs or root's, not under ``sudo``), otherwise a line
saying why and how to join it deliberately, or with ``--address auto`` an error.

The "GCS" is a plain listener (who listens is what is checked; nothing is joined here). The cases with another
user run as root with ``nobody`` (``tests/other_user.py``)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from planner.errors import ClusterUnreachableError
from planner.probing.local_cluster import find_running_cluster, ray_address_file
from planner.trust import owner_name
from tests.other_user import other_uid_gid, other_user_listener, reachable_place, write_as_other_user

ME = owner_name(os.geteuid())


@pytest.fixture
def ray_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A ``RAY_TMPDIR`` whose ``ray`` directory Ray would have made (mode 0777), in a place every user can reach."""
    with reachable_place() as place:
        monkeypatch.setenv("RAY_TMPDIR", str(place))
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        monkeypatch.delenv("SUDO_UID", raising=False)
        (place / "ray").mkdir()
        (place / "ray").chmod(0o777)
        yield place


def _file(ray_tmp: Path) -> Path:
    assert ray_address_file() == str(ray_tmp / "ray" / "ray_current_cluster")
    return ray_tmp / "ray" / "ray_current_cluster"


def test_ray_address_is_the_user_s_choice_and_says_whose_cluster_it_is(
    ray_tmp: Path, server, monkeypatch
) -> None:
    port = server(None)
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    found = find_running_cluster(explicit=False)
    assert (found.address, found.source, found.owner) == (f"127.0.0.1:{port}", "RAY_ADDRESS", ME)
    assert found.describe() == f"127.0.0.1:{port} (from RAY_ADDRESS; its GCS runs as {ME})"


def test_a_file_of_this_user_in_a_directory_only_this_user_can_write_is_joined(ray_tmp: Path, server) -> None:
    port = server(None)
    (ray_tmp / "ray").chmod(0o755)
    _file(ray_tmp).write_text(f"127.0.0.1:{port}")
    found = find_running_cluster(explicit=False)
    assert (found.address, found.source, found.owner) == (f"127.0.0.1:{port}", str(_file(ray_tmp)), ME)


def test_a_file_in_ray_s_0777_directory_is_not_used(ray_tmp: Path, server, caplog) -> None:
    port = server(None)
    _file(ray_tmp).write_text(f"127.0.0.1:{port}")
    with caplog.at_level(logging.WARNING):
        assert find_running_cluster(explicit=False) is None
    [line] = caplog.messages
    assert (
        line.startswith(f"not joining the Ray cluster the address file {_file(ray_tmp)} names: ")
        and "ray above it is writable by every user" in line
        and f"give --address 127.0.0.1:{port}" in line
    )
    with pytest.raises(
        ClusterUnreachableError,
        match=f"--address auto does not use the Ray address file .*--address "
        f"127.0.0.1:{port}, once you know whose it is",
    ):
        find_running_cluster(explicit=True)


def test_a_stale_file_naming_a_port_nothing_listens_on_is_no_cluster(ray_tmp: Path) -> None:
    (ray_tmp / "ray").chmod(0o755)
    _file(ray_tmp).write_text("127.0.0.1:1")
    assert find_running_cluster(explicit=False) is None


def test_a_file_that_is_not_an_address_is_said_escaped(ray_tmp: Path, caplog) -> None:
    (ray_tmp / "ray").chmod(0o755)
    _file(ray_tmp).write_text("\x1b[2Jerror: forged\n127.0.0.1:6379")
    assert find_running_cluster(explicit=False) is None
    assert "\\x1b[2Jerror: forged\\n127.0.0.1:6379" in caplog.text and "\x1b" not in caplog.text


def test_under_sudo_the_file_is_never_used(ray_tmp: Path, server, monkeypatch, caplog) -> None:
    if os.geteuid() != 0:
        pytest.skip("sudo makes root: the case needs the test to run as root (CI does)")
    port = server(None)
    (ray_tmp / "ray").chmod(0o755)
    _file(ray_tmp).write_text(f"127.0.0.1:{port}")
    monkeypatch.setenv("SUDO_UID", "1000")
    assert find_running_cluster(explicit=False) is None
    assert "batchplan runs under sudo" in caplog.text
    with pytest.raises(ClusterUnreachableError, match="batchplan runs under sudo"):
        find_running_cluster(explicit=True)
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")  # named by the user: still their choice
    assert find_running_cluster(explicit=False).address == f"127.0.0.1:{port}"


def test_another_user_s_file_or_gcs_is_not_used(ray_tmp: Path, caplog) -> None:
    uid, _ = other_uid_gid()
    (ray_tmp / "ray").chmod(0o755)
    with other_user_listener() as port:
        _file(ray_tmp).write_text(
            f"127.0.0.1:{port}"
        )  # root's own file (stale), but nobody listens there now
        assert find_running_cluster(explicit=False) is None
        assert f"a GCS of uid {uid} (nobody) listens, not one of this user's or root's" in caplog.text
        _file(ray_tmp).unlink()
        (ray_tmp / "ray").chmod(0o777)
        write_as_other_user(_file(ray_tmp), f"127.0.0.1:{port}")  # nobody's file in Ray's shared directory
        (ray_tmp / "ray").chmod(0o755)
        caplog.clear()
        assert find_running_cluster(explicit=False) is None
        assert f"is owned by uid {uid} (nobody)" in caplog.text
