"""examples/ray_train.py --rebalance: Ray Train workers start from a plan 2× wrong with simulated speeds
1,2,4, re-balance, and the driver prints the summary line and writes the updated plan and profiles."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.planner.runtime.rebalance_helpers import MULTIPLE_OF, optimum, wrong_plan
from tests.planner.test_example_train_ddp_rebalance import LINE

pytestmark = [pytest.mark.ray, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def test_ray_train_workers_rebalance_and_the_driver_keeps_what_they_measured(tmp_path):
    pytest.importorskip("ray.train.torch", reason="needs ray[train] (in the test extra)")
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(wrong_plan(2.0)))
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "ray_train.py"),
            "--plan",
            str(plan_path),
            "--steps",
            "12",
            "--match",
            "rank",
            "--rebalance",
            "--simulate-speed",
            "1,2,4",
            "--simulate-sample-ms",
            "3",
            "--cache-dir",
            str(tmp_path / "cache"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("rebalance:")]
    assert len(lines) == 1
    match = LINE.search(lines[0])
    assert match is not None and match["once"] == "true"
    batches_last = [int(b) for b in match["blast"].split(",")]
    best = optimum((64, 64, 64))
    assert all(abs(a - b) <= MULTIPLE_OF for a, b in zip(batches_last, best, strict=True)), (
        f"{lines[0]} (optimum {best}):\n{proc.stderr[-3000:]}"
    )
    assert float(match["last"]) < 0.10
    updated = json.loads(plan_path.read_text())
    assert [r["batch"] for r in updated["ranks"]] == batches_last
    assert updated["measured"]["batches_first"] == [24, 24, 8]
    assert not list(
        (tmp_path / "cache").glob("*.json")
    )  # a simulated run files no profile (they would poison)
