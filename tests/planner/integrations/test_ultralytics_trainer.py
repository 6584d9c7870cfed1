"""planner.integrations.ultralytics: importing it costs nothing and a missing Ultralytics is one line; each
task's loss reduction is the installed library's; the options reach the DDP workers; the launching process of a
3-GPU job with ``batch=-1`` starts the workers where Ultralytics refuses, and refuses a plan that is not for its
devices in one line; ``batch=-1`` on one device is Ultralytics' own AutoBatch path, call for call.

The trainers are built in subprocesses (``ultralytics_worker.py single``) so that Ultralytics runs offline,
with its settings in a temporary directory."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import pytest

from planner.errors import ConfigError
from tests.planner.integrations.ultralytics_helpers import (
    REPO,
    WORKER,
    child_env,
    require_ultralytics,
    write_dataset,
)

pytestmark = pytest.mark.ultralytics  # CI's "torch unpinned" stage runs this marker where Ultralytics imports

TIMEOUT_S = 300


def _python(code: str, tmp_path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=tmp_path,
        env=child_env(tmp_path / "config"),
    )


def test_importing_the_integration_imports_neither_ultralytics_nor_torch(tmp_path):
    result = _python(
        "import sys, planner.integrations.ultralytics as u\n"
        "assert u.PlanOptions().plan is None\n"
        "print(sorted(m for m in ('torch', 'ultralytics') if m in sys.modules))",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_missing_ultralytics_is_one_line_naming_the_pip_command(tmp_path):
    # None in sys.modules makes `import ultralytics` fail as it does where Ultralytics is not installed
    result = _python(
        "import sys\nsys.modules['ultralytics'] = None\n"
        "from planner.integrations.ultralytics import UltralyticsUnavailableError, planned_trainer\n"
        "try:\n    planned_trainer('detect')\nexcept UltralyticsUnavailableError as e:\n"
        "    assert isinstance(e, ImportError)\n    print(e)\n",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    message = result.stdout.strip()
    assert "\n" not in message
    assert message.startswith(
        "planner.integrations.ultralytics needs ultralytics, which is not installed (pip "
    )
    assert "[ultralytics]" in message


def test_options_are_checked_where_they_are_given():
    from planner.integrations.ultralytics import PlanOptions, planned_trainer

    with pytest.raises(ConfigError, match="T5000"):
        PlanOptions(simulate_gpus="A100-SXM4-80GB,T5000")
    with pytest.raises(ConfigError, match="sync_bn must be True, False or None"):
        PlanOptions(sync_bn="yes")
    assert PlanOptions(simulate_gpus="A100-SXM4-80GB, T4").simulate_gpus == ("A100-SXM4-80GB", "T4")
    with pytest.raises(ConfigError, match="no planned trainer for Ultralytics task 'depth'"):
        planned_trainer("depth")


def test_each_planned_trainer_is_its_task_trainer_and_pickles_by_name():
    require_ultralytics()
    import ultralytics.models.yolo as yolo

    import planner.integrations.ultralytics as integration

    bases = {
        "detect": yolo.detect.DetectionTrainer,
        "segment": yolo.segment.SegmentationTrainer,
        "pose": yolo.pose.PoseTrainer,
        "obb": yolo.obb.OBBTrainer,
        "classify": yolo.classify.ClassificationTrainer,
    }
    for task, base in bases.items():
        trainer = integration.trainer_class(task)
        assert issubclass(trainer, base) and trainer.batchplan_task == task
        assert getattr(integration, trainer.__name__) is trainer
        assert pickle.loads(pickle.dumps(trainer)) is trainer  # Ultralytics' DDP workers rebuild it by name


def test_the_options_travel_to_the_ddp_workers_with_the_class():
    require_ultralytics()
    cloudpickle = pytest.importorskip("cloudpickle", reason="the [ultralytics] extra installs cloudpickle")

    from planner.integrations.ultralytics import PlannedDetectionTrainer, PlanOptions, planned_trainer

    configured = planned_trainer("detect", plan="plan.json", sync_bn=False)
    assert configured.batchplan == PlanOptions(plan="plan.json", sync_bn=False)
    rebuilt = pickle.loads(cloudpickle.dumps(configured))  # what generate_ddp_file does
    assert rebuilt.batchplan == configured.batchplan and issubclass(rebuilt, PlannedDetectionTrainer)
    assert planned_trainer("detect") is PlannedDetectionTrainer


def _loss_ratio(task: str) -> float:
    """loss(batch of 2 identical images) / loss(batch of 1) for the task's installed criterion: 2 where the
    loss sums over the images, 1 where it is a mean."""
    import torch
    from ultralytics.cfg import get_cfg
    from ultralytics.nn import tasks

    torch.manual_seed(0)
    yaml = {
        "detect": "yolov8n.yaml",
        "segment": "yolov8n-seg.yaml",
        "pose": "yolov8n-pose.yaml",
        "obb": "yolov8n-obb.yaml",
        "classify": "yolov8n-cls.yaml",
    }[task]
    model_class = {
        "detect": tasks.DetectionModel,
        "segment": tasks.SegmentationModel,
        "pose": tasks.PoseModel,
        "obb": tasks.OBBModel,
        "classify": tasks.ClassificationModel,
    }[task]
    model = model_class(yaml, nc=2, verbose=False)
    model.args = get_cfg()
    model.eval()  # BatchNorm over running statistics: one image's output does not depend on the others
    image = torch.rand(1, 3, 64, 64)
    boxes = torch.tensor([[0.35, 0.35, 0.6, 0.6], [0.65, 0.65, 0.6, 0.6]])
    keypoints = torch.rand(2, 17, 3)  # of the image's two objects: the same in every copy of the image

    def batch(n: int) -> dict:
        b = {"img": image.repeat(n, 1, 1, 1)}
        if task == "classify":
            b["cls"] = torch.zeros(n, dtype=torch.long)
            return b
        b.update(
            cls=torch.tensor([[0.0], [1.0]]).repeat(n, 1),
            batch_idx=torch.arange(n).repeat_interleave(2).float(),
            bboxes=boxes.repeat(n, 1),
        )
        if task == "obb":
            b["bboxes"] = torch.cat([b["bboxes"], torch.zeros(2 * n, 1)], 1)
        if task == "pose":
            b["keypoints"] = keypoints.repeat(n, 1, 1)
        if task == "segment":
            masks = torch.zeros(n, 16, 16)
            masks[:, 2:10, 2:10], masks[:, 6:14, 6:14] = 1.0, 2.0  # overlapping masks: object indices
            b["masks"] = masks
        return b

    criterion = model.init_criterion()
    with torch.no_grad():
        one, two = (float(criterion(model(batch(n)["img"]), batch(n))[0].sum()) for n in (1, 2))
    return two / one


@pytest.mark.parametrize("task", ["detect", "segment", "pose", "obb", "classify"])
def test_each_task_loss_reduction_is_the_installed_criterion(task):
    require_ultralytics()
    from planner.integrations.ultralytics import TASK_LOSS_REDUCTION

    expected = {"sum": 2.0, "mean": 1.0}[TASK_LOSS_REDUCTION[task]]
    assert _loss_ratio(task) == pytest.approx(expected, rel=1e-4)


@pytest.fixture(scope="module")
def single_process(tmp_path_factory) -> dict:
    require_ultralytics()
    root = tmp_path_factory.mktemp("ultralytics-single")
    data = write_dataset(root / "dataset", 20)
    result = subprocess.run(
        [sys.executable, str(WORKER), "single", "--data", str(data), "--out", str(root)],
        env=child_env(root / "config"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=root,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return {
        "autobatch": json.loads((root / "autobatch.json").read_text()),
        "launches": json.loads((root / "launches.json").read_text()),
        "stderr": result.stderr,
    }


@pytest.mark.slow
def test_batch_minus_one_on_one_device_is_ultralytics_own_autobatch_path(single_process):
    ultralytics, planned = single_process["autobatch"]["ultralytics"], single_process["autobatch"]["planned"]
    # the same call of check_train_batch_size (image size, AMP, batch, loss simulation, dataset size) ...
    assert planned["calls"] == ultralytics["calls"] and len(ultralytics["calls"]) == 1
    assert ultralytics["calls"][0]["max_num_obj"] == 16 and ultralytics["calls"][0]["dataset_size"] == 20
    # ... and what follows from its answer, 7: batch, loader, accumulation, weight decay; no plan
    assert planned["batch"] == planned["args_batch"] == planned["loader_batch"] == 7
    assert {k: v for k, v in planned.items() if k != "planned"} == {
        k: v for k, v in ultralytics.items() if k != "planned"
    }
    assert planned["planned"] is False


@pytest.mark.slow
def test_the_launching_process_starts_ddp_with_batch_minus_one_where_ultralytics_refuses(single_process):
    launches = single_process["launches"]
    assert launches["ultralytics"]["error"].startswith(
        "ValueError: AutoBatch with batch<1 not supported for Multi-GPU training"
    )
    for name in ("in_job", "matching"):
        (launch,) = launches[name]["launched"]
        assert launch["cmd"][2:5] == ["torch.distributed.run", "--nproc_per_node", "3"]
        assert launch["batch"] == -1  # the workers plan it
        assert "PlannedDetectionTrainer" in launch["mro"]
        assert "simulate_gpus=('A100-SXM4-80GB', 'T4', 'T4')" in launch["options"]


@pytest.mark.slow
def test_a_plan_for_other_devices_is_refused_before_any_worker_starts_in_one_line(single_process):
    launches = single_process["launches"]
    for name, words in {
        "four_ranks": ["four_ranks.json is for 4 ranks (4× T4) but device='0,1,2' starts 3"],
        "other_types": [
            "other_types.json plans rank 0 for a T4 (15.",
            "GiB) but device 0 is a A100-SXM4-80GB (80.0 GiB)",
            "re-plan for these GPUs (batchplan plan)",
        ],
    }.items():
        error = launches[name]["error"]
        assert error.startswith("ConfigError: ") and "\n" not in error
        assert all(word in error for word in words), error
        assert launches[name]["launched"] == []


@pytest.mark.slow
def test_the_example_refuses_a_plan_for_other_devices_in_one_line(tmp_path):
    require_ultralytics()
    from tests.plans import make_plan

    data = write_dataset(tmp_path / "dataset", 4)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(make_plan((2, 3, 5))))
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "ultralytics_train.py"),
            "--data",
            str(data),
            "--device",
            "cpu",
            "--plan",
            str(plan),
            "--imgsz",
            "64",
            "--epochs",
            "1",
        ],
        env=child_env(tmp_path / "config"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {plan} is for 3 ranks but this run is one process (device='cpu'): pass the plan's 3 devices"
    )
