"""The planned Ultralytics trainer over 3 gloo ranks on CPU, with a plan of uneven batches (2, 3, 5): after 2
optimizer steps its parameters are those of Ultralytics' own single-process DetectionTrainer over the same
global batches of 10, every rank has taken the same steps, and every image of the epoch was used once; with
``w_i = b_i·W/B`` on top of Ultralytics' loss (which already sums over the images) the result is measurably
different, so the comparison can fail.

The ranks run the installed Ultralytics' ``_setup_train``, loaders, v8 detection loss and optimizer step;
what is patched to let its DDP run on CPU processes is listed in ``ultralytics_worker.py`` (world size from
torchrun, a gloo process group, no device ids for a CPU module), besides BatchNorm in eval mode and the same
starting weights in every run. The settings (no augmentation, nbs 20 over a global batch of 10: accumulate 2)
are ``ultralytics_helpers.TRAIN_SETTINGS``; the images are identical, for the reason given there.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gloo import describe_torchrun, torchrun
from tests.planner.integrations.ultralytics_helpers import (
    WORKER,
    child_env,
    require_ultralytics,
    write_dataset,
)
from tests.plans import make_plan

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.ultralytics, pytest.mark.timeout(900)]

BATCHES = (2, 3, 5)
TRAIN_IMAGES = 40  # 4 global steps of 10 = 2 optimizer steps at accumulate 2
#: a generous limit against a hang: three ranks and a reference, importing torch and Ultralytics on two
#: loaded cores (about a minute at load 9)
TIMEOUT_S = 600


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    require_ultralytics()
    root = tmp_path_factory.mktemp("ultralytics-ddp")
    data = write_dataset(root / "dataset", TRAIN_IMAGES)
    plan = root / "plan.json"
    plan.write_text(json.dumps(make_plan(BATCHES)))
    env = child_env(root / "config")
    with open(root / "reference.log", "w") as log:
        reference = subprocess.Popen(
            [sys.executable, str(WORKER), "reference", "--data", str(data), "--out", str(root)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=root,
        )
        try:
            ddp = torchrun(
                WORKER,
                "ddp",
                "--data",
                data,
                "--out",
                root,
                "--plan",
                plan,
                "--variants",
                "planned,weighted",
                nproc=3,
                log_dir=root / "logs",
                cwd=root,
                env=env,
                deadline_s=TIMEOUT_S,
            )
            reference.wait(timeout=TIMEOUT_S)
        finally:
            reference.kill()
    assert ddp.returncode == 0, describe_torchrun(ddp, root / "logs")
    assert reference.returncode == 0, (root / "reference.log").read_text()
    return root


def _rank_stderr(root: Path, rank: int) -> str:
    return "".join(p.read_text() for p in (root / "logs").rglob(f"{rank}/stderr.log"))


def _record(root: Path, name: str) -> dict:
    return json.loads((root / f"{name}.json").read_text())


def _relative_update_difference(root: Path, name: str) -> float:
    """||p - p_ref|| / ||p_ref - p_0|| over every trained tensor: the difference of the two runs' updates, relative
    to the reference's update (BatchNorm statistics, unchanged in eval mode, left out)."""
    import torch

    initial, reference, trained = (torch.load(root / f"{n}.pt") for n in ("init", "reference", name))
    keys = [k for k in reference if "running_" not in k]
    difference = sum(float(((trained[k] - reference[k]) ** 2).sum()) for k in keys) ** 0.5
    update = sum(float(((reference[k] - initial[k]) ** 2).sum()) for k in keys) ** 0.5
    assert update > 0
    return difference / update


def test_each_rank_trains_with_its_planned_batch_and_says_so(runs):
    for rank, batch in enumerate(BATCHES):
        record = _record(runs, f"planned-rank{rank}")
        assert record["loader_batch"] == batch
        assert [len(step) for step in record["step_images"]] == [batch] * 4
        assert re.search(
            rf"^batchplan: rank {rank}/3 cpu T4: batch {batch} of 10 per step \({batch * 10}\.0%, cap 64\), "
            r"4 steps per epoch$",
            _rank_stderr(runs, rank),
            re.MULTILINE,
        )
    rank0 = _rank_stderr(runs, 0)
    assert "batchplan: 3 ranks, plan " in rank0 and "accumulate 2 (nbs 20)" in rank0
    assert (
        "the ranks run on cpu); with uneven batches (2, 3, 5) the ranks' BatchNorm statistics differ" in rank0
    )


def test_accumulation_and_weight_decay_follow_the_global_batch_on_every_rank(runs):
    reference = _record(runs, "reference")
    assert reference["accumulate"] == 2 and reference["loader_batch"] == 10
    for rank in range(3):
        record = _record(runs, f"planned-rank{rank}")
        assert record["batch_size"] == 10  # the global batch, as in the single process
        assert record["accumulate"] == reference["accumulate"]
        assert record["weight_decay"] == reference["weight_decay"]


def test_every_rank_takes_the_same_optimizer_steps_as_the_single_process(runs):
    steps = {_record(runs, f"planned-rank{rank}")["optimizer_steps"] for rank in range(3)}
    assert steps == {_record(runs, "reference")["optimizer_steps"]} == {2}


def test_every_image_of_the_epoch_is_used_once(runs):
    used = [
        image
        for rank in range(3)
        for step in _record(runs, f"planned-rank{rank}")["step_images"]
        for image in step
    ]
    assert sorted(used) == [f"im{i:03d}.png" for i in range(TRAIN_IMAGES)]


def test_parameters_equal_the_single_process_run_over_the_same_global_batches(runs):
    import torch

    reference = torch.load(runs / "reference.pt")
    ranks = [torch.load(runs / f"planned-rank{rank}.pt") for rank in range(3)]
    for state in ranks[1:]:  # DDP kept the replicas identical
        assert all(torch.equal(state[k], ranks[0][k]) for k in reference)
    for key in reference:
        torch.testing.assert_close(ranks[0][key], reference[key], rtol=1e-4, atol=1e-7)
    assert _relative_update_difference(runs, "planned-rank0") <= 1e-4


def test_the_mean_loss_weight_on_top_of_a_summed_loss_changes_the_result(runs):
    # w_i = b_i·W/B is the rule for a per-rank MEAN loss; on Ultralytics' loss, which is already a sum over the
    # rank's images, it would weigh each image by b_i: measurably not the single-process run
    assert _relative_update_difference(runs, "weighted-rank0") > 1e-3
    assert "× loss_weight b_i·W/B = 0.6 on rank 0" in _rank_stderr(runs, 0)
