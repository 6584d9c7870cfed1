"""The loop a user runs: ``batchplan plan`` → train with ``--rebalance`` → ``batchplan plan`` again, sharing one
profile cache. A *simulated* run (``--simulate-speed``) must not poison the next plan: its times are the
simulation's, so it files no profile and the next ``--method auto`` plans from the estimates as before (once a
demo's simulated T4 batch 48 / V100 4 / A10 4 came back as the real plan). A real run's profile answering the
same job is tested in tests/planner/runtime/test_runtime_rebalance_feedback.py; a real run's measured exposed
synchronisation pricing the next plan's ``comm`` (source "measured in the job") here, over real gloo."""

from __future__ import annotations

import json

import pytest

from tests.gloo import torchrun, torchrun_env
from tests.planner.cli_helpers import TINY_MODEL, assert_ok, run_cli
from tests.planner.test_example_train_ddp import EXAMPLE, REPO

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(400)]

SPEEDS = (1.0, 2.0, 4.0)
SAMPLE_MS = 3.0
PLAN_ARGS = (*TINY_MODEL, "--global-batch", "56", "--multiple-of", "4", "--min-batch", "4", "--no-ray")


def test_a_simulated_run_does_not_poison_the_next_plan(tmp_path):
    config = tmp_path / "lab.yaml"
    config.write_text(
        "name: lab\nnodes:\n  - name: host\n    gpus: [{type: T4, count: 1}, {type: A10, count: 1}, "
        "{type: A100-SXM4-80GB, count: 1}]\n"
    )
    cache = tmp_path / "cache"
    first = run_cli(
        "plan", "--cluster", config, *PLAN_ARGS, "--cache-dir", cache, "-o", "plan.json", cwd=tmp_path
    )
    assert_ok(first)
    estimated = json.loads((tmp_path / "plan.json").read_text())
    assert {p["method"] for p in estimated["profiles"].values()} == {"estimate"}
    cached = sorted(p.name for p in cache.rglob("*.json"))

    trained = torchrun(
        EXAMPLE,
        "--plan",
        "plan.json",
        "--steps",
        "14",
        "--rebalance",
        "--simulate-speed",
        ",".join(str(k) for k in SPEEDS),
        "--simulate-sample-ms",
        str(SAMPLE_MS),
        "--cache-dir",
        cache,
        "--write-plan",
        "trained.json",
        nproc=3,
        cwd=tmp_path,
    )
    # the ranks' own tracebacks first (they are prefixed "[rankN]:"): torchrun's summary after them would push
    # them out of a tail, and once hid that rank 0 failed importing the plan's model for its feedback
    ranks = [line for line in trained.stderr.splitlines() if line.startswith("[rank")]
    assert trained.returncode == 0, (
        "\n".join(ranks[-60:]) + "\n" + trained.stdout[-2000:] + trained.stderr[-2000:]
    )
    assert "samples_once=true" in trained.stdout
    trained_plan = json.loads((tmp_path / "trained.json").read_text())
    measured = trained_plan["measured"]
    # the trained plan's step is still compute plus synchronisation: the plan's own, since nothing was measured
    assert trained_plan["predicted_comm_time_s"] == estimated["predicted_comm_time_s"] > 0
    assert trained_plan["predicted_step_time_s"] == pytest.approx(
        max(r["predicted_step_time_s"] for r in trained_plan["ranks"])
        + trained_plan["predicted_comm_time_s"] / trained_plan["accumulate"]
    )
    assert measured["simulated"].startswith("simulated speeds [1.0, 2.0, 4.0]")
    assert measured["batches_last"] != [r["batch"] for r in estimated["ranks"]]  # it did re-balance
    assert sorted(p.name for p in cache.rglob("*.json")) == cached  # and filed nothing

    second = run_cli(
        "plan", "--cluster", config, *PLAN_ARGS, "--cache-dir", cache, "-o", "plan2.json", cwd=tmp_path
    )
    assert_ok(second)
    replanned = json.loads((tmp_path / "plan2.json").read_text())
    assert {p["method"] for p in replanned["profiles"].values()} == {"estimate"}
    assert not [w for w in replanned["warnings"] if "measured in a running job" in w]
    assert [r["batch"] for r in replanned["ranks"]] == [r["batch"] for r in estimated["ranks"]]
    # nor its synchronisation: the waits were the simulation's
    assert measured["sync"]["ring_shape"] is None and "simulated speeds" in measured["sync"]["why"]
    assert replanned["comm"]["exposed_source"] == estimated["comm"]["exposed_source"] == "the links' model"
    assert replanned["predicted_comm_time_s"] == estimated["predicted_comm_time_s"]


