"""SLURM for real (issue #23, item 2): ``preflight --slurm-partition`` from ``sinfo``, ``plan --slurm`` inside an
allocation (``salloc``), and the ``--emit slurm`` line run by ``srun`` on every node, against a real
slurmctld and two slurmd on 127.0.0.1 (``tests/planner/slurm_cluster.py``).

The emitted line is run as printed, with a stand-in ``torchrun`` on PATH that prints what it was given: the
test checks what each node would start (its node rank from ``SLURM_NODEID``, the master address), not
training itself (``tests/planner/test_example_train_ddp.py`` runs that).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.planner.cli_helpers import (
    PREFLIGHT_SCHEMA,
    REPO_ROOT,
    TINY_MODEL,
    cli_env,
    describe,
    parse_json_stdout,
    run_cli,
)
from tests.planner.slurm_cluster import SlurmCluster

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

FAKE_TORCHRUN = (
    '#!/bin/sh\necho "node=$SLURM_NODEID host=$SLURMD_NODENAME cvd=$CUDA_VISIBLE_DEVICES args=$*"\n'
)


def test_preflight_of_a_partition_plans_its_nodes_by_name_with_their_gres(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    result = run_cli(
        "preflight",
        "--slurm-partition",
        "gpus",
        *TINY_MODEL,
        "--cache-dir",
        tmp_path / "cache",
        "--json",
        cwd=tmp_path,
        env=slurm.env(),
    )
    assert result.returncode == 0, describe(result)
    report = parse_json_stdout(result)
    assert report["schema"] == PREFLIGHT_SCHEMA and report["ok"] is True, report
    plan = report["plan"]
    assert [n["name"] for n in plan["nodes"]] == ["gpu-a", "gpu-b"]
    # the default table: a100 is the 40 GB card (the smaller memory of an ambiguous name), t4 the T4
    assert [r["gpu"] for r in plan["ranks"]] == ["A100-SXM4-40GB", "A100-SXM4-40GB", "T4"]
    assert "SLURM: 2 node(s) from sinfo -p gpus" in result.stderr


def test_gres_type_overrides_the_default_table(slurm: SlurmCluster, tmp_path: Path) -> None:
    result = run_cli(
        "preflight",
        "--slurm-partition",
        "gpus",
        "--gres-type",
        "a100=A100-SXM4-80GB",
        *TINY_MODEL,
        "--cache-dir",
        tmp_path / "cache",
        "--json",
        cwd=tmp_path,
        env=slurm.env(),
    )
    assert result.returncode == 0, describe(result)
    assert {r["gpu"] for r in parse_json_stdout(result)["plan"]["ranks"]} == {"A100-SXM4-80GB", "T4"}


def test_an_unknown_partition_is_one_error_line(slurm: SlurmCluster, tmp_path: Path) -> None:
    result = run_cli(
        "preflight", "--slurm-partition", "nosuch", *TINY_MODEL, "--json", cwd=tmp_path, env=slurm.env()
    )
    assert result.returncode == 2, describe(result)
    assert result.stderr.strip().splitlines()[-1].startswith("error: "), describe(result)
    assert "nosuch" in result.stderr and "Traceback" not in result.stderr


def test_plan_slurm_outside_an_allocation_says_where_to_run_it(slurm: SlurmCluster, tmp_path: Path) -> None:
    env = {k: v for k, v in cli_env(slurm.env()).items() if not k.startswith("SLURM_JOB")}
    result = subprocess.run(
        [sys.executable, "-m", "planner.cli.main", "plan", "--slurm", *TINY_MODEL, "--no-write"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "inside salloc or an sbatch script" in result.stderr.strip().splitlines()[-1]


def test_plan_slurm_in_an_allocation_and_its_srun_line_start_every_node(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(FAKE_TORCHRUN)
    (bin_dir / "torchrun").chmod(0o755)
    plan_path = tmp_path / "shared fs" / "plan.json"  # a space: the emitted line must quote it
    plan_path.parent.mkdir()
    plan = shlex.join(
        [
            sys.executable,
            "-m",
            "planner.cli.main",
            "plan",
            "--slurm",
            *TINY_MODEL,
            "--global-batch",
            "64",
            "--cache-dir",
            str(tmp_path / "cache"),
            "-o",
            str(plan_path),
            "--emit",
            "slurm",
        ]
    )
    inner = f"{plan} > srun.sh && PATH={shlex.quote(str(bin_dir))}:$PATH sh srun.sh"
    env = cli_env(slurm.env())
    env["PYTHONPATH"] = str(REPO_ROOT)
    result = subprocess.run(
        ["salloc", "-N", "2", "--gres=gpu:1", "bash", "-c", inner],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    srun = (tmp_path / "srun.sh").read_text().strip()
    assert srun.startswith("srun --nodes 2 --ntasks-per-node 1 --nodelist gpu-a,gpu-b bash -c "), srun
    assert '--node-rank "$SLURM_NODEID"' in srun
    started = sorted(line for line in result.stdout.splitlines() if line.startswith("node="))
    assert len(started) == 2, result.stdout
    for node_id, (line, host) in enumerate(zip(started, ["gpu-a", "gpu-b"], strict=True)):
        assert line.startswith(f"node={node_id} host={host} cvd=0 args="), line
        assert f"--nnodes 2 --node-rank {node_id} --nproc-per-node 1 --master-addr gpu-a" in line, line
        assert line.endswith(f"train.py --plan {plan_path}"), line
    shown = run_cli("show", plan_path, "--emit", "slurm", cwd=tmp_path)
    assert shown.returncode == 0 and shown.stdout.strip() == srun, describe(shown)
    assert os.path.exists(plan_path)
