"""planner.profiles.cache: put/get round trip; corrupt entries (truncated JSON, wrong checksum, wrong schema,
wrong key, malformed profile) are ignored with a message in ``problems`` and rewritten by the next put;
writes are atomic."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import planner.files as files_module
import planner.store as store_module
from planner.codec import encode
from planner.errors import ConfigError
from planner.profiles.cache import CACHE_SCHEMA, ProfileCache, default_cache_dir
from planner.profiles.key import KEY_FIELDS, key_of_inputs
from planner.profiles.profile import DeviceProfile

GIB = 2**30


def inputs_for(gpu: str = "T4", fingerprint: str = "f0") -> dict[str, str]:
    """What a key is made of, for a profile of ``gpu`` as make_profile builds it."""
    values = (fingerprint, None, (3, 32, 32), None, "fp16", "sgd", gpu, "estimate", "affine", "2.13.0")
    return {name: str(value) for name, value in zip(KEY_FIELDS, values, strict=True)}


KEY = key_of_inputs(inputs_for())


def make_profile(gpu: str = "T4", per_sample: int = 2**24) -> DeviceProfile:
    return DeviceProfile.from_points(
        gpu=gpu,
        method="estimate",
        amp="fp16",
        memory_points=[(1, GIB + per_sample), (64, GIB + 64 * per_sample)],
        time_points=[(1, 0.011), (64, 0.075)],
        oom_batch=512,
        notes=["estimated"],
        breakdown_bytes={"parameters": 1000, "activations": 2000},
    )


@pytest.fixture
def cache(tmp_path) -> ProfileCache:
    return ProfileCache(tmp_path / "profiles")


def others(directory: Path, key: str = KEY) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name != f"{key}.json")


# ---------------------------------------------------------------------------------------------- round trip


def test_put_then_get_gives_the_same_profile(cache):
    profile = make_profile()
    path = cache.put(KEY, profile, inputs=inputs_for())
    assert path == cache.path_for(KEY) == cache.directory / f"{KEY}.json"
    assert cache.get(KEY) == profile
    assert cache.problems == []


def test_a_fresh_cache_object_reads_what_another_wrote(cache):
    cache.put(KEY, make_profile(), inputs=inputs_for())
    assert ProfileCache(cache.directory).get(KEY) == make_profile()


def test_an_entry_records_schema_key_checksum_and_profile(cache):
    cache.put(KEY, make_profile(), inputs=inputs_for())
    entry = json.loads(cache.path_for(KEY).read_text())
    assert set(entry) == {"schema", "key", "inputs", "checksum", "profile"}
    assert key_of_inputs(entry["inputs"]) == KEY
    assert entry["schema"] == CACHE_SCHEMA
    assert entry["key"] == KEY
    assert len(entry["checksum"]) == 64
    assert entry["profile"] == encode(make_profile())


def test_an_absent_key_is_none_and_not_a_problem(cache):
    assert cache.get("ffffffffffffffff") is None
    assert cache.problems == []


def test_put_creates_the_directory_and_leaves_no_temporary_file(tmp_path):
    cache = ProfileCache(tmp_path / "a" / "b")
    cache.put(KEY, make_profile(), inputs=inputs_for())
    assert others(cache.directory) == []


def test_put_replaces_an_entry_of_the_same_key(cache):
    cache.put(KEY, make_profile(per_sample=2**24), inputs=inputs_for())
    cache.put(KEY, make_profile(per_sample=2**25), inputs=inputs_for())
    assert cache.get(KEY) == make_profile(per_sample=2**25)
    assert others(cache.directory) == []


def test_keys_are_independent(cache):
    cache.put(key_of_inputs(inputs_for("T4")), make_profile("T4"), inputs=inputs_for("T4"))
    cache.put(key_of_inputs(inputs_for("L4")), make_profile("L4"), inputs=inputs_for("L4"))
    assert cache.get(key_of_inputs(inputs_for("T4"))).gpu == "T4"
    assert cache.get(key_of_inputs(inputs_for("L4"))).gpu == "L4"


# ---------------------------------------------------------------------------------------------- corrupt entries


def _truncate(path: Path) -> None:
    """Cut the entry's final closing brace (where an interrupted write would end); json says 'Expecting ...'."""
    text = path.read_text().rstrip()
    path.write_text(text[:-1])


def _edit(change):
    def corrupt(path: Path) -> None:
        entry = json.loads(path.read_text())
        change(entry)
        path.write_text(json.dumps(entry))

    return corrupt


def _tamper_profile(entry: dict) -> None:
    entry["profile"]["memory_fit"]["bytes_per_sample"] /= 2  # checksum left as it was


