"""``planner/trust.py``: OpenSSH's StrictModes for what batchplan reads back (issue #34, item 3): owner and mode
of the file (on its open descriptor) and of every directory above it, never through a link."""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest

from planner.trust import (
    UntrustedPathError,
    make_trusted_dir,
    open_trusted,
    read_trusted,
    trusted_dir,
    write_trusted,
)
from tests.other_user import other_uid_gid, reachable_place

WHAT = {"what": "the test cache", "fix": "the fix"}


@pytest.fixture
def private() -> Iterator[Path]:
    """A directory of this user's, mode 0755, where every user can reach it (not under pytest's 0700 ones)."""
    with reachable_place() as place:
        directory = place / "private"
        directory.mkdir(mode=0o755)
        directory.chmod(0o755)
        yield directory


def test_a_private_directory_and_its_own_files_are_trusted(private: Path) -> None:
    (private / "entry.json").write_text("{}")
    (private / "entry.json").chmod(0o644)
    assert trusted_dir(private, **WHAT) == private.resolve()
    assert read_trusted(private / "entry.json", max_bytes=10, **WHAT) == b"{}"
    with open_trusted(private / "entry.json", **WHAT) as handle:
        assert handle.read() == b"{}"
    assert read_trusted(private / "missing.json", max_bytes=10, **WHAT) is None
    assert read_trusted(private / "no" / "such" / "dir.json", max_bytes=10, **WHAT) is None


@pytest.mark.parametrize(
    ("mode", "who"), [(0o775, "its group"), (0o777, "every user"), (0o1777, "every user")]
)
def test_a_directory_others_can_write_is_refused_sticky_or_not(private: Path, mode: int, who: str) -> None:
    private.chmod(mode)
    with pytest.raises(
        UntrustedPathError, match=f"the test cache {private} is writable by {who} .*\\(the fix\\)$"
    ):
        trusted_dir(private, **WHAT)


def test_a_directory_above_others_can_write_is_refused_unless_sticky(private: Path) -> None:
    inner = private / "cache"
    inner.mkdir()
    private.chmod(0o777)
    with pytest.raises(
        UntrustedPathError, match=f"{inner}/entry.json: {private} above it is writable by every"
    ) as raised:
        read_trusted(inner / "entry.json", max_bytes=10, **WHAT)
    assert raised.value.in_directory and raised.value.path == str(private)
    private.chmod(0o1777)  # /tmp's mode: no one else may rename or remove what is ours
    assert trusted_dir(inner, **WHAT) == inner.resolve()


@pytest.mark.parametrize("mode", [0o664, 0o666, 0o646])
def test_an_entry_others_can_write_is_refused_alone(private: Path, mode: int) -> None:
    entry = private / "entry.json"
    entry.write_text("{}")
    entry.chmod(mode)
    with pytest.raises(UntrustedPathError, match=f"the test cache {entry} is writable by") as raised:
        read_trusted(entry, max_bytes=10, **WHAT)
    assert not raised.value.in_directory


def test_links_fifos_and_directories_are_not_entries(private: Path, tmp_path: Path) -> None:
    (tmp_path / "elsewhere").write_text("{}")
    (private / "link.json").symlink_to(tmp_path / "elsewhere")
    os.mkfifo(private / "fifo.json")  # opened without blocking: nobody writes it
    (private / "dir.json").mkdir()
    for name, problem in (
        ("link.json", "is a symbolic link"),
        ("fifo.json", "is not a regular file"),
        ("dir.json", "is not a regular file"),
    ):
        with pytest.raises(UntrustedPathError, match=problem):
            read_trusted(private / name, max_bytes=10, **WHAT)


def test_a_link_to_a_private_directory_is_judged_by_where_it_points(private: Path, tmp_path: Path) -> None:
    (tmp_path / "cache-link").symlink_to(private)
    assert trusted_dir(tmp_path / "cache-link", **WHAT) == private.resolve()
    private.chmod(0o777)
    with pytest.raises(UntrustedPathError, match=str(private)):
        trusted_dir(tmp_path / "cache-link", **WHAT)


def test_an_entry_over_the_size_limit_is_refused_before_it_is_read(private: Path) -> None:
    with (private / "big.json").open("wb") as handle:
        handle.truncate(1 << 30)  # sparse
    with pytest.raises(Exception, match="1073741824 bytes, over the limit of 100 bytes"):
        read_trusted(private / "big.json", max_bytes=100, **WHAT)


def test_made_directories_and_written_files_are_trusted_whatever_the_umask(private: Path) -> None:
    old = os.umask(0)
    try:
        made = make_trusted_dir(private / "a" / "b", **WHAT)
        written = write_trusted(made / "entry.json", "{}", **WHAT)
    finally:
        os.umask(old)
    assert (private / "a").stat().st_mode & 0o777 == 0o755 and made.stat().st_mode & 0o777 == 0o755
    assert written.stat().st_mode & 0o777 == 0o644
    assert read_trusted(written, max_bytes=10, **WHAT) == b"{}"


def test_write_trusted_replaces_a_link_rather_than_writing_through_it(private: Path, tmp_path: Path) -> None:
    target = tmp_path / "not-a-cache-file"
    target.write_text("keep")
    (private / "entry.json").symlink_to(target)
    write_trusted(private / "entry.json", "{}", **WHAT)
    assert target.read_text() == "keep" and not (private / "entry.json").is_symlink()


def test_another_user_s_directory_or_entry_is_refused(private: Path) -> None:
    uid, gid = other_uid_gid()
    entry = private / "entry.json"
    entry.write_text("{}")
    os.chown(entry, uid, gid)
    with pytest.raises(UntrustedPathError, match=f"{entry} is owned by uid {uid} \\(nobody\\), not by root"):
        read_trusted(entry, max_bytes=10, **WHAT)
    os.chown(private, uid, gid)
    with pytest.raises(UntrustedPathError, match=f"{private} above it is owned by uid {uid}") as raised:
        make_trusted_dir(private / "new", **WHAT)
    assert not (private / "new").exists()  # nothing is created under another user's directory
    again = pickle.loads(pickle.dumps(raised.value))
    assert (str(again), again.in_directory) == (str(raised.value), True)


def test_a_directory_others_can_write_below_a_private_one_is_out_of_their_reach() -> None:
    """Ray makes its ``<tmp>/ray`` 0777 whoever it belongs to: under a private directory (0700, this user's) no
    other user can reach it, so a file there is this user's to trust."""
    with reachable_place() as place:
        private = place / "private"
        (private / "ray").mkdir(parents=True)
        private.chmod(0o700)
        (private / "ray").chmod(0o777)
        (private / "ray" / "address").write_text("x")
        assert read_trusted(private / "ray" / "address", max_bytes=10, **WHAT) == b"x"
        private.chmod(0o701)  # others may pass through: no longer private
        with pytest.raises(UntrustedPathError, match="ray above it is writable by every user"):
            read_trusted(private / "ray" / "address", max_bytes=10, **WHAT)
