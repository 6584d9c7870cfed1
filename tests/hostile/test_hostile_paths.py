"""Unusable paths and disks: a read-only or world-writable cache directory, a dangling link as ``--cache-dir``,
a full disk (``RLIMIT_FSIZE``), stdout on a full device, a symbolic-link loop as the plan, ``-o`` at a FIFO,
a device or stdout. Each is one ``error:`` line with exit 2 or a write through; never a traceback, a
half-written file, or a FIFO, device, link or stdout replaced by a regular file."""

from __future__ import annotations

import json
import os
import resource
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.other_user import reachable_place
from tests.planner.cli_helpers import (
    TINY_MODEL,
    assert_ok,
    assert_user_error,
    cli_env,
    describe,
    run_cli,
)

TWO_NODES = "nodes:\n  - {name: a, gpus: [{type: T4}]}\n  - {name: b, gpus: [{type: A10}]}\n"
#: a file-size limit under the size of a plan of two ranks (about 10 KB), over that of a cache entry (4 KB)
FILE_SIZE_LIMIT_BYTES = 6000


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A cluster config and a profile cache that already holds its profiles (so a run writes no entry)."""
    where = tmp_path_factory.mktemp("warm")
    (where / "two.yaml").write_text(TWO_NODES)
    cache = where / "cache"
    assert_ok(
        run_cli(
            "plan",
            "--no-ray",
            "--cluster",
            where / "two.yaml",
            "--cache-dir",
            cache,
            *TINY_MODEL,
            "--no-write",
            cwd=where,
        )
    )
    return where / "two.yaml", cache


def _plan(
    cwd: Path, config: Path, cache: Path | str, *args: str, **kwargs
) -> subprocess.CompletedProcess[str]:
    return run_cli(
        "plan", "--no-ray", "--cluster", config, "--cache-dir", cache, *TINY_MODEL, *args, cwd=cwd, **kwargs
    )


def _no_temporary_files(directory: Path) -> None:
    assert not [p.name for p in directory.iterdir() if p.name.endswith(".tmp")], sorted(os.listdir(directory))


@pytest.mark.slow
def test_a_world_writable_cache_directory_is_refused(warm, tmp_path) -> None:
    config, cache = warm
    with reachable_place() as place:  # where other users can reach it (pytest's tmp_path is private to root)
        shared = place / "shared"
        shutil.copytree(cache, shared)
        shared.chmod(0o777)
        assert_user_error(
            _plan(tmp_path, config, shared, "--no-write"), 2, str(shared), "writable by every user"
        )


def test_a_dangling_link_as_cache_dir_is_one_line(warm, tmp_path) -> None:
    config, _ = warm
    (tmp_path / "cache").symlink_to(tmp_path / "missing" / "cache")
    assert_user_error(
        _plan(tmp_path, config, tmp_path / "cache", "--no-write"), 2, "symbolic link", "does not exist"
    )
    assert (tmp_path / "cache").is_symlink() and not (tmp_path / "missing").exists()


@pytest.mark.slow
def test_a_read_only_cache_directory_is_one_line(warm, tmp_path) -> None:
    """Mode 0555 for a user; for root, who writes anywhere, a sysfs directory, where not even root creates a
    file (the error then comes when the fresh profile is stored, still one line)."""
    config, _ = warm
    if os.geteuid() == 0:
        read_only = Path("/sys/kernel")
    else:
        read_only = tmp_path / "cache"
        read_only.mkdir(mode=0o555)
    before = sorted(os.listdir(read_only))
    line = assert_user_error(_plan(tmp_path, config, read_only, "--no-write"), 2, str(read_only))
    assert "not writable" in line or "Permission denied" in line or "Read-only" in line, line
    assert sorted(os.listdir(read_only)) == before


@pytest.mark.slow  # a batchplan subprocess
def test_a_full_disk_leaves_the_old_plan_as_it_was(warm, tmp_path) -> None:
    config, cache = warm
    old = tmp_path / "plan.json"
    old.write_text('{"an": "old plan"}\n')

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT_BYTES, FILE_SIZE_LIMIT_BYTES))

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "planner.cli.main",
            "plan",
            "--no-ray",
            "--cluster",
            str(config),
            "--cache-dir",
            str(cache),
            *TINY_MODEL,
            "-o",
            str(old),
        ],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit_file_size,
    )
    assert_user_error(result, 2, "cannot write the plan", "File too large")
    assert old.read_text() == '{"an": "old plan"}\n'
    _no_temporary_files(tmp_path)


@pytest.mark.slow  # a batchplan subprocess
def test_stdout_on_a_full_device_is_one_line(warm, tmp_path) -> None:
    config, cache = warm
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "planner.cli.main",
                "plan",
                "--no-ray",
                "--cluster",
                str(config),
                "--cache-dir",
                str(cache),
                *TINY_MODEL,
                "--json",
                "--no-write",
            ],
            cwd=tmp_path,
            env=cli_env(),
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: cannot write the result to stdout")


def test_a_symlink_loop_as_the_plan_is_refused_and_stays_a_link(warm, tmp_path) -> None:
    config, cache = warm
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    assert_user_error(_plan(tmp_path, config, cache, "-o", loop), 2, "symbolic link loop")
    assert loop.is_symlink() and os.readlink(loop) == str(loop)
    assert_user_error(run_cli("show", loop, cwd=tmp_path), 2, str(loop))
    _no_temporary_files(tmp_path)


def test_a_link_to_a_plan_updates_its_target_and_stays_a_link(warm, tmp_path) -> None:
    config, cache = warm
    (tmp_path / "plans").mkdir()
    target = tmp_path / "plans" / "real.json"
    target.write_text("{}")
    link = tmp_path / "plan.json"
    link.symlink_to(target)
    assert_ok(_plan(tmp_path, config, cache, "-o", link))
    assert link.is_symlink()
    assert json.loads(target.read_text())["schema"] == "batchplan/plan@1"


def test_a_fifo_is_written_through_when_read_and_refused_when_not(warm, tmp_path) -> None:
    config, cache = warm
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    assert_user_error(_plan(tmp_path, config, cache, "-o", fifo), 2, "FIFO", "no process reads")
    received: list[str] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
    reader.start()
    try:
        assert_ok(_plan(tmp_path, config, cache, "-o", fifo))
    finally:
        if reader.is_alive():  # unblock a reader the run never wrote to
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=30)
    assert json.loads(received[0])["schema"] == "batchplan/plan@1"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_device_is_written_through(warm, tmp_path) -> None:
    config, cache = warm
    assert_ok(_plan(tmp_path, config, cache, "-o", "/dev/null"))
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.slow  # a batchplan subprocess
def test_dev_stdout_writes_through_a_pipe_and_refuses_a_regular_file(warm, tmp_path) -> None:
    config, cache = warm
    piped = _plan(tmp_path, config, cache, "-o", "/dev/stdout", "--json")
    assert_ok(piped)
    assert piped.stdout.count('"schema": "batchplan/plan@1"') == 2, describe(piped)  # the file, then --json
    out = tmp_path / "out.txt"
    with out.open("w") as handle:
        before = os.fstat(handle.fileno()).st_ino
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "planner.cli.main",
                "plan",
                "--no-ray",
                "--cluster",
                str(config),
                "--cache-dir",
                str(cache),
                *TINY_MODEL,
                "-o",
                "/dev/stdout",
                "--json",
            ],
            cwd=tmp_path,
            env=cli_env(),
            stdout=handle,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    line = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and "stdout" in line, result.stderr
    # not replaced (the same file), no plan written into it: it holds --json's error document, nothing else
    assert out.stat().st_ino == before
    assert json.loads(out.read_text()) == {
        "schema": "batchplan/error@1",
        "command": "plan",
        "error": line.removeprefix("error: "),
        "exit_code": 2,
    }
    _no_temporary_files(tmp_path)


def test_the_cache_is_created_private_whatever_the_umask(tmp_path) -> None:
    from planner.profiles.cache import ProfileCache
    from planner.profiles.key import key_of_inputs
    from tests.planner.profiles.test_profile_cache import inputs_for, make_profile

    cache = ProfileCache(tmp_path / "fresh" / "cache")
    inputs = inputs_for()
    previous = os.umask(0)
    try:
        path = cache.put(key_of_inputs(inputs), make_profile(per_sample=2**24), inputs=inputs)
    finally:
        os.umask(previous)
    assert not cache.directory.stat().st_mode & stat.S_IWOTH
    assert not path.stat().st_mode & (stat.S_IWOTH | stat.S_IWGRP)
    cache.check_directory()  # trusted on the next run