def _malformed_with_valid_checksum(entry: dict) -> None:
    del entry["profile"]["time_fit"]
    entry["checksum"] = store_module.checksum(entry["profile"])


CORRUPTIONS = {
    "truncated JSON": (_truncate, "Expecting"),
    "empty file": (lambda p: p.write_text(""), "Expecting value"),
    "not UTF-8": (lambda p: p.write_bytes(b"\xff\xfe\xfa"), "codec"),
    "wrong checksum": (_edit(_tamper_profile), "checksum mismatch"),
    "no checksum": (_edit(lambda e: e.pop("checksum")), "lacks the field 'checksum'"),
    "wrong schema": (
        _edit(lambda e: e.update(schema="batchplan/profile-cache@0")),
        "schema 'batchplan/profile-cache@0'",
    ),
    "wrong key": (_edit(lambda e: e.update(key="fedcba9876543210")), "entry is for key 'fedcba9876543210'"),
    "no profile": (_edit(lambda e: e.pop("profile")), "'profile'"),
    "malformed profile": (_edit(_malformed_with_valid_checksum), "lacks the field 'time_fit'"),
    "not an object": (lambda p: p.write_text("[1, 2, 3]"), "list"),
}


@pytest.mark.parametrize(("corrupt", "why"), CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_a_corrupt_entry_is_ignored_reported_and_rewritten_by_the_next_put(cache, caplog, corrupt, why):
    profile = make_profile()
    path = cache.put(KEY, profile, inputs=inputs_for())
    corrupt(path)

    with caplog.at_level(logging.WARNING, logger="planner.profiles.cache"):
        assert cache.get(KEY) is None
    assert len(cache.problems) == 1
    problem = cache.problems[0]
    assert problem.startswith(f"profile cache entry {path} is corrupt (")
    assert why in problem
    assert problem.endswith("ignoring it and profiling again")
    assert problem in caplog.text

    cache.put(KEY, profile, inputs=inputs_for())
    assert cache.get(KEY) == profile
    assert len(cache.problems) == 1  # the rewritten entry is trusted again
    assert others(cache.directory) == []


def test_an_entry_copied_under_another_key_is_not_trusted(cache):
    cache.put(KEY, make_profile(), inputs=inputs_for())
    other = "1111111111111111"
    cache.path_for(other).write_bytes(cache.path_for(KEY).read_bytes())
    assert cache.get(other) is None
    assert f"entry is for key '{KEY}'" in cache.problems[0]


def test_a_directory_in_place_of_an_entry_is_a_problem_not_a_crash(cache):
    cache.path_for(KEY).mkdir(parents=True)
    assert cache.get(KEY) is None
    assert len(cache.problems) == 1


# ---------------------------------------------------------------------------------------------- atomic writes


def test_a_failed_write_leaves_the_old_entry_intact_and_no_temporary_file(cache, monkeypatch):
    cache.put(KEY, make_profile(per_sample=2**24), inputs=inputs_for())
    before = cache.path_for(KEY).read_bytes()

    def failing_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files_module.os, "replace", failing_replace)
    with pytest.raises(ConfigError, match="cannot write the profile cache entry.*No space left"):
        cache.put(KEY, make_profile(per_sample=2**25), inputs=inputs_for())
    monkeypatch.undo()

    assert cache.path_for(KEY).read_bytes() == before
    assert others(cache.directory) == []
    assert cache.get(KEY) == make_profile(per_sample=2**24)


def test_a_write_interrupted_while_dumping_leaves_no_partial_entry(cache, monkeypatch):
    cache.put(KEY, make_profile(per_sample=2**24), inputs=inputs_for())
    before = cache.path_for(KEY).read_bytes()

    def interrupted_replace(src, dst):  # the temporary file is written; Ctrl-C comes before the rename
        assert Path(src).read_bytes() != before
        raise KeyboardInterrupt

    monkeypatch.setattr(files_module.os, "replace", interrupted_replace)
    with pytest.raises(KeyboardInterrupt):
        cache.put(KEY, make_profile(per_sample=2**25), inputs=inputs_for())
    monkeypatch.undo()

    assert cache.path_for(KEY).read_bytes() == before
    assert others(cache.directory) == []


# ---------------------------------------------------------------------------------------------- location


def test_default_cache_dir_prefers_batchplan_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("BATCHPLAN_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "mine"
    assert ProfileCache().directory == tmp_path / "mine"


def test_default_cache_dir_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.delenv("BATCHPLAN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "batchplan" / "profiles"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "batchplan" / "profiles"
