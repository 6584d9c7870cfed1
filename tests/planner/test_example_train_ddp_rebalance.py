"""examples/train_ddp.py --rebalance under torchrun: three gloo ranks with simulated speeds 1,2,4 start from
a plan 2× wrong, re-balance, print one summary line, and leave the measured plan behind (and, simulated, no
profile); a rank killed mid-run ends every rank within the collective timeout, each with one line."""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import subprocess
import sys

import pytest

from planner.runtime.rank_plan import load_rank_plan
from tests.gloo import describe_torchrun, rank_logs, torchrun, torchrun_command, torchrun_env
from tests.net import free_port
from tests.planner.runtime.rebalance_helpers import MULTIPLE_OF, optimum, wrong_plan
from tests.planner.test_example_train_ddp import EXAMPLE
from tests.plans import make_plan

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(300)]

LINE = re.compile(
    r"^rebalance: switches=(?P<switches>\d+) steps_to_balance=(?P<steps>\d+) "
    r"step_compute_s_first=(?P<sfirst>[\d.]+) step_compute_s_last=(?P<slast>[\d.]+) max_idle_first=(?P<first>[\d.]+) "
    r"max_idle_last=(?P<last>[\d.]+) batches_first=\[(?P<bfirst>[\d, ]+)\] batches_last=\[(?P<blast>[\d, ]+)\] "
    r"samples_once=(?P<once>true|false) rollbacks=(?P<rollbacks>\d+) compute_s_last=\[(?P<compute>[\d., ]+)\] "
    r"sync_wait_s_last=\[(?P<wait>[\d., ]+)\] watch_overhead=(?P<watch>[\d.]+%|n/a)$",
    re.MULTILINE,
)


def test_rebalance_corrects_a_two_times_wrong_plan_and_writes_what_it_measured(tmp_path):
    plan_path = tmp_path / "plan.json"
    plan = wrong_plan(2.0)
    plan["job"] = {**plan["job"], "optimizer": "sgd", "imgsz": None, "input_shape": None, "seq_len": None}
    plan_path.write_text(json.dumps(plan))
    cache = tmp_path / "cache"
    logs = tmp_path / "logs"
    result = torchrun(
        EXAMPLE,
        "--plan",
        plan_path,
        "--steps",
        "14",
        "--dataset-size",
        "560",
        "--rebalance",
        "--simulate-speed",
        "1,2,4",
        "--simulate-sample-ms",
        "3",
        "--cache-dir",
        cache,
        nproc=3,
        log_dir=logs,
        cwd=tmp_path,
    )
    stdout = rank_logs(logs)
    assert result.returncode == 0, describe_torchrun(result, logs)

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
    # a simulated run files no profile (its times are the simulation's); the plan's measured section has
    # each rank's refitted curve, rank 2 (speed 4) the slowest per sample, and per step compute and wait apart
    assert not cache.exists() or not any(cache.iterdir())
    per_sample = [r["time_fit"]["s_per_sample"] for r in updated["measured"]["ranks"]]
    assert per_sample[0] < per_sample[1] < per_sample[2]
    assert per_sample[2] / per_sample[0] == pytest.approx(4.0, rel=0.25)
    assert all(len(s["sync_wait_s"]) == 3 for s in updated["measured"]["step_times"])


def _simulated_step(speeds, batches) -> float:
    """The simulated devices' step in units of the agreed per-sample time: ``max_i k_i · b_i`` (every rank's
    compute is stretched to ``k_i × s × b_i`` with one ``s``): a value of the batches, not a time."""
    return max(k * b for k, b in zip(speeds, batches, strict=True))


