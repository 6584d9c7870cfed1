"""Lightning with planned batches (planner.integrations.lightning.BatchPlanCallback): three gloo ranks with
batches 2, 5, 9 and accumulation 2 (taken from the plan; the Trainer left at 1 and at its default
use_distributed_sampler) train 4 optimizer steps and end with one process's parameters on the same global
batches; declaring the loss a sum misses; the re-balancer reorders the batches by speed and stays exact."""

from __future__ import annotations

import pytest
import torch

from tests.planner.integrations.exactness import (
    ACCUMULATE,
    BATCHES,
    EXACT,
    OPTIMIZER_STEPS,
    PLANNED_GPUS,
    REBALANCE_STEPS,
    SAMPLE_S,
    SEED,
    SPEEDS,
    STEP_BATCH,
    WRONG,
    IndexedRegression,
    assert_planned_job_trained_exactly,
    assert_rebalanced_exactly,
    flat,
    init_gloo,
    make_mlp,
    mlp_reference,
    plan_document,
    planned_job,
    relative_difference,
    requires_integration,
    samples_of_epoch_once,
    save,
    shared_profile_cache,
    spawn,
)
from tests.planner.integrations.example_runs import PYTHON, REPO, readme_script, run_example, summaries

pytestmark = [
    pytest.mark.lightning,
    pytest.mark.timeout(420),
    requires_integration("planner.integrations.lightning"),
]

LEARNING_RATE = 0.5
REBALANCE_LEARNING_RATE = 0.1


def _train(
    rank: int,
    *,
    loss_reduction: str = "mean",
    rebalance=False,
    steps: int = OPTIMIZER_STEPS,
    lr: float = LEARNING_RATE,
    plan=None,
    autobatch=None,
) -> dict:
    import lightning.pytorch as pl

    from planner.integrations.lightning import BatchPlanCallback

    batchplan = BatchPlanCallback(
        plan if plan is not None else plan_document(),
        loss_reduction=loss_reduction,
        rebalance=rebalance,
        autobatch=autobatch,
        seed=SEED,
    )

    class Regression(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_mlp()
            self.taken: list[list[int]] = []

        def training_step(self, batch, batch_idx):
            x, y, index = batch
            self.taken.append(index.tolist())
            return torch.nn.functional.mse_loss(self.net(x), y)  # the plain mean: the callback weights it

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=lr)

        def train_dataloader(self):
            return batchplan.dataloader(IndexedRegression())

    module = Regression()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=len(BATCHES),
        strategy="ddp",
        max_steps=steps,
        callbacks=[batchplan],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module)
    run = batchplan.run
    return {
        "params": flat(module.net),
        "taken": module.taken,
        "global_step": trainer.global_step,
        "accumulate": trainer.accumulate_grad_batches,
        "rule": run.rule,
        "batches": run.rank_plan.batches,
        "batches_last": list(run.rebalancer.report().batches_last) if run.rebalancer else None,
        "switches": len(run.rebalancer.switches) if run.rebalancer else 0,
    }


def _worker(rank: int, port: int, out_dir: str, profiles: str) -> None:
    import logging

    import torch.distributed as dist

    from planner.integrations import Rebalance
    from planner.runtime.simulate import SimulatedSpeed

    logging.basicConfig(level=logging.INFO)
    logging.getLogger("lightning").setLevel(logging.ERROR)
    init_gloo(rank, port)  # Lightning keeps a group it finds initialised (as under torchrun)
    try:
        result = {
            "mean": _train(rank),
            "sum": _train(rank, loss_reduction="sum"),
            "rebalance": _train(
                rank,
                steps=REBALANCE_STEPS,
                lr=REBALANCE_LEARNING_RATE,
                rebalance=Rebalance(simulate=SimulatedSpeed(factors=SPEEDS, sample_s=SAMPLE_S)),
            ),
            "job": _train(
                rank, plan=planned_job(), autobatch={"gpu": PLANNED_GPUS[rank], "cache_dir": profiles}
            ),
        }
        save(out_dir, rank, result)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return spawn(_worker, tmp_path_factory.mktemp("lightning"), str(shared_profile_cache(tmp_path_factory)))


@pytest.mark.dist
@pytest.mark.slow
def test_lightning_with_planned_batches_equals_one_process(ranks):
    reference = mlp_reference(LEARNING_RATE)
    for rank, result in enumerate(ranks):
        run = result["mean"]
        assert run["rule"].reduction.value == "mean" and run["accumulate"] == ACCUMULATE
        assert run["global_step"] == OPTIMIZER_STEPS
        assert [len(b) for b in run["taken"]] == [BATCHES[rank]] * (OPTIMIZER_STEPS * ACCUMULATE)
        assert relative_difference(run["params"], reference) < EXACT, relative_difference(
            run["params"], reference
        )
    assert samples_of_epoch_once([r["mean"]["taken"] for r in ranks])


