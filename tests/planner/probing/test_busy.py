"""Busy GPUs (issue #15, item 3): a GPU other work keeps busy is skipped or planned at reduced speed, one line
says which, and preflight fails or warns with the reason. shared-node.yaml: 4 × RTX A6000, GPU 2 with 23.5 GiB
held at 10% utilisation, GPU 3 with 44 GiB held at 97%."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.codec import convert
from planner.probing.busy import MIN_SPEED_FACTOR, busy_summary, is_shared, speed_factor
from planner.profiles.profile import DeviceProfile
from tests.planner.cli_helpers import (
    SHARED_NODE,
    TINY_MODEL,
    assert_ok,
    check_plan,
    check_preflight,
    parse_json_stdout,
    run_cli,
)
from torchkit.hardware.nvml import GpuStats

GIB = 2**30


def stats(index: int, *, used_gib: float = 0.0, utilization: float | None = 0.0) -> GpuStats:
    return GpuStats(
        index=index,
        name="RTX-A6000",
        uuid="",
        pci_bus_id="",
        memory_total_bytes=48 * GIB,
        memory_used_bytes=int(used_gib * GIB),
        memory_free_bytes=int((48 - used_gib) * GIB),
        utilization_fraction=utilization,
        temperature_c=None,
        power_w=None,
        power_limit_w=None,
        processes=(),
    )


def test_speed_factor_is_the_share_of_time_other_work_leaves():
    assert speed_factor(stats(0)) == 1.0
    assert speed_factor(stats(0, utilization=0.1)) == pytest.approx(0.9)
    assert speed_factor(stats(0, utilization=1.0)) == MIN_SPEED_FACTOR
    assert speed_factor(stats(0, utilization=None)) == 1.0  # unknown (MIG): taken as idle


def test_shared_means_memory_held_or_busy():
    assert not is_shared(stats(0))
    assert is_shared(stats(0, used_gib=1.0)) and is_shared(stats(0, utilization=0.2))


def test_summary_is_one_line_naming_what_was_skipped_and_what_was_derated():
    line = busy_summary(
        [("lab", stats(3, used_gib=44, utilization=0.97), "busy")],
        [("lab", stats(2, used_gib=23.5, utilization=0.1), int(14.7 * GIB))],
        min_free_memory_fraction=0.2,
        max_utilization_fraction=0.5,
    )
    assert "\n" not in line
    assert line.startswith(
        "shared GPUs: skipped lab GPU 3 (97% busy, 44.0 of 48.0 GiB held); planned at "
        "reduced speed lab GPU 2 at 90% speed (10% busy, 23.5 of 48.0 GiB held; budget 14.7 GiB)"
    )
    assert "skip below 20% free memory or above 50% utilisation" in line
    assert busy_summary([], [], min_free_memory_fraction=0.2, max_utilization_fraction=0.5) is None


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("profile_cache")


def _plan(cache: Path, *extra: str, as_json: bool = True) -> tuple[str, ...]:
    return (
        "--no-ray",
        "--cluster",
        str(SHARED_NODE),
        "--cache-dir",
        str(cache),
        *TINY_MODEL,
        *(("--json",) if as_json else ()),
        *extra,
    )


def test_by_default_the_busy_gpu_is_skipped_and_the_shared_one_derated(
    cache_dir: Path, tmp_path: Path
) -> None:
    result = run_cli("plan", *_plan(cache_dir, "--no-write"), cwd=tmp_path)
    assert_ok(result)
    plan = check_plan(parse_json_stdout(result))
    assert [r["device_index"] for r in plan["ranks"]] == [0, 1, 2]
    (skipped,) = plan["excluded"]
    assert skipped["device_index"] == 3 and "97% utilisation > 50%" in skipped["reason"]
    assert "only 4.0 GiB of 48.0 GiB free (< 20%)" in skipped["reason"]
    speeds = [r["speed_factor"] for r in plan["ranks"]]
    assert speeds == pytest.approx([1.0, 1.0, 0.9])
    rank2 = plan["ranks"][2]
    profile = convert(DeviceProfile, plan["profiles"][rank2["profile"]], where="profile")
    assert rank2["predicted_step_time_s"] == pytest.approx(profile.step_time_s(rank2["batch"]) / 0.9)
    # held memory lowers the budget: 60% of what is free
    assert rank2["memory_budget_bytes"] == int(0.6 * (rank2["total_memory_bytes"] - round(23.5 * GIB)))
    (line,) = [w for w in plan["warnings"] if w.startswith("shared GPUs:")]
    assert "skipped lab-server GPU 3" in line and "lab-server GPU 2 at 90% speed" in line


def test_a_derated_gpu_gets_a_smaller_share_than_an_idle_one(cache_dir: Path, tmp_path: Path) -> None:
    # GPU 2 at 90% speed keeps below its cap like the others, but takes fewer samples for the same step time
    result = run_cli(
        "plan",
        *_plan(
            cache_dir,
            "--no-write",
            "--max-utilization",
            "1",
            "--min-memory-fraction",
            "0",
            "--global-batch",
            "64",
        ),
        cwd=tmp_path,
    )
    assert_ok(result)
    plan = check_plan(parse_json_stdout(result))
    batches = {r["device_index"]: r["batch"] for r in plan["ranks"]}
    assert batches[3] < batches[2] < min(batches[0], batches[1])


def test_preflight_fails_on_the_busy_gpu_and_warns_on_the_shared_one(cache_dir: Path, tmp_path: Path) -> None:
    result = run_cli("preflight", *_plan(cache_dir), cwd=tmp_path)
    assert result.returncode == 1
    checks = {c["name"]: c for c in check_preflight(parse_json_stdout(result))["checks"]}
    assert not checks["idle_thresholds"]["ok"]
    assert "lab-server GPU 3: busy: 97% utilisation > 50%" in checks["idle_thresholds"]["detail"]
    assert checks["shared_gpus"]["ok"] and checks["shared_gpus"]["detail"].startswith("warning: shared GPUs:")

    relaxed = run_cli(
        "preflight",
        *_plan(cache_dir, "--max-utilization", "1", "--min-memory-fraction", "0", as_json=False),
        cwd=tmp_path,
    )
    assert_ok(relaxed)
    assert (
        "warn  shared_gpus: shared GPUs: planned at reduced speed lab-server GPU 2 at 90% speed"
        in relaxed.stdout
    )
    assert "lab-server GPU 3 at 5% speed" in relaxed.stdout
