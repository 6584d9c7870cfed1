"""``batchplan preflight`` driven in subprocesses as a scheduler would: exit 0 (go), 1 (no-go, with the failing
check named), 2 (bad input), the same codes with ``--json``, whose document follows ``batchplan/preflight@1``.
Planned in-process (``--no-ray``) on the tiny test CNN.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.planner.cli_helpers import (
    DEMO_MIXED,
    HOMOGENEOUS,
    SHARED_NODE,
    TINY_MODEL,
    assert_ok,
    assert_user_error,
    check_plan,
    check_preflight,
    describe,
    parse_json_stdout,
    run_cli,
)

#: the checks of a run that produced a plan with a global batch, in order
#: the checks of a go, in order; "user_code" first: the runs below build a user factory (TINY_MODEL)
ALL_CHECKS = [
    "user_code",
    "cluster_reachable",
    "nodes_present",
    "gpus_present",
    "idle_thresholds",
    "versions_consistent",
    "plan_feasible",
    "min_batch_fits",
    "global_batch_reachable",
    "imbalance",
    "slow_gpus_worth_it",
]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("profile_cache")


def _preflight(config: Path, cache: Path, *extra: str) -> tuple[str, ...]:
    return ("preflight", "--no-ray", "--cluster", str(config), "--cache-dir", str(cache), *TINY_MODEL, *extra)


def _failed(doc: dict) -> list[str]:
    return [c["name"] for c in doc["checks"] if not c["ok"]]


def test_homogeneous_cluster_with_a_reachable_global_batch_is_go(tmp_path: Path, cache_dir: Path) -> None:
    result = run_cli(
        *_preflight(HOMOGENEOUS, cache_dir, "--global-batch", "256", "-o", "go-plan.json"), cwd=tmp_path
    )
    assert_ok(result, 0)
    lines = result.stdout.splitlines()
    assert lines[-1] == "preflight: go"
    assert [line.split()[1].rstrip(":") for line in lines[:-1]] == ALL_CHECKS
    assert all(line.startswith("ok  ") for line in lines[:-1]), describe(result)
    assert "16 ranks, global batch 256 (accumulate 1)" in result.stdout
    plan = check_plan(json.loads((tmp_path / "go-plan.json").read_text()))
    assert plan["world_size"] == 16 and plan["global_batch"] == 256
    assert {r["batch"] for r in plan["ranks"]} == {16}, "one GPU type: every rank gets the same share"


def test_json_go_carries_the_plan(tmp_path: Path, cache_dir: Path) -> None:
    result = run_cli(
        *_preflight(
            HOMOGENEOUS,
            cache_dir,
            "--global-batch",
            "256",
            "--expect-gpus",
            "16",
            "--expect-nodes",
            "2",
            "--json",
        ),
        cwd=tmp_path,
    )
    assert_ok(result, 0)
    doc = check_preflight(parse_json_stdout(result))
    assert doc["ok"] is True and _failed(doc) == []
    assert [c["name"] for c in doc["checks"]] == ALL_CHECKS
    assert doc["plan"]["world_size"] == 16 and doc["plan"]["global_batch"] == 256
    assert not (tmp_path / "plan.json").exists(), "preflight writes a plan only with -o"


def test_zero_imbalance_allowed_on_a_mixed_cluster_is_no_go(tmp_path: Path, cache_dir: Path) -> None:
    result = run_cli(
        *_preflight(
            DEMO_MIXED,
            cache_dir,
            "--global-batch",
            "512",
            "--max-imbalance",
            "0",
            "--json",
            "-o",
            "never.json",
        ),
        cwd=tmp_path,
    )
    assert_ok(result, 1)
    doc = check_preflight(parse_json_stdout(result))
    assert doc["ok"] is False and _failed(doc) == ["imbalance"]
    detail = next(c["detail"] for c in doc["checks"] if c["name"] == "imbalance")
    assert "--max-imbalance" in detail
    assert doc["plan"] is not None and doc["plan"]["global_batch"] == 512
    assert max(r["idle_fraction"] for r in doc["plan"]["ranks"]) > 0
    assert not (tmp_path / "never.json").exists(), "-o writes the plan only when every check passes"


def test_more_gpus_expected_than_the_cluster_has_is_no_go(tmp_path: Path, cache_dir: Path) -> None:
    result = run_cli(*_preflight(DEMO_MIXED, cache_dir, "--expect-gpus", "100"), cwd=tmp_path)
    assert_ok(result, 1)
    lines = result.stdout.splitlines()
    assert lines[-1] == "preflight: no-go"
    [failing] = [line for line in lines if line.startswith("FAIL")]
    assert failing.startswith("FAIL  gpus_present: 6 of 6 GPU(s) selected"), describe(result)
    assert "100 required (fix: " in failing and failing.endswith("or lower --expect-gpus)"), describe(result)


def test_a_global_batch_no_split_reaches_is_no_go_without_a_plan(tmp_path: Path, cache_dir: Path) -> None:
    """6 ranks of at least 1 sample each cannot make a global batch of 3 (DESIGN: infeasible = exit 1)."""
    result = run_cli(*_preflight(DEMO_MIXED, cache_dir, "--global-batch", "3", "--json"), cwd=tmp_path)
    assert_ok(result, 1)
    doc = check_preflight(parse_json_stdout(result))
    assert doc["ok"] is False and doc["plan"] is None
    assert _failed(doc) == ["plan_feasible"]
    assert [c["name"] for c in doc["checks"]][-1] == "plan_feasible", "no plan: no plan-based checks"
    detail = doc["checks"][-1]["detail"]
    assert "global batch 3" in detail and "6" in detail


def test_a_busy_gpu_under_the_utilisation_threshold_is_no_go(tmp_path: Path, cache_dir: Path) -> None:
    """shared-node.yaml: GPU 3 is 97% busy, so --max-utilization 0.5 skips it and idle_thresholds fails."""
    result = run_cli(*_preflight(SHARED_NODE, cache_dir, "--max-utilization", "0.5", "--json"), cwd=tmp_path)
    assert_ok(result, 1)
    doc = check_preflight(parse_json_stdout(result))
    assert "idle_thresholds" in _failed(doc)
    detail = next(c["detail"] for c in doc["checks"] if c["name"] == "idle_thresholds")
    assert "lab-server GPU 3" in detail
    assert doc["plan"] is not None and [r["device_index"] for r in doc["plan"]["ranks"]] == [0, 1, 2]


def test_bad_input_with_json_still_exits_2_without_a_document(tmp_path: Path) -> None:
    result = run_cli(*_preflight(DEMO_MIXED, tmp_path, "--max-imbalance", "2", "--json"), cwd=tmp_path)
    assert_user_error(result, 2, "--max-imbalance")


def test_a_missing_cluster_file_with_json_exits_2(tmp_path: Path) -> None:
    result = run_cli(
        "preflight", "--no-ray", "--cluster", tmp_path / "gone.yaml", *TINY_MODEL, "--json", cwd=tmp_path
    )
    assert_user_error(result, 2, str(tmp_path / "gone.yaml"))
