"""A hand-written Accelerate loop with planned batches (planner.integrations.accelerate.prepare_planned): three
gloo ranks with batches 2, 5, 9 and accumulation 2 (taken from the plan by an Accelerator left at 1) train 4
optimizer steps and end with one process's parameters on the same global batches; declaring the loss a sum
(no weight) misses. Accelerate must not re-shard the planned loader, and batches arrive on the device."""

from __future__ import annotations

import pytest
import torch

from tests.planner.integrations.exactness import (
    ACCUMULATE,
    BATCHES,
    EXACT,
    OPTIMIZER_STEPS,
    SEED,
    WRONG,
    IndexedRegression,
    dist_environment,
    flat,
    make_mlp,
    mlp_reference,
    plan_document,
    relative_difference,
    requires_integration,
    samples_of_epoch_once,
    save,
    spawn,
)
from tests.planner.integrations.example_runs import PYTHON, REPO, readme_script, run_example, summaries

pytestmark = [
    pytest.mark.dist,
    pytest.mark.slow,
    pytest.mark.accelerate,
    pytest.mark.timeout(300),
    requires_integration("planner.integrations.accelerate"),
]

LEARNING_RATE = 0.5


def _train(accelerator, loss_reduction: str) -> dict:
    from planner.integrations.accelerate import prepare_planned

    planned = prepare_planned(
        accelerator, plan_document(), IndexedRegression(), loss_reduction=loss_reduction, seed=SEED
    )
    model = make_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    model, optimizer = accelerator.prepare(model, optimizer)
    assert accelerator.prepare(planned.loader) is planned.loader  # prepared once: never sliced again
    taken, steps, devices = [], 0, set()
    for x, y, index in planned.loader:
        taken.append(index.tolist())
        devices.add(str(x.device))
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y) * planned.loss_weight
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            steps += int(accelerator.sync_gradients)
    return {
        "params": flat(accelerator.unwrap_model(model)),
        "taken": taken,
        "steps": steps,
        "devices": devices,
        "accumulate": accelerator.gradient_accumulation_steps,
        "rule": planned.run.rule,
        "wrapped": type(model).__name__,
        "batch_sampler": type(planned.loader.batch_sampler).__name__,
    }


def _worker(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist
    from accelerate import Accelerator

    dist_environment(rank, port)
    accelerator = Accelerator(cpu=True)
    try:
        result = {"mean": _train(accelerator, "mean"), "sum": _train(accelerator, "sum")}
        save(out_dir, rank, result)
        accelerator.wait_for_everyone()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return spawn(_worker, tmp_path_factory.mktemp("accelerate"))


def test_accelerate_loop_with_planned_batches_equals_one_process(ranks):
    reference = mlp_reference(LEARNING_RATE)
    for rank, result in enumerate(ranks):
        run = result["mean"]
        assert run["wrapped"] == "DistributedDataParallel" and run["batch_sampler"] == "PlannedBatchSampler"
        assert run["devices"] == {"cpu"} and run["accumulate"] == ACCUMULATE
        assert run["rule"].reduction.value == "mean"
        assert run["steps"] == OPTIMIZER_STEPS
        assert [len(b) for b in run["taken"]] == [BATCHES[rank]] * (OPTIMIZER_STEPS * ACCUMULATE)
        assert relative_difference(run["params"], reference) < EXACT, relative_difference(
            run["params"], reference
        )
    assert samples_of_epoch_once([r["mean"]["taken"] for r in ranks])


def test_declaring_the_loss_a_sum_drops_the_weight_and_misses(ranks):
    reference = mlp_reference(LEARNING_RATE)
    for result in ranks:
        assert result["sum"]["rule"].reduction.value == "sum"
        assert relative_difference(result["sum"]["params"], reference) > WRONG


@pytest.mark.dist
@pytest.mark.slow
def test_the_readme_script_is_the_example_and_it_runs_under_accelerate_launch(tmp_path):
    example = REPO / "examples" / "train_accelerate.py"
    assert readme_script("Accelerate") == example.read_text()
    stdout = run_example(
        lambda port: [
            PYTHON,
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            "--num_processes",
            "3",
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "--main_process_port",
            str(port),
            str(example),
            "plan.json",
        ],
        tmp_path,
    )
    assert summaries(stdout, "Accelerate") == {0: "mean", 1: "mean", 2: "mean"}, stdout