@pytest.mark.parametrize("speeds, steps", [((4, 2, 1), 30), ((1, 2, 4), 40)], ids=["4,2,1", "1,2,4"])
def test_measured_mode_ends_at_least_as_good_as_it_started_with_batches_ordered_by_speed(
    tmp_path, speeds, steps
):
    """README's lab plan ([3, 11, 34]) without --simulate-sample-ms: the per-sample time is measured after the
    warm-up. It ended worse than it started (max idle 0.575 -> 0.756, once at [1, 1, 46]): the speed-1 rank cost
    only its real compute per sample, and a sleep's lateness on a loaded machine made every sleeping rank look
    like a fixed cost deaf to its batch (planner.runtime.simulate). Asserted on the batches (their order, and
    the simulated step they make), never on a measured time."""
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(make_plan((3, 11, 34))))
    logs = tmp_path / "logs"
    result = torchrun(
        EXAMPLE,
        "--plan",
        plan_path,
        "--steps",
        str(steps),
        "--rebalance",
        "--simulate-speed",
        ",".join(map(str, speeds)),
        "--write-plan",
        tmp_path / "trained.json",
        nproc=3,
        log_dir=logs,
        cwd=tmp_path,
        deadline_s=240,
    )
    stdout = rank_logs(logs)
    assert result.returncode == 0, describe_torchrun(result, logs)
    match = LINE.search(stdout)
    assert match, stdout
    first = [int(b) for b in match["bfirst"].split(",")]
    last = [int(b) for b in match["blast"].split(",")]
    assert first == [3, 11, 34] and sum(last) == 48
    assert _simulated_step(speeds, last) <= _simulated_step(speeds, first), (first, last)
    for i, j in itertools.permutations(range(3), 2):  # a rank 2× faster or more never takes fewer samples
        if speeds[j] >= 2 * speeds[i]:
            assert last[i] > last[j], (speeds, last)
    assert match["once"] == "true"
    trained = json.loads((tmp_path / "trained.json").read_text())
    assert "the real compute is part of it" in trained["measured"]["simulated"]


def test_simulate_speed_with_the_wrong_number_of_ranks_is_one_line_and_exit_2(tmp_path):
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(wrong_plan(2.0)))
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--plan", str(plan_path), "--rebalance", "--simulate-speed", "1,2"],
        capture_output=True,
        text=True,
        timeout=120,
        env=torchrun_env(RANK="0", WORLD_SIZE="3", LOCAL_RANK="0"),
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: --simulate-speed '1,2' gives 2 factors")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("kind", ["hang", "kill"])
def test_a_rank_that_hangs_or_is_killed_mid_run_ends_the_job_within_60_s_naming_it(tmp_path, kind):
    """A hung rank (SIGSTOP): the survivors stop after the 15 s collective timeout with one line naming rank 2.
    The first survivor to time out prints its line and exits, and torchrun then stops the job at once, so the
    other survivor prints its own line only if its timer ran out within torchrun's monitor interval of the first
    (a race: under load they start the collective apart): one or two lines, never none, each from a different
    rank. A killed rank (SIGKILL): torchrun sees it and stops the others at once (its summary names the rank);
    either way the job ends far within 60 s, not after 30 minutes."""
    import os
    import signal
    import time

    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(wrong_plan(2.0)))
    command = torchrun_command(
        EXAMPLE,
        "--plan",
        plan_path,
        "--steps",
        "400",
        "--dataset-size",
        "560",
        "--rebalance",
        "--simulate-speed",
        "1,2,4",
        "--simulate-sample-ms",
        "3",
        "--no-feedback",
        "--collective-timeout",
        "15",
        nproc=3,
        log_dir=tmp_path / "logs",
    )
    job = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=torchrun_env(), cwd=tmp_path
    )
    pid = None
    try:
        logs = tmp_path / "logs"
        deadline = time.monotonic() + 180
        while pid is None and time.monotonic() < deadline:  # rank 2 at work: its log shows step 12
            if any("rank 2 step 12/" in log.read_text() for log in logs.rglob("stdout.log")):
                pid = _rank_pid(2, plan_path)
            time.sleep(0.2)
        assert pid is not None, "rank 2 never got to step 12"
        stopped_at = time.monotonic()
        os.kill(pid, signal.SIGSTOP if kind == "hang" else signal.SIGKILL)
        _, launcher_err = job.communicate(timeout=120)
        ended_s = time.monotonic() - stopped_at
    finally:
        if job.poll() is None:
            job.kill()
        if pid is not None and kind == "hang":
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    # issue #34: every node within the collective timeout plus 30 s (the survivors end the stopped rank through its
    # watchdog, so torchrun need not wait out its own 30 s for it); a bound, not a measurement
    assert ended_s < 15 + 30, ended_s
    assert job.returncode != 0
    errors = "".join(p.read_text() for p in sorted((tmp_path / "logs").rglob("stderr.log")))
    assert "Traceback" not in errors
    if kind == "hang":
        lines = [x for x in errors.splitlines() if x.startswith("error: rebalance:")]
        assert 1 <= len(lines) <= 2, errors[
            -3000:
        ]  # one line from each survivor that timed out before torchrun
        assert all("rank 2 stopped answering" in x for x in lines), lines
        reporters = [re.search(r"failed on rank (\d+)", x) for x in lines]
        assert all(reporters), lines
        assert len({m.group(1) for m in reporters}) == len(lines) and "2" not in {
            m.group(1) for m in reporters
        }
    else:
        assert "rank: 2" in launcher_err  # torchrun's summary names the rank it saw die