@pytest.mark.dist
@pytest.mark.slow
def test_declaring_the_loss_a_sum_drops_the_weight_and_misses(ranks):
    reference = mlp_reference(LEARNING_RATE)
    for result in ranks:
        assert relative_difference(result["sum"]["params"], reference) > WRONG


@pytest.mark.dist
@pytest.mark.slow
def test_rebalancer_orders_the_batches_by_speed_and_keeps_the_gradient_exact(ranks):
    assert_rebalanced_exactly(
        [r["rebalance"] for r in ranks], mlp_reference(REBALANCE_LEARNING_RATE, steps=REBALANCE_STEPS)
    )


@pytest.mark.dist
@pytest.mark.slow
def test_the_readme_script_is_the_example_and_lightning_s_own_launcher_runs_it(tmp_path):
    example = REPO / "examples" / "train_lightning.py"
    assert readme_script("Lightning") == example.read_text()
    stdout = run_example(
        lambda port: [PYTHON, str(example), "plan.json"],
        tmp_path,
        port_env="MASTER_PORT",
        MASTER_ADDR="127.0.0.1",
    )
    assert summaries(stdout, "Lightning") == {0: "mean", 1: "mean", 2: "mean"}, stdout


@pytest.mark.dist
@pytest.mark.slow
def test_a_job_planned_in_the_run_trains_its_own_batches_exactly(ranks):
    assert_planned_job_trained_exactly(
        [r["job"] for r in ranks], lambda batches: mlp_reference(LEARNING_RATE, batches=batches, accumulate=1)
    )


def _one_rank_fit(
    tmp_path, *, own_loader: bool = True, callbacks=(), datamodule: bool = False, **trainer_options
):
    import lightning.pytorch as pl

    from planner.integrations.lightning import BatchPlanCallback
    from tests.plans import make_plan

    batchplan = BatchPlanCallback(
        make_plan((STEP_BATCH,), nodes=(("node-a", 1),), accumulate=ACCUMULATE), seed=SEED
    )

    class Regression(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_mlp()

        def training_step(self, batch, batch_idx):
            x, y, _ = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=LEARNING_RATE)

        if not datamodule:

            def train_dataloader(self):
                if own_loader:
                    return batchplan.dataloader(IndexedRegression())
                return torch.utils.data.DataLoader(IndexedRegression(), batch_size=4)

    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=1,
        callbacks=[batchplan, *callbacks],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        **trainer_options,
    )
    module = Regression()
    trainer.fit(module, datamodule=batchplan.datamodule(IndexedRegression()) if datamodule else None)
    return module, batchplan


def test_an_accumulation_other_than_the_plan_s_is_refused_in_one_line(tmp_path):
    from planner.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^accumulate_grad_batches=3 contradicts the plan's accumulate 2"):
        _one_rank_fit(tmp_path, accumulate_grad_batches=3)


def test_an_accumulation_scheduler_is_refused(tmp_path):
    import lightning.pytorch as pl

    from planner.errors import ConfigError

    with pytest.raises(ConfigError, match="GradientAccumulationScheduler changes accumulate_grad_batches"):
        _one_rank_fit(tmp_path, callbacks=[pl.callbacks.GradientAccumulationScheduler({0: 2})])


def test_a_train_loader_that_is_not_the_planned_one_is_refused(tmp_path):
    from planner.errors import ConfigError

    with pytest.raises(
        ConfigError, match=r"return batchplan.dataloader\(dataset\) from train_dataloader\(\)"
    ):
        _one_rank_fit(tmp_path, own_loader=False)


def test_a_planned_datamodule_trains_one_rank_exactly_with_the_plan_s_accumulation(tmp_path):
    module, batchplan = _one_rank_fit(tmp_path, datamodule=True)
    assert module.trainer.accumulate_grad_batches == ACCUMULATE and module.trainer.global_step == 1
    assert batchplan.summary()["batchplan_loss_rule"] == "mean"
    reference = mlp_reference(LEARNING_RATE, steps=1, batches=(STEP_BATCH,))
    assert relative_difference(flat(module.net), reference) < EXACT


def test_trainer_devices_reads_the_plan_once_through_the_codec(tmp_path):
    """From a path, a document or a typed Plan alike; nodes with different numbers of ranks are one line, and a
    plan that is not one is refused with the plan file's fix."""
    from planner.errors import ConfigError
    from planner.integrations.lightning import trainer_devices
    from planner.plan.io import write_plan
    from planner.plan.validate import validate_plan
    from tests.plans import make_plan

    even = make_plan((4, 4, 4, 4), nodes=(("a", 2), ("b", 2)))
    path = tmp_path / "plan.json"
    write_plan(even, path)
    for source in (path, str(path), even, validate_plan(even)):
        assert trainer_devices(source) == {"num_nodes": 2, "devices": 2}
    with pytest.raises(ConfigError, match=r"\[2, 1\] ranks per node"):
        trainer_devices(make_plan((4, 4, 4), nodes=(("a", 2), ("b", 1))))
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="regenerate it with batchplan plan"):
        trainer_devices(path)
