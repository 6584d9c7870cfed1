"""examples/ray_train.py under Ray Train's TorchTrainer, 3 CPU workers on a local Ray (127.0.0.1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.cluster import load_cluster
from planner.codec import encode
from planner.driver import plan_without_ray
from planner.job import JobSpec
from planner.plan.io import write_plan

pytestmark = [pytest.mark.ray, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def test_ray_train_example_runs_each_worker_on_its_plan_entry(tmp_path):
    pytest.importorskip("ray.train.torch", reason="needs ray[train] (in the test extra)")
    config = tmp_path / "one.yaml"
    config.write_text(
        "name: one\nnodes:\n  - name: host\n    gpus: [{type: T4, count: 1}, {type: A10, count: 2}]\n"
    )
    job = JobSpec(
        model="tests.planner.tiny_models:convnet", input_shape=(3, 32, 32), global_batch=48, multiple_of=8
    )
    plan = encode(plan_without_ray(job, load_cluster(config)).plan)
    write_plan(plan, tmp_path / "plan.json")
    home = tmp_path / "home"  # the user's home: the example's local Ray must leave no token file there
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "ray_train.py"),
            "--plan",
            str(tmp_path / "plan.json"),
            "--steps",
            "2",
            "--match",
            "rank",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
        env={**env, "HOME": str(home)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not (home / ".ray" / "auth_token").exists()  # it was left, and every later embedded Ray said so
    batches = [r["batch"] for r in plan["ranks"]]
    assert f"done: 2 steps on 3 workers with batches {batches}" in proc.stdout
