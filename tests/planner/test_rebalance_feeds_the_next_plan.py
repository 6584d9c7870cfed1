"""The loop a user runs: ``batchplan plan`` → train with ``--rebalance`` → ``batchplan plan`` again. The second
plan uses the profiles the job measured (``--method auto`` prefers them over estimates, and says so), so it
starts where the job ended instead of from the estimate."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from planner.allocate.allocation import allocate
from tests.net import free_port
from tests.planner.cli_helpers import TINY_MODEL, assert_ok, run_cli
from tests.planner.test_example_train_ddp import EXAMPLE, child_env

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(400)]

SPEEDS = (1.0, 2.0, 4.0)
SAMPLE_MS = 3.0
PLAN_ARGS = (*TINY_MODEL, "--global-batch", "56", "--multiple-of", "4", "--min-batch", "4", "--no-ray")


def test_the_next_plan_picks_up_the_profiles_the_job_measured(tmp_path):
    config = tmp_path / "lab.yaml"
    config.write_text("name: lab\nnodes:\n  - name: host\n    gpus: [{type: T4, count: 1}, {type: A10, count: 1}, "
                      "{type: A100-SXM4-80GB, count: 1}]\n")
    cache = tmp_path / "cache"
    first = run_cli("plan", "--cluster", config, *PLAN_ARGS, "--cache-dir", cache, "-o", "plan.json", cwd=tmp_path)
    assert_ok(first)
    estimated = json.loads((tmp_path / "plan.json").read_text())
    assert {p["method"] for p in estimated["profiles"].values()} == {"estimate"}

    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-addr", "127.0.0.1",
        "--master-port", str(free_port()), str(EXAMPLE), "--plan", "plan.json", "--steps", "14", "--rebalance",
        "--simulate-speed", ",".join(str(k) for k in SPEEDS), "--simulate-sample-ms", str(SAMPLE_MS),
        "--cache-dir", str(cache), "--write-plan", "trained.json",
    ]
    trained = subprocess.run(command, capture_output=True, text=True, timeout=300, env=child_env(), cwd=tmp_path)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    assert "samples_once=true" in trained.stdout

    second = run_cli("plan", "--cluster", config, *PLAN_ARGS, "--cache-dir", cache, "-o", "plan2.json", cwd=tmp_path)
    assert_ok(second)
    replanned = json.loads((tmp_path / "plan2.json").read_text())
    assert {p["method"] for p in replanned["profiles"].values()} == {"job"}
    said = [w for w in replanned["warnings"] if "measured in a running job" in w and "prefers it" in w]
    assert len(said) == 3
    # the new plan is the optimum for the speeds the job ran at (under the new plan's caps)
    caps = [r["max_batch"] for r in replanned["ranks"]]
    best = allocate(caps, [0.0] * 3, [k * SAMPLE_MS / 1e3 for k in SPEEDS], global_batch=56, multiple_of=4,
                    min_batch=4).batches.tolist()
    batches = [r["batch"] for r in replanned["ranks"]]
    assert all(abs(a - b) <= 4 for a, b in zip(batches, best, strict=True)), (batches, best)
    assert batches == json.loads((tmp_path / "trained.json").read_text())["measured"]["batches_last"]

    # --method estimate asks for the estimate: the measured profiles are not used
    third = run_cli("plan", "--cluster", config, *PLAN_ARGS, "--method", "estimate", "--cache-dir", cache,
                    "-o", "plan3.json", cwd=tmp_path)
    assert_ok(third)
    assert {p["method"] for p in json.loads((tmp_path / "plan3.json").read_text())["profiles"].values()} == {"estimate"}
