"""examples/train_ddp.py --rebalance under torchrun: three gloo ranks with simulated speeds 1,2,4 start from
a plan 2× wrong, re-balance, print one summary line, and leave the measured plan and profiles behind."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from planner.profiles.cache import ProfileCache
from planner.runtime.rank_plan import load_rank_plan
from planner.runtime.rebalance_feedback import measured_fingerprint, measured_profile_key
from tests.net import free_port
from tests.planner.runtime.rebalance_helpers import MULTIPLE_OF, optimum, wrong_plan
from tests.planner.test_example_train_ddp import EXAMPLE, child_env

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(300)]

LINE = re.compile(
    r"^rebalance: switches=(?P<switches>\d+) steps_to_balance=(?P<steps>\d+) max_idle_first=(?P<first>[\d.]+) "
    r"max_idle_last=(?P<last>[\d.]+) batches_first=\[(?P<bfirst>[\d, ]+)\] batches_last=\[(?P<blast>[\d, ]+)\] "
    r"samples_once=(?P<once>true|false)$", re.MULTILINE)


def test_rebalance_corrects_a_two_times_wrong_plan_and_writes_what_it_measured(tmp_path):
    plan_path = tmp_path / "plan.json"
    plan = wrong_plan(2.0)
    plan["job"] = {**plan["job"], "optimizer": "sgd", "imgsz": None, "input_shape": None, "seq_len": None}
    plan_path.write_text(json.dumps(plan))
    cache = tmp_path / "cache"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-addr", "127.0.0.1",
        "--master-port", str(free_port()), "--log-dir", str(tmp_path / "logs"), "--redirects", "3",
        str(EXAMPLE), "--plan", str(plan_path), "--steps", "14", "--dataset-size", "560", "--rebalance",
        "--simulate-speed", "1,2,4", "--simulate-sample-ms", "3", "--cache-dir", str(cache),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, env=child_env(), cwd=tmp_path)
    stdout = "".join(p.read_text() for p in sorted((tmp_path / "logs").rglob("stdout.log")))
    assert result.returncode == 0, result.stdout + result.stderr + stdout

    lines = LINE.findall(stdout)
    assert len(lines) == 1 and len(re.findall(r"^rebalance:", stdout, re.MULTILINE)) == 1, stdout
    match = LINE.search(stdout)
    batches_last = [int(b) for b in match["blast"].split(",")]
    assert [int(b) for b in match["bfirst"].split(",")] == [24, 24, 8]
    assert int(match["switches"]) >= 1
    assert float(match["first"]) > 0.3
    assert float(match["last"]) < 0.10
    assert all(abs(a - b) <= MULTIPLE_OF for a, b in zip(batches_last, optimum((64, 64, 64)), strict=True))
    assert match["once"] == "true"

    # the plan file now holds the batches that ran, weights that match them, and the measured section
    updated = json.loads(plan_path.read_text())
    assert [r["batch"] for r in updated["ranks"]] == batches_last
    assert updated["measured"]["batches_first"] == [24, 24, 8]
    assert updated["measured"]["simulated"].startswith("simulated speeds [1.0, 2.0, 4.0]")
    assert load_rank_plan(updated, rank=2).batch == batches_last[2]
    # and the cache one measured profile per GPU type, rank 2 (speed 4) the slowest per sample
    profiles = ProfileCache(cache)
    per_sample = {}
    for entry in updated["ranks"]:
        profile = profiles.get(measured_profile_key(updated["job"], entry["gpu"], "off",
                                                    fingerprint=measured_fingerprint(updated["job"])))
        assert profile is not None and profile.method == "job"
        per_sample[entry["rank"]] = profile.time_fit.s_per_sample
    assert per_sample[0] < per_sample[1] < per_sample[2]
    assert per_sample[2] / per_sample[0] == pytest.approx(4.0, rel=0.25)


def test_simulate_speed_with_the_wrong_number_of_ranks_is_one_line_and_exit_2(tmp_path):
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(wrong_plan(2.0)))
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--plan", str(plan_path), "--rebalance", "--simulate-speed", "1,2"],
        capture_output=True, text=True, timeout=120, env=child_env(RANK="0", WORLD_SIZE="3", LOCAL_RANK="0"),
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: --simulate-speed '1,2' gives 2 factors")
    assert "Traceback" not in result.stderr