def _rank_pid(rank: int, plan_path) -> int | None:
    """The pid of this test's example process whose environment says RANK=rank (a child of torchrun)."""
    import psutil

    for process in psutil.process_iter(["cmdline"]):
        try:
            cmdline = process.info["cmdline"] or []
            if (
                str(EXAMPLE) in cmdline
                and str(plan_path) in cmdline
                and process.environ().get("RANK") == str(rank)
            ):
                return process.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def test_a_stopped_rank_alone_on_its_node_ends_that_node_too(tmp_path):
    """Two torchrun launches on 127.0.0.1 as two nodes: ranks 0 and 1 on node-a, rank 2 alone on node-b. Rank 2 is
    stopped (SIGSTOP): the survivors on node-a name it and end it through its watchdog, so node-b's torchrun, which
    has no survivor of its own to notice anything, ends too, within the collective timeout plus 30 s (it still ran
    240 s after node-a had ended, issue #34). A bound, not a measurement."""
    import os
    import signal
    import time

    timeout_s = 15
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(wrong_plan(2.0, nodes=(("node-a", 2), ("node-b", 1)))))
    port = free_port()
    jobs = []
    for node_rank, nproc in ((0, 2), (1, 1)):
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--node-rank",
            str(node_rank),
            "--nproc-per-node",
            str(nproc),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            "--log-dir",
            str(tmp_path / f"logs{node_rank}"),
            "--redirects",
            "3",
            str(EXAMPLE),
            "--plan",
            str(plan_path),
            "--steps",
            "400",
            "--dataset-size",
            "560",
            "--rebalance",
            "--simulate-speed",
            "1,2,4",
            "--simulate-sample-ms",
            "3",
            "--no-feedback",
            "--collective-timeout",
            str(timeout_s),
        ]
        jobs.append(
            subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=torchrun_env(),
                cwd=tmp_path,
            )
        )
    pid = None
    ended: dict[int, float] = {}
    try:
        deadline = time.monotonic() + 180
        while pid is None and time.monotonic() < deadline:  # rank 2 at work: its log shows step 12
            if any("rank 2 step 12/" in log.read_text() for log in (tmp_path / "logs1").rglob("stdout.log")):
                pid = _rank_pid(2, plan_path)
            time.sleep(0.2)
        assert pid is not None, "rank 2 never got to step 12"
        stopped_at = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        while len(ended) < 2 and time.monotonic() - stopped_at < 150:
            for node_rank, job in enumerate(jobs):
                if node_rank not in ended and job.poll() is not None:
                    ended[node_rank] = time.monotonic() - stopped_at
            time.sleep(0.2)
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()
            job.communicate()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert sorted(ended) == [0, 1], ended
    assert max(ended.values()) < timeout_s + 30, ended
    errors = "".join(p.read_text() for p in sorted((tmp_path / "logs0").rglob("stderr.log")))
    lines = [x for x in errors.splitlines() if x.startswith("error: rebalance:")]
    assert lines and all("rank 2 stopped answering" in x for x in lines), errors[-3000:]
    assert any("ended rank 2 through its watchdog" in x for x in lines), lines
