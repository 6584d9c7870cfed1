"""examples/train_ddp.py under torchrun: three gloo ranks on 127.0.0.1 train with the batches of a plan."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gloo import describe_torchrun, rank_logs, torchrun, torchrun_env
from tests.plans import make_plan

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_ddp.py"

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(300)]


def write_plan(path: Path, batches: tuple[int, ...], accumulate: int = 1) -> Path:
    """A minimal valid plan.json: one node, one rank per device, fields per DESIGN.md."""
    path.write_text(json.dumps(make_plan(batches, nodes=(("node-a", len(batches)),), accumulate=accumulate)))
    return path


def test_example_trains_three_ranks_with_the_planned_batches_and_weights(tmp_path):
    plan = write_plan(tmp_path / "plan.json", (5, 3, 8), accumulate=2)
    logs = (
        tmp_path / "logs"
    )  # each rank's stdout in its own file: lines of three processes on one pipe interleave
    result = torchrun(EXAMPLE, "--plan", plan, "--steps", "3", nproc=3, log_dir=logs, cwd=tmp_path)
    stdout = rank_logs(logs)
    assert result.returncode == 0, describe_torchrun(result, logs)

    headers = {
        int(m["rank"]): (int(m["batch"]), float(m["weight"]), m["device"])
        for m in re.finditer(
            r"^rank (?P<rank>\d+)/3 .*device (?P<device>\S+): batch (?P<batch>\d+) "
            r"weight (?P<weight>[\d.]+) step_batch 16 global_batch 32 accumulate 2$",
            stdout,
            re.MULTILINE,
        )
    }
    assert headers == {0: (5, 0.9375, "cpu"), 1: (3, 0.5625, "cpu"), 2: (8, 1.5, "cpu")}

    steps = re.findall(
        r"^rank (\d) step (\d)/3: batch (\d+) loss ([\d.]+) global_loss ([\d.]+)$", stdout, re.MULTILINE
    )
    assert sorted((int(r), int(s), int(b)) for r, s, b, _, _ in steps) == [
        (r, s, b) for r, b in enumerate((5, 3, 8)) for s in (1, 2, 3)
    ]
    # the all-reduced mean loss of a step is one number, the same on every rank
    for step in ("1", "2", "3"):
        assert len({g for _, s, _, _, g in steps if s == step}) == 1
    for rank, batch in enumerate((5, 3, 8)):
        assert f"rank {rank} done: 3 steps, {3 * batch * 2} samples" in stdout


def test_example_with_a_launch_that_does_not_match_the_plan_fails_fast_with_the_fix(tmp_path):
    plan = write_plan(tmp_path / "plan.json", (5, 3, 8))
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--plan", str(plan)],
        capture_output=True,
        text=True,
        timeout=120,
        env=torchrun_env(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0"),
    )
    assert result.returncode == 2
    assert "error: " in result.stderr
    assert "is for 3 ranks but WORLD_SIZE=2" in result.stderr
    assert "Traceback" not in result.stderr


def test_example_runs_a_one_rank_plan_without_torchrun(tmp_path):
    plan = write_plan(tmp_path / "plan.json", (16,))
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--plan", str(plan), "--steps", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        env=torchrun_env(),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rank 0/1 " in result.stdout
    assert "batch 16 weight 1.000000" in result.stdout
    assert "rank 0 done: 2 steps, 32 samples" in result.stdout
