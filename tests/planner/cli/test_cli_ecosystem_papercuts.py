"""The newcomer papercuts of issue #23, each as a user meets it: shipped cluster names anywhere, arguments
refused before any probing (with close matches), ``--no-write`` saying so, ``show --plot`` and ``show --emit
slurm``, library models announced as such."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.cli.user_code import LIBRARY_BUILDERS, library_model_summary, user_code_summary
from planner.job import JobSpec
from tests.planner.cli_helpers import TINY_MODEL, assert_ok, describe, is_png, run_cli


def _planned(tmp_path: Path, *extra: str):
    return run_cli(
        "plan",
        "--cluster",
        "demo-mixed",
        "--no-ray",
        *TINY_MODEL,
        "--cache-dir",
        tmp_path / "cache",
        *extra,
        cwd=tmp_path,
    )


def test_a_shipped_cluster_name_plans_outside_the_checkout_and_no_write_says_so(tmp_path: Path) -> None:
    result = _planned(tmp_path, "--no-write")
    assert_ok(result)
    assert "plan not written (--no-write): the launch lines name plan.json" in result.stderr, describe(result)
    assert not (tmp_path / "plan.json").exists()


def test_a_near_miss_model_name_is_refused_before_probing_with_close_matches(tmp_path: Path) -> None:
    result = run_cli("plan", "--cluster", "demo-mixed", "--model", "resnet51", "--no-write", cwd=tmp_path)
    assert result.returncode == 2, describe(result)
    assert "probing" not in result.stderr and "starting" not in result.stderr, describe(result)
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --model 'resnet51' is not a built-in workload (did you mean resnet50"), (
        last
    )


def test_emit_env_without_a_node_is_refused_before_probing(tmp_path: Path) -> None:
    result = run_cli(
        "plan",
        "--cluster",
        "demo-mixed",
        "--no-ray",
        *TINY_MODEL,
        "--emit",
        "env",
        "--no-write",
        cwd=tmp_path,
    )
    assert result.returncode == 2, describe(result)
    assert "probing" not in result.stderr, describe(result)
    assert "choose one with --node NAME or --node-rank N" in result.stderr


@pytest.mark.slow  # draws a plot
def test_show_draws_the_plot_and_prints_the_srun_line(tmp_path: Path) -> None:
    assert_ok(_planned(tmp_path, "-o", "plan.json"))
    picture = tmp_path / "shown.png"
    shown = run_cli("show", "plan.json", "--plot", picture, cwd=tmp_path)
    assert_ok(shown)
    assert is_png(picture) and f"wrote {picture}" in shown.stderr
    srun = run_cli("show", "plan.json", "--emit", "slurm", cwd=tmp_path)
    assert_ok(srun)
    line = srun.stdout.strip()
    # demo-mixed has nodes of one shape (2 GPUs each): one command, the node rank from SLURM_NODEID
    assert line.startswith(
        "srun --nodes 3 --ntasks-per-node 1 --nodelist node-a100,node-v100,node-t4 bash -c "
    ), line
    assert '--node-rank "$SLURM_NODEID"' in line and "--master-addr node-a100" in line
    bad = run_cli("show", "plan.json", "--plot", tmp_path / "x.jpg", cwd=tmp_path)
    assert bad.returncode == 2 and "must name a .png file" in bad.stderr


def test_library_models_are_announced_as_library_models_not_user_code() -> None:
    from torchkit.workloads.registry import LIBRARY_PREFIXES

    assert set(LIBRARY_BUILDERS) == set(LIBRARY_PREFIXES)
    job = JobSpec(model="timm:convnext_tiny")
    assert user_code_summary(job) is None
    assert library_model_summary(job) == (
        "library model: timm:convnext_tiny, built with "
        "timm.create_model('convnext_tiny', pretrained=False) (nothing downloaded)"
    )
    assert library_model_summary(JobSpec(model="resnet50")) is None


def test_devices_no_ray_reads_a_config_in_this_process(tmp_path: Path) -> None:
    from tests.planner.cli_helpers import parse_json_stdout

    result = run_cli("devices", "--cluster", "demo-mixed", "--no-ray", "--json", cwd=tmp_path)
    assert_ok(result)
    assert "Ray" not in result.stderr, describe(result)
    nodes = parse_json_stdout(result)["nodes"]
    assert [n["name"] for n in nodes] == ["node-a100", "node-v100", "node-t4"]
    assert all(n["ray_node_id"] is None for n in nodes)
    refused = run_cli("devices", "--no-ray", cwd=tmp_path)
    assert refused.returncode == 2 and "--no-ray needs --cluster FILE" in refused.stderr


@pytest.mark.parametrize(("gpus", "ok"), [("-1,-1", True), ("all", False)])
def test_preflight_judges_only_the_gpus_the_job_would_use(tmp_path: Path, gpus: str, ok: bool) -> None:
    from tests.planner.cli_helpers import parse_json_stdout

    # shared-node: four A6000s, GPU 3 97% busy; -1,-1 picks two idle ones and never asks for GPU 3
    result = run_cli(
        "preflight",
        "--cluster",
        "shared-node",
        "--no-ray",
        *TINY_MODEL,
        f"--gpus={gpus}",
        "--cache-dir",
        tmp_path / "cache",
        "--json",
        cwd=tmp_path,
    )
    assert result.returncode == (0 if ok else 1), describe(result)
    check = next(c for c in parse_json_stdout(result)["checks"] if c["name"] == "idle_thresholds")
    assert check["ok"] is ok
    if not ok:
        assert check["detail"].startswith("lab-server GPU 3: busy")
        assert check["fix"].startswith(
            "free those GPUs, pick others with --gpus, or relax --min-memory-fraction"
        )


def test_a_long_estimate_says_each_fake_pass_as_it_ends(tmp_path: Path) -> None:
    result = run_cli("profile", "--gpu", "T4", *TINY_MODEL, "--no-cache", cwd=tmp_path)
    assert_ok(result)
    passes = [line for line in result.stderr.splitlines() if line.startswith("fake pass ")]
    assert passes and passes[0].startswith("fake pass 1 of ") and " done (batch " in passes[0], describe(
        result
    )
    assert len(passes) >= 3  # the three probe batches, and one more near the cap for launch-bound models