LAB = (
    "name: lab\nnodes:\n  - name: host\n    gpus: [{type: T4, count: 1}, {type: A10, count: 1}, "
    "{type: A100-SXM4-80GB, count: 1}]\n"
)


def test_a_real_runs_measured_sync_prices_the_next_plans_comm_and_says_so(tmp_path):
    config = tmp_path / "lab.yaml"
    config.write_text(LAB)
    cache = tmp_path / "cache"
    assert_ok(
        run_cli(
            "plan", "--cluster", config, *PLAN_ARGS, "--cache-dir", cache, "-o", "plan.json", cwd=tmp_path
        )
    )
    estimated = json.loads((tmp_path / "plan.json").read_text())
    assert estimated["comm"]["exposed_source"] == "the links' model" and estimated["comm"]["num_ranks"] == 3

    # the job rebuilds the plan's model (a tests.* module) to name its feedback: the repository on its path
    trained = torchrun(
        EXAMPLE,
        "--plan",
        "plan.json",
        "--steps",
        "14",
        "--rebalance",
        "--cache-dir",
        cache,
        "--write-plan",
        "trained.json",
        nproc=3,
        cwd=tmp_path,
        env=torchrun_env(PYTHONPATH=str(REPO)),
    )
    ranks = [line for line in trained.stderr.splitlines() if line.startswith("[rank")]
    assert trained.returncode == 0, (
        "\n".join(ranks[-60:]) + "\n" + trained.stdout[-2000:] + trained.stderr[-2000:]
    )
    trained_plan = json.loads((tmp_path / "trained.json").read_text())
    sync = trained_plan["measured"]["sync"]
    assert sync["ring_shape"] == estimated["comm"]["ring_shape"], sync
    assert (
        sync["measured_exposed_s"] > 0
        and sync["slowdown"] != 1.0
        and sync["link"].startswith("software torch")
    )
    # the trained plan's step: the measured compute plus the exposed synchronisation the run measured
    assert trained_plan["predicted_comm_time_s"] == sync["measured_exposed_s"]
    assert trained_plan["predicted_step_time_s"] == pytest.approx(
        max(r["predicted_step_time_s"] for r in trained_plan["ranks"])
        + sync["measured_exposed_s"] / trained_plan["accumulate"]
    )
    assert any("as the run measured it" in w for w in trained_plan["warnings"])
    assert list((cache / "sync").glob("*.json"))

    second = run_cli(
        "plan", "--cluster", config, *PLAN_ARGS, "--cache-dir", cache, "-o", "plan2.json", cwd=tmp_path
    )
    assert_ok(second)
    replanned = json.loads((tmp_path / "plan2.json").read_text())
    comm = replanned["comm"]
    assert comm["exposed_source"].startswith("measured in the job (software torch"), comm["exposed_source"]
    assert "gloo, 1 node(s), 3 rank(s)" in comm["exposed_source"]
    assert comm["slowdown"] == pytest.approx(sync["slowdown"]) and comm["job_sync"]["steps"] == sync["steps"]
    assert replanned["predicted_comm_time_s"] != estimated["predicted_comm_time_s"]
    assert any(
        n.startswith("exposed gradient synchronisation measured in the job") for n in replanned["notes"]
    )
    # a plan that does not take measurements (--method estimate) is priced from the links alone
    third = run_cli(
        "plan",
        "--cluster",
        config,
        *PLAN_ARGS,
        "--method",
        "estimate",
        "--cache-dir",
        cache,
        "-o",
        "plan3.json",
        cwd=tmp_path,
    )
    assert_ok(third)
    assert json.loads((tmp_path / "plan3.json").read_text())["comm"]["exposed_source"] == "the links' model"
