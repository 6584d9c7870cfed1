"""Hostile and damaged profile-cache entries, through ``batchplan plan`` as a user runs it twice: an entry whose
numbers are impossible, or that describes another GPU than its key, is ignored, reported and rewritten, and
the plan is the one a clean cache gives. Unusable cache paths are one-line errors."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.planner.cli_helpers import assert_ok, assert_user_error, parse_json_stdout, run_cli

#: the tiny convnet at 64×64: about 4× the activations of 32×32, so even an A100's cap stays under the
#: 65,536 clamp and a tampered memory curve shows in the caps
MODEL = ("--model", "tests.planner.tiny_models:convnet", "--input-shape", "3,64,64")
TWO_TYPES = """name: two-types
nodes:
  - name: node-a100
    gpus: [{type: A100-SXM4-80GB, count: 1}]
  - name: node-t4
    gpus: [{type: T4, count: 1}]
"""


def _plan(tmp_path: Path, cache: Path) -> dict:
    result = run_cli(
        "plan",
        "--no-ray",
        "--cluster",
        tmp_path / "two.yaml",
        "--cache-dir",
        cache,
        *MODEL,
        "--json",
        "--no-write",
        cwd=tmp_path,
    )
    assert_ok(result)
    return parse_json_stdout(result)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, dict[str, dict]]:
    """A plan made with an empty cache, and the cache entries it left: gpu type -> entry."""
    where = tmp_path_factory.mktemp("clean_cache")
    (where / "two.yaml").write_text(TWO_TYPES)
    plan = _plan(where, where / "cache")
    entries = {}
    for path in (where / "cache").glob("*.json"):
        entry = json.loads(path.read_text())
        entries[entry["profile"]["gpu"]] = entry
    assert sorted(entries) == ["A100-SXM4-80GB", "T4"]
    return where, plan, entries


def _checksum(profile: dict) -> str:
    """The cache's checksum, recomputed as anyone can: a plain SHA-256 of the canonical JSON."""
    return hashlib.sha256(json.dumps(profile, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _caps(plan: dict) -> dict[str, int]:
    return {r["gpu"]: r["max_batch"] for r in plan["ranks"]}


def _tamper_a100(entries: dict[str, dict], edit: Callable[[dict, dict[str, dict]], dict]) -> dict:
    entry = json.loads(json.dumps(entries["A100-SXM4-80GB"]))
    entry = edit(entry, entries)
    entry["checksum"] = _checksum(entry["profile"])
    return entry


def _negative_bytes_per_sample(entry: dict, _) -> dict:
    entry["profile"]["memory_fit"]["bytes_per_sample"] = -abs(
        entry["profile"]["memory_fit"]["bytes_per_sample"]
    )
    return entry


def _oom_at_zero(entry: dict, _) -> dict:
    entry["profile"]["oom_batch"] = 0
    return entry


def _nan_fit(entry: dict, _) -> dict:
    entry["profile"]["time_fit"]["s_per_sample"] = float("nan")
    return entry


def _t4_profile_under_a100_key(_: dict, entries: dict[str, dict]) -> dict:
    swapped = json.loads(json.dumps(entries["T4"]))
    swapped["key"] = entries["A100-SXM4-80GB"]["key"]
    return swapped


def _faster_than_the_bandwidth(entry: dict, _) -> dict:
    entry["profile"]["time_fit"] = {"kind": "affine", "intercept_s": 1e-15, "s_per_sample": 1e-15}
    return entry


def _memory_below_the_weights(entry: dict, _) -> dict:
    profile = entry["profile"]
    assert profile["breakdown_bytes"]["parameters"] > 64 * 1000
    profile["memory_points"] = [[b, 1000 * b] for b, _ in profile["memory_points"]]
    profile["memory_fit"] = {"kind": "affine", "intercept_bytes": 0.0, "bytes_per_sample": 1000.0}
    profile["min_memory_bytes"] = 0
    return entry


def _fit_contradicting_its_points(entry: dict, _) -> dict:
    """Issue #34: ``bytes_per_sample`` 1.0 beside points of megabytes per sample (an A100 cap of 65,536)."""
    entry["profile"]["memory_fit"]["bytes_per_sample"] = 1.0
    return entry


def _escape_in_a_note(entry: dict, _) -> dict:
    """Issue #34: a note holding ESC made every later ``plan -o`` fail, naming neither the cache nor the entry."""
    entry["profile"]["notes"] = [*entry["profile"].get("notes", []), "measured \x1b[2Jon a quiet GPU"]
    return entry


CASES = {
    "a fit that contradicts its own points": _fit_contradicting_its_points,
    "ESC in a note": _escape_in_a_note,
    "a step faster than the GPU's bandwidth allows": _faster_than_the_bandwidth,
    "memory below the weights": _memory_below_the_weights,
    "negative bytes_per_sample": _negative_bytes_per_sample,
    "oom_batch 0": _oom_at_zero,
    "NaN in the time fit": _nan_fit,
    "a T4 profile under the A100's key": _t4_profile_under_a100_key,
}


def _cache_with_a_tampered_a100(tmp_path: Path, entries: dict, tamper) -> tuple[Path, Path]:
    """The two-type cluster config, and a cache of the clean entries whose A100 entry ``tamper`` rewrote:
    the cache directory and that entry's path."""
    (tmp_path / "two.yaml").write_text(TWO_TYPES)
    cache = tmp_path / "cache"
    cache.mkdir()
    for entry in entries.values():
        (cache / f"{entry['key']}.json").write_text(json.dumps(entry))
    a100_path = cache / f"{entries['A100-SXM4-80GB']['key']}.json"
    a100_path.write_text(json.dumps(_tamper_a100(entries, tamper)))
    return cache, a100_path


@pytest.mark.slow  # estimates several GPU types
@pytest.mark.parametrize("case", sorted(CASES))
def test_an_impossible_cache_entry_is_ignored_reported_and_rewritten(clean, tmp_path, case) -> None:
    where, clean_plan, entries = clean
    cache, a100_path = _cache_with_a_tampered_a100(tmp_path, entries, CASES[case])

    plan = _plan(tmp_path, cache)

    assert _caps(plan) == _caps(clean_plan), case
    assert {r["gpu"] for r in plan["ranks"]} == {"A100-SXM4-80GB", "T4"}
    reported = [w for w in plan["warnings"] if a100_path.name in w]
    assert len(reported) == 1 and "ignor" in reported[0], plan["warnings"]
    rewritten = json.loads(a100_path.read_text())
    assert rewritten["profile"]["gpu"] == "A100-SXM4-80GB"
    assert rewritten["profile"]["memory_fit"] == entries["A100-SXM4-80GB"]["profile"]["memory_fit"]
    again = _plan(tmp_path, cache)  # the rewritten entry is trusted: no warning the second time
    assert not [w for w in again["warnings"] if "cache" in w]
    assert _caps(again) == _caps(clean_plan)


def test_a_directory_at_an_entry_path_is_a_one_line_error(clean, tmp_path) -> None:
    _, _, entries = clean
    (tmp_path / "two.yaml").write_text(TWO_TYPES)
    cache = tmp_path / "cache"
    (cache / f"{entries['T4']['key']}.json").mkdir(parents=True)
    result = run_cli(
        "plan",
        "--no-ray",
        "--cluster",
        tmp_path / "two.yaml",
        "--cache-dir",
        cache,
        *MODEL,
        "--no-write",
        cwd=tmp_path,
    )
    assert_user_error(result, 2, f"{entries['T4']['key']}.json", "directory")


def test_a_regular_file_as_cache_dir_is_a_one_line_error(tmp_path) -> None:
    (tmp_path / "two.yaml").write_text(TWO_TYPES)
    (tmp_path / "not-a-dir").write_text("x")
    result = run_cli(
        "plan",
        "--no-ray",
        "--cluster",
        tmp_path / "two.yaml",
        "--cache-dir",
        tmp_path / "not-a-dir",
        *MODEL,
        "--no-write",
        cwd=tmp_path,
    )
    assert_user_error(result, 2, "--cache-dir", "not-a-dir", "not a directory")


def test_a_huge_or_deep_cache_entry_is_ignored_not_parsed(clean, tmp_path) -> None:
    where, clean_plan, entries = clean
    (tmp_path / "two.yaml").write_text(TWO_TYPES)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / f"{entries['T4']['key']}.json").write_text("[" * 100_000 + "]" * 100_000)
    with (cache / f"{entries['A100-SXM4-80GB']['key']}.json").open("wb") as handle:
        handle.truncate(200 << 20)  # sparse: no disk, and must cost no memory
    plan = _plan(tmp_path, cache)
    assert _caps(plan) == _caps(clean_plan)
    assert len([w for w in plan["warnings"] if "cache entry" in w]) == 2, plan["warnings"]


def _five_times_larger_and_slower(entry: dict, _) -> dict:
    """The curve of a model 5× the size: every figure of memory and time ×5. Physically possible (slower and
    larger is never refused), checksum valid: only profiling again shows it is not this job's."""
    profile = entry["profile"]
    profile["memory_points"] = [[b, 5 * v] for b, v in profile["memory_points"]]
    profile["memory_fit"] = {k: (5 * v if k != "kind" else v) for k, v in profile["memory_fit"].items()}
    profile["time_points"] = [[b, 5 * t] for b, t in profile["time_points"]]
    profile["time_fit"] = {k: (5 * v if k != "kind" else v) for k, v in profile["time_fit"].items()}
    profile["min_memory_bytes"] = 5 * profile["min_memory_bytes"]
    return entry


def _plan_verified(tmp_path: Path, cache: Path) -> dict:
    result = run_cli(
        "plan",
        "--no-ray",
        "--cluster",
        tmp_path / "two.yaml",
        "--cache-dir",
        cache,
        *MODEL,
        "--json",
        "--no-write",
        "--verify-cache",
        cwd=tmp_path,
    )
    assert_ok(result)
    return parse_json_stdout(result)


@pytest.mark.slow  # estimates several GPU types
def test_a_plausible_forgery_is_trusted_unless_verified_then_refused_with_both_figures(
    clean, tmp_path
) -> None:
    _, clean_plan, entries = clean
    cache, a100_path = _cache_with_a_tampered_a100(tmp_path, entries, _five_times_larger_and_slower)

    trusted = _plan(tmp_path, cache)  # what the cache's own checks cannot see
    assert _caps(trusted)["A100-SXM4-80GB"] < _caps(clean_plan)["A100-SXM4-80GB"] / 3
    assert not [w for w in trusted["warnings"] if "cache" in w]

    plan = _plan_verified(tmp_path, cache)
    assert _caps(plan) == _caps(clean_plan)
    [refused] = [w for w in plan["warnings"] if a100_path.name in w and "disagrees" in w]
    assert "estimate profile of A100-SXM4-80GB" in refused and "ignoring it and profiling again" in refused
    assert "cached vs" in refused and "(×5.00, allowed ×1.02)" in refused, refused  # both figures, the range
    [t4_checked] = [w for w in plan["warnings"] if w.startswith("T4: the cached estimate profile")]
    assert "agrees with a fresh estimate" in t4_checked
    assert json.loads(a100_path.read_text())["profile"] == entries["A100-SXM4-80GB"]["profile"]  # rewritten

    again = _plan_verified(tmp_path, cache)
    assert not [w for w in again["warnings"] if "disagrees" in w]
    assert len([w for w in again["warnings"] if "agrees with a fresh estimate" in w]) == 2


def test_verify_cache_without_a_cache_is_a_one_line_error(tmp_path) -> None:
    (tmp_path / "two.yaml").write_text(TWO_TYPES)
    for command in (
        ("plan", "--no-ray", "--cluster", tmp_path / "two.yaml", "--no-write"),
        ("profile", "--gpu", "T4"),
    ):
        result = run_cli(*command, *MODEL, "--no-cache", "--verify-cache", cwd=tmp_path)
        assert_user_error(result, 2, "--verify-cache", "--no-cache")
