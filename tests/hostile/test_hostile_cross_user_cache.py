"""Another local user and root's profile cache (issue #34, item 3): in each of the five set-ups the round found,
``nobody`` plants a forged A100 entry (a plausible curve, its checksum recomputed: one the cache's own checks pass,
as ``tests/hostile/test_hostile_cache.py`` shows) and root plans. The forgery must change no plan: a cache another
user could write is refused in one line naming the directory at fault and the fix, and an entry another user could
write inside root's own cache is ignored, reported and profiled again.

Run as root with ``nobody`` acting through ``setpriv`` (``tests/other_user.py``); skipped with the reason
elsewhere, never in CI.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hostile.test_hostile_cache import MODEL, TWO_TYPES, _five_times_larger_and_slower, _tamper_a100
from tests.other_user import other_uid_gid, run_as_other_user, shared_place, write_as_other_user
from tests.planner.cli_helpers import assert_ok, assert_user_error, parse_json_stdout, run_cli

pytestmark = pytest.mark.slow  # a clean plan (an estimate, 5-15 s), then one plan per case


@pytest.fixture(scope="module")
def place() -> Iterator[Path]:
    with shared_place() as root:
        (root / "two.yaml").write_text(TWO_TYPES)
        yield root


@pytest.fixture(scope="module")
def clean(place: Path) -> tuple[dict, dict[str, dict], dict]:
    """A plan made with an empty cache of root's; the entries it left (gpu type -> entry); the forged A100 entry."""
    cache = place / "root-cache"
    plan = _plan(place, cache)
    entries = {}
    for path in cache.glob("*.json"):
        entry = json.loads(path.read_text())
        entries[entry["profile"]["gpu"]] = entry
    shutil.rmtree(cache)
    return plan, entries, _tamper_a100(entries, _five_times_larger_and_slower)


def _plan_run(place: Path, *args, env: dict | None = None):
    return run_cli(
        "plan",
        "--no-ray",
        "--cluster",
        place / "two.yaml",
        *MODEL,
        "--json",
        "--no-write",
        *args,
        cwd=place,
        env=env,
    )


def _plan(place: Path, cache: Path) -> dict:
    result = _plan_run(place, "--cache-dir", cache)
    assert_ok(result)
    return parse_json_stdout(result)


def _caps(plan: dict) -> dict[str, int]:
    return {r["gpu"]: r["max_batch"] for r in plan["ranks"]}


def _plant(directory: Path, entries: dict[str, dict], forged: dict) -> None:
    """The clean T4 entry and the forged A100 entry, written into ``directory`` by the other user."""
    write_as_other_user(directory / f"{entries['T4']['key']}.json", json.dumps(entries["T4"]))
    write_as_other_user(directory / f"{forged['key']}.json", json.dumps(forged))


def _other_users_dir(path: Path, *, mode: int = 0o755) -> Path:
    uid, gid = other_uid_gid()
    path.mkdir()
    os.chown(path, uid, gid)
    path.chmod(mode)
    return path


def test_the_forgery_would_move_the_plan_where_it_is_trusted(place: Path, clean, tmp_path: Path) -> None:
    """The control: in root's own cache the forged entry passes every check and moves the A100's cap."""
    clean_plan, entries, forged = clean
    cache = tmp_path / "cache"
    cache.mkdir()
    for entry in (entries["T4"], forged):
        (cache / f"{entry['key']}.json").write_text(json.dumps(entry))
    assert _caps(_plan(place, cache))["A100-SXM4-80GB"] < _caps(clean_plan)["A100-SXM4-80GB"] / 3


def test_a_cache_dir_owned_by_another_user_is_refused(place: Path, clean) -> None:
    _, entries, forged = clean
    cache = _other_users_dir(place / "nobodys-cache")
    _plant(cache, entries, forged)
    result = _plan_run(place, "--cache-dir", cache)
    assert_user_error(result, 2, str(cache), "owned by uid 65534 (nobody)", "--cache-dir", "--no-cache")


def test_a_group_writable_cache_dir_is_refused(place: Path, clean) -> None:
    _, entries, forged = clean
    cache = place / "group-cache"
    cache.mkdir()
    os.chown(cache, 0, other_uid_gid()[1])  # root's, with nobody's group allowed to write
    cache.chmod(0o775)
    _plant(cache, entries, forged)
    result = _plan_run(place, "--cache-dir", cache)
    assert_user_error(result, 2, str(cache), "writable by its group", "chmod go-w")


def test_root_s_cache_renamed_away_under_a_world_writable_parent_is_refused(place: Path, clean) -> None:
    _, entries, forged = clean
    parent = place / "shared"
    parent.mkdir()
    parent.chmod(0o777)  # not sticky: anyone may rename what is in it
    cache = parent / "cache"
    cache.mkdir()
    for entry in entries.values():
        (cache / f"{entry['key']}.json").write_text(json.dumps(entry))
    run_as_other_user(["sh", "-c", 'mv "$1/cache" "$1/roots" && mkdir "$1/cache"', "sh", str(parent)])
    _plant(cache, entries, forged)
    result = _plan_run(place, "--cache-dir", cache)
    assert_user_error(result, 2, str(cache), f"{parent} above it is writable by every user")


def test_another_user_s_home_under_sudo_without_h_is_refused(place: Path, clean) -> None:
    _, entries, forged = clean
    home = _other_users_dir(place / "home-of-nobody")
    run_as_other_user(["mkdir", "-p", str(home / ".cache" / "batchplan" / "profiles")])
    _plant(home / ".cache" / "batchplan" / "profiles", entries, forged)
    env = {"HOME": str(home), "SUDO_USER": "nobody", "XDG_CACHE_HOME": ""}  # what `sudo batchplan` keeps
    result = _plan_run(place, env=env)
    assert_user_error(result, 2, str(home), "owned by uid 65534 (nobody)", "sudo -H")


def test_an_entry_others_can_write_in_root_s_cache_is_ignored_reported_and_profiled_again(
    place: Path, clean, tmp_path: Path
) -> None:
    clean_plan, entries, forged = clean
    cache = place / "roots-cache"
    cache.mkdir()
    for entry in entries.values():
        (cache / f"{entry['key']}.json").write_text(json.dumps(entry))
    a100 = cache / f"{forged['key']}.json"
    a100.chmod(0o666)
    write_as_other_user(a100, json.dumps(forged))  # nobody rewrites it in place: still root's file
    assert a100.stat().st_uid == 0

    plan = _plan(place, cache)
    assert _caps(plan) == _caps(clean_plan)
    [reported] = [w for w in plan["warnings"] if a100.name in w]
    assert "writable by every user" in reported and "ignoring it and profiling again" in reported, reported
    assert json.loads(a100.read_text())["profile"] == entries["A100-SXM4-80GB"]["profile"]  # profiled again
    assert a100.stat().st_mode & 0o777 == 0o644
    again = _plan(place, cache)
    assert not [w for w in again["warnings"] if "cache" in w], again["warnings"]
