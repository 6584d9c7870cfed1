"""``batch=-1`` with the planned Ultralytics trainer.

On several ranks (3 gloo ranks on CPU simulating an A100-SXM4-80GB and two T4s; profiles estimated, no GPU):
the ranks plan inside the job, the larger card gets the larger batch, the per-rank batches are those of
``batchplan plan`` for the same model, input and cluster, no rank exceeds its memory cap, and each rank's
loader takes its batch. The dataset (100 images) is smaller than what the cards hold at 640 pixels, so the job
plans again, from the same profiles, for a global batch of 100 (Ultralytics' AutoBatch caps a batch at the
dataset size). The ranks stop after ``_setup_train`` (no training step at 640 on a CPU).
(On one device ``batch=-1`` is Ultralytics' own path: test_ultralytics_trainer.py.)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.gloo import describe_torchrun, torchrun
from tests.planner.cli_helpers import cli_env
from tests.planner.integrations.ultralytics_helpers import (
    WORKER,
    child_env,
    require_ultralytics,
    write_dataset,
)

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.ultralytics, pytest.mark.timeout(900)]

SIMULATED = ("A100-SXM4-80GB", "T4", "T4")
IMGSZ = 640
TRAIN_IMAGES = 100
#: against a hang only: rank 0 estimates two GPU types on fake tensors (about a minute at load 9)
TIMEOUT_S = 600
#: the flags of `batchplan plan` for the job the trainer plans: its model, image size, precision (AMP off on a
#: CPU), optimizer (SGD), NHWC (Ultralytics' default on CUDA) and the estimate the simulated types get
PLAN_FLAGS = (
    "--model",
    "ultralytics:yolov8n.yaml",
    "--imgsz",
    str(IMGSZ),
    "--amp",
    "off",
    "--optimizer",
    "sgd",
    "--channels-last",
    "--method",
    "estimate",
)


@pytest.fixture(scope="module")
def in_job(tmp_path_factory) -> dict:
    require_ultralytics()
    root = tmp_path_factory.mktemp("ultralytics-autobatch")
    data = write_dataset(root / "dataset", TRAIN_IMAGES)
    ranks = torchrun(
        WORKER,
        "ddp",
        "--data",
        data,
        "--out",
        root,
        "--batch",
        "-1",
        "--imgsz",
        str(IMGSZ),
        "--simulate-gpus",
        ",".join(SIMULATED),
        "--setup-only",
        nproc=3,
        log_dir=root / "logs",
        cwd=root,
        env=child_env(root / "config"),
        deadline_s=TIMEOUT_S,
    )
    logs = "".join(p.read_text() for p in sorted((root / "logs").rglob("*.log")))
    assert ranks.returncode == 0, describe_torchrun(ranks, root / "logs")
    records = [json.loads((root / f"planned-rank{rank}.json").read_text()) for rank in range(3)]

    # the same job through the CLI, on a cluster of the same GPUs in rank order, with the profile cache the
    # ranks filled (the same profile keys: the same job)
    cluster = root / "cluster.yaml"
    cluster.write_text(
        "name: mixed\nnodes:\n  - name: host\n    gpus: ["
        + ", ".join(f"{{type: {gpu}, count: 1}}" for gpu in SIMULATED)
        + "]\n"
    )
    env = cli_env(
        {
            "BATCHPLAN_CACHE_DIR": str(root / "profile-cache"),
            "YOLO_OFFLINE": "1",
            "YOLO_CONFIG_DIR": str(root / "config" / "cli"),
        }
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "planner.cli.main",
            "plan",
            "--cluster",
            str(cluster),
            "--no-ray",
            *PLAN_FLAGS,
            "--json",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr
    return {"records": records, "cli": json.loads(result.stdout), "logs": logs}


def _batches(plan: dict) -> list[int]:
    return [rank["batch"] for rank in plan["ranks"]]


def test_every_rank_holds_the_same_two_plans(in_job):
    plans = [record["plans"] for record in in_job["records"]]
    assert all(p == plans[0] for p in plans)
    first, second = plans[0]
    assert first["job"]["global_batch"] is None and second["job"]["global_batch"] == TRAIN_IMAGES
    assert [rank["gpu"] for rank in first["ranks"]] == list(SIMULATED)
    assert "exceed the dataset's 100: planned again for a global batch of 100" in in_job["logs"]


def test_the_in_job_plan_is_what_batchplan_plan_gives_for_the_same_job_and_cluster(in_job):
    first, second = in_job["records"][0]["plans"]
    assert _batches(first) == _batches(in_job["cli"])
    assert set(first["profiles"]) == set(in_job["cli"]["profiles"])  # the same profiles: the same job
    # the re-plan for the dataset's 100 images: the same profiles, the global batch its only change
    assert second["profiles"] == first["profiles"] and sum(_batches(second)) == TRAIN_IMAGES
    assert {k: v for k, v in second["job"].items() if k != "global_batch"} == {
        k: v for k, v in first["job"].items() if k != "global_batch"
    }


def test_the_larger_card_gets_the_larger_batch_and_no_rank_exceeds_its_cap(in_job):
    for plan in in_job["records"][0]["plans"]:
        a100, t4, other_t4 = plan["ranks"]
        assert a100["batch"] > t4["batch"] == other_t4["batch"] > 0
        for rank in plan["ranks"]:
            assert rank["batch"] <= rank["max_batch"]
            assert rank["predicted_memory_bytes"] <= rank["memory_budget_bytes"] < rank["total_memory_bytes"]


def test_each_rank_loader_takes_its_batch_of_the_plan_it_trains_with(in_job):
    final = in_job["records"][0]["plans"][-1]
    for rank, record in enumerate(in_job["records"]):
        assert record["loader_batch"] == record["rank_batch"] == final["ranks"][rank]["batch"]
        assert record["batch_size"] == TRAIN_IMAGES  # the global batch, for accumulate and weight decay
        assert record["steps_per_epoch"] == 1
    assert sum(record["rank_batch"] for record in in_job["records"]) == TRAIN_IMAGES


def test_the_readme_shows_the_lines_this_run_prints(in_job):
    # the README's block is this test's run: the same lines, numbers aside (estimates move with calibration)
    from tests.planner.integrations.ultralytics_helpers import REPO

    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Ultralytics: batch=-1 on several GPUs") :]
    shown = re.findall(r"^batchplan: .*$", section.split("\n## ", 1)[0], re.MULTILINE)
    printed = re.findall(r"^batchplan: .*$", in_job["logs"], re.MULTILINE)
    assert len(shown) == len(printed) == 7

    def shape(line: str) -> str:
        return re.sub(r"\d+(\.\d+)?", "N", line)

    assert sorted(map(shape, shown)) == sorted(map(shape, printed))
