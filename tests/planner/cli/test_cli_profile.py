"""``batchplan profile`` driven in subprocesses: a catalog GPU estimated (no GPU needed) as JSON
(``batchplan/profile@1``) and as text with a picture, a GPU type a cluster config adds, and the exit code
when not even one sample fits. Each run builds the tiny test CNN and estimates it on fake tensors (4-8 s).
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.planner.cli_helpers import (
    TINY_MODEL,
    assert_ok,
    assert_user_error,
    check_profile,
    describe,
    is_png,
    parse_json_stdout,
    run_cli,
)
from torchkit.hardware.catalog import load_catalog


def test_t4_json_is_a_profile_document_whose_batch_fits_the_budget(tmp_path: Path) -> None:
    result = run_cli(
        "profile", "--cache-dir", tmp_path / "cache", "--gpu", "T4", *TINY_MODEL, "--json", cwd=tmp_path
    )
    assert_ok(result)
    doc = check_profile(parse_json_stdout(result))
    t4 = load_catalog().get("T4")
    assert doc["schema"] == "batchplan/profile@1"
    assert doc["gpu"] == "T4" and doc["device_index"] is None
    assert doc["total_memory_bytes"] == doc["available_memory_bytes"] == t4.memory_bytes
    assert doc["memory_budget_bytes"] == int(0.6 * t4.memory_bytes), "default fraction 0.60 (Ultralytics)"
    assert doc["chosen_batch"] > 0
    assert doc["predicted_memory_bytes"] <= doc["memory_budget_bytes"]
    assert doc["profile"]["method"] == "estimate"
    assert doc["profile"]["amp"] == "fp16", "auto AMP on a T4 (no bf16) is fp16"
    assert doc["job"]["model"] == "tests.planner.tiny_models:convnet" and doc["job"]["input_shape"] == [
        3,
        32,
        32,
    ]
    batches = [b for b, _ in doc["profile"]["memory_points"]]
    assert batches == sorted(batches) and len(batches) >= 2
    assert "estimating tests.planner.tiny_models:convnet on T4" in result.stderr


def test_text_with_plot_reports_a_batch_that_respects_fraction_and_multiple(tmp_path: Path) -> None:
    picture = tmp_path / "curves" / "a100.png"
    result = run_cli(
        "profile",
        "--cache-dir",
        tmp_path / "cache",
        "--gpu",
        "A100-SXM4-80GB",
        *TINY_MODEL,
        "--fraction",
        "0.3",
        "--multiple-of",
        "8",
        "--optimizer",
        "adamw",
        "--plot",
        picture,
        cwd=tmp_path,
    )
    assert_ok(result)
    assert is_png(picture)
    assert f"wrote {picture}" in result.stderr
    out = result.stdout
    assert out.startswith(
        "tests.planner.tiny_models:convnet on A100-SXM4-80GB, amp bf16, optimizer adamw, estimated"
    )
    assert "probe points" in out and "memory fit: " in out and "step time fit: " in out
    found = re.search(
        r"^batch (\d+): predicted ([\d.]+) GiB of a ([\d.]+) GiB budget \(30% of 80\.00 GiB", out, re.M
    )
    assert found, describe(result)
    batch, predicted_gib, budget_gib = int(found[1]), float(found[2]), float(found[3])
    assert batch > 0 and batch % 8 == 0
    assert predicted_gib <= budget_gib == 24.0


def test_a_gpu_type_added_by_a_cluster_config_can_be_profiled(tmp_path: Path) -> None:
    config = tmp_path / "custom.yaml"
    config.write_text(
        "name: custom\n"
        "gpu_types:\n"
        "  - {name: MY-GPU, memory_mib: 24576, fp16_tflops: 71, bf16_tflops: 71, fp32_tflops: 35.6,"
        " bandwidth_gb_s: 936}\n"
        "nodes:\n"
        "  - name: box\n"
        "    gpus: [{type: MY-GPU, count: 1}]\n"
    )
    result = run_cli(
        "profile",
        "--cache-dir",
        tmp_path / "cache",
        "--gpu",
        "MY-GPU",
        "--cluster",
        config,
        *TINY_MODEL,
        "--json",
        cwd=tmp_path,
    )
    assert_ok(result)
    doc = check_profile(parse_json_stdout(result))
    assert doc["gpu"] == "MY-GPU" and doc["total_memory_bytes"] == 24576 * 2**20
    assert doc["profile"]["amp"] == "bf16", "the config says the card has bf16"
    assert doc["chosen_batch"] > 0


def test_a_type_the_catalog_lacks_is_exit_2_even_with_a_cluster_config(tmp_path: Path) -> None:
    config = tmp_path / "plain.yaml"
    config.write_text("name: plain\nnodes:\n  - name: box\n    gpus: [{type: T4, count: 1}]\n")
    result = run_cli(
        "profile",
        "--cache-dir",
        tmp_path / "cache",
        "--gpu",
        "MY-GPU",
        "--cluster",
        config,
        *TINY_MODEL,
        cwd=tmp_path,
    )
    assert_user_error(result, 2, "MY-GPU", "gpu_types")


def test_bf16_on_a_t4_is_exit_2(tmp_path: Path) -> None:
    result = run_cli(
        "profile",
        "--cache-dir",
        tmp_path / "cache",
        "--gpu",
        "T4",
        *TINY_MODEL,
        "--amp",
        "bf16",
        cwd=tmp_path,
    )
    assert_user_error(result, 2, "--amp bf16", "T4")


def test_when_not_one_sample_fits_the_text_form_exits_1(tmp_path: Path) -> None:
    result = run_cli(
        "profile",
        "--cache-dir",
        tmp_path / "cache",
        "--gpu",
        "T4",
        *TINY_MODEL,
        "--fraction",
        "0.0001",
        cwd=tmp_path,
    )
    assert_ok(result, 1)
    assert "not even 1 sample(s) fit the 0.00 GiB budget on T4" in result.stdout


def test_when_not_one_sample_fits_the_json_form_exits_1_too(tmp_path: Path) -> None:
    result = run_cli(
        "profile",
        "--cache-dir",
        tmp_path / "cache",
        "--gpu",
        "T4",
        *TINY_MODEL,
        "--fraction",
        "0.0001",
        "--json",
        cwd=tmp_path,
    )
    doc = check_profile(parse_json_stdout(result))
    assert doc["chosen_batch"] == 0 and doc["predicted_memory_bytes"] is None
    assert result.returncode == 1, describe(result)


def test_the_estimate_is_priced_by_the_calibration_and_says_so(tmp_path: Path) -> None:
    """`batchplan profile` reads the calibrated time model: another calibration (TORCHKIT_TIME_MODEL) gives
    another step time, and the profile names where its times and their uncertainty come from."""
    import json

    from torchkit.estimate.time_model import DEFAULT_TIME_MODEL_PATH, TIME_MODEL_ENV

    # a cache of its own: profile reads the shared cache, and an entry of an earlier run names its own file
    args = (
        "profile",
        "--gpu",
        "V100-SXM2-16GB",
        *TINY_MODEL,
        "--amp",
        "fp16",
        "--json",
        "--cache-dir",
        str(tmp_path / "cache"),
    )
    shipped = check_profile(parse_json_stdout(run_cli(*args, cwd=tmp_path)))
    assert shipped["profile"]["time_log_sigma"] > 0 and "volta" in shipped["profile"]["time_model"]
    doc = json.loads(DEFAULT_TIME_MODEL_PATH.read_text())
    doc["arch"]["volta"]["constants"]["bandwidth_efficiency"]["value"] /= 2
    other = tmp_path / "slow_volta.json"
    other.write_text(json.dumps(doc))
    result = run_cli(*args, cwd=tmp_path, env={TIME_MODEL_ENV: str(other)})
    assert_ok(result)
    slower = check_profile(parse_json_stdout(result))
    assert slower["profile"]["time_points"][-1][1] > shipped["profile"]["time_points"][-1][1]
    assert str(other) in slower["profile"]["time_model"]
    assert slower["profile"]["memory_points"] == shipped["profile"]["memory_points"]
