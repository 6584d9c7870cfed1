"""Planned batches in PyTorch Lightning: ``BatchPlanCallback`` gives each rank its planned batches, takes the
accumulation from the plan, weights the loss per the rule, and can re-balance in the job::

    batchplan = BatchPlanCallback("plan.json")              # or a JobSpec: planned in the job, at setup
    class Net(L.LightningModule):
        def train_dataloader(self):
            return batchplan.dataloader(dataset)              # this rank's planned batches
        ...                                                   # training_step returns the usual mean loss
    L.Trainer(strategy="ddp", callbacks=[batchplan], ...).fit(Net())

What it does in the Trainer, and why:

* **The sampler.** Lightning replaces a loader's sampler with a ``DistributedSampler`` when
  ``use_distributed_sampler`` is on (the default), which would undo the planned one. At ``setup`` the callback
  turns it off for the run (logged; Lightning then shards no other loader either: give validation loaders a
  ``DistributedSampler`` yourself to split them), or refuses in one line where this Lightning cannot. At the
  start of training the train loader must be the callback's (``dataloader()`` or ``datamodule()``), or the
  run stops with one line naming it. Lightning gives the epoch to a loader's ``sampler`` but not to its
  ``batch_sampler``: the callback sets the planned sampler's epoch itself.
* **Accumulation** is the plan's: ``accumulate_grad_batches`` left at 1 takes it (Lightning's own callbacks
  set it the same way), another value is refused in one line, and so is a ``GradientAccumulationScheduler``.
* **The loss.** Lightning passes what ``training_step`` returns to ``backward`` unchanged (divided by
  ``accumulate_grad_batches``) and DDP averages the ranks' gradients, so the module's own reduction decides
  the rule: ``loss_reduction="mean"`` (torch's default) takes ``b_i·W/B``, ``"sum"`` or ``"global-mean"`` none
  (``planner.runtime.weights.LossRule``). The callback applies the factor in ``LightningModule.backward`` (the
  hook Lightning calls for every backward, automatic or manual): ``training_step`` stays as it is, and what it
  logs is the unweighted loss.
* ``rebalance=True`` (or ``Rebalance(...)``) starts the in-job re-balancer on the DDP model when training
  starts; each micro-step's forward and backward is timed from ``on_train_batch_start`` to
  ``on_after_backward`` and the split may switch at ``on_train_batch_end`` after an optimizer step; the weight
  follows each switch.

The rule, the split and what re-balancing did are logged at the end of ``fit`` (``summary_line``) and sent to
the Trainer's loggers as hyperparameters (``summary``).

Known limitations: FSDP, DeepSpeed and model-parallel strategies are refused (the plan and the weights assume
DDP); with several optimizers, every ``optimizer.step`` counts as a step of the re-balancer; the callback is
a ``lightning.pytorch`` callback (the standalone ``pytorch_lightning`` package is another namespace).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from planner.errors import ConfigError
from planner.integrations.optional import missing_library
from planner.integrations.plan_source import PlanSource, RankLaunch, resolve_plan
from planner.integrations.planned_run import PlannedRun, Rebalance, rebalance_options
from planner.plan.types import Plan
from planner.runtime.weights import LossReduction, LossRule

if TYPE_CHECKING:
    from torch.utils.data import DataLoader, Dataset

__all__ = ["PIP", "BatchPlanCallback", "trainer_devices"]

PIP = "'lightning>=2.0'"

try:
    import lightning.pytorch as pl
except Exception as exc:  # not installed, or installed and broken: one line either way
    raise missing_library(exc, "lightning", integration=__name__, pip=PIP) from None

log = logging.getLogger("planner.integrations")

#: strategies whose gradients or memory are not DDP's (the plan's premise), by class name
_REFUSED_STRATEGIES = ("FSDPStrategy", "DeepSpeedStrategy", "ModelParallelStrategy", "XLAStrategy")


def trainer_devices(plan: str | os.PathLike | Mapping[str, Any] | Plan) -> dict[str, int]:
    """``num_nodes`` and ``devices`` for ``L.Trainer`` from a plan: what Lightning's own launcher needs to start
    the plan's ranks (``L.Trainer(**trainer_devices("plan.json"), ...)``).

    Raises:
        ConfigError: an invalid plan, or nodes with different numbers of ranks (Lightning starts the same number
            on every node: launch each node's torchrun line from the plan instead).
    """
    from planner.plan.io import load_plan
    from planner.plan.validate import validate_plan

    # the whole plan read and validated once, through the codec (a path within the plan file's size limit)
    typed = validate_plan(plan) if isinstance(plan, Mapping | Plan) else load_plan(plan)
    counts = [node.nproc_per_node for node in typed.nodes]
    if len(set(counts)) != 1:
        raise ConfigError(
            f"Lightning starts the same number of processes on every node (devices=), but this plan has "
            f"{counts} ranks per node: launch each node's torchrun line from the plan instead"
        )
    return {"num_nodes": len(counts), "devices": counts[0]}


class BatchPlanCallback(pl.Callback):
    """Planned batches, accumulation, loss weight and optional re-balancing for a Lightning ``Trainer``
    (module docstring).

    Args:
        plan: a ``plan.json`` path (or its document) or a ``JobSpec`` to plan in the job at ``setup``.
        loss_reduction: how ``training_step``'s loss reduces over the rank's samples: ``"mean"`` (default),
            ``"sum"`` or ``"global-mean"``.
        rebalance: True or ``planner.integrations.Rebalance(...)`` to switch on the in-job re-balancer.
        autobatch: ``autobatch_ddp`` options with a ``JobSpec`` (``gpu=`` simulates a GPU type on CPU).
        seed, shuffle, drop_last: the planned sampler's; the seed must be the same on every rank.
    """

    def __init__(
        self,
        plan: PlanSource,
        *,
        loss_reduction: LossReduction | str = LossReduction.MEAN,
        rebalance: bool | Rebalance = False,
        autobatch: Mapping[str, Any] | None = None,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
    ) -> None:
        super().__init__()
        self.plan_source = plan
        self.reduction = LossReduction.parse(loss_reduction)
        self.rebalance = rebalance_options(rebalance)
        self.autobatch = autobatch
        self.sampler_options = {"seed": int(seed), "shuffle": bool(shuffle), "drop_last": bool(drop_last)}
        self.run: PlannedRun | None = None
        """this rank's planned run, from ``setup`` on"""
        self._module: Any = None
        self._open: contextlib.ExitStack | None = None
        self._last_global_step = 0

    # --------------------------------------------------------------------------------- set-up

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit" or self.run is not None:
            return
        self._check_strategy(trainer)
        launch = RankLaunch(
            rank=trainer.global_rank,
            world_size=trainer.world_size,
            local_rank=trainer.local_rank,
            node_rank=trainer.node_rank,
        )
        self.run = PlannedRun(
            resolve_plan(self.plan_source, launch, autobatch=self.autobatch), framework="Lightning"
        )
        self._take_accumulation(trainer)
        self._keep_the_sampler(trainer)
        self.run.set_rule(
            LossRule(
                reduction=self.reduction,
                declared=True,
                why=(
                    "Lightning passes training_step's loss to backward unchanged and DDP averages the ranks' gradients "
                    f"(loss_reduction={self.reduction.value!r})"
                ),
            )
        )
        self._weigh_backward(pl_module)

    @staticmethod
    def _check_strategy(trainer) -> None:
        name = type(trainer.strategy).__name__
        if name in _REFUSED_STRATEGIES:
            raise ConfigError(
                f"BatchPlanCallback: batchplan plans DDP (a replicated model, gradients averaged over "
                f"ranks), but the Trainer's strategy is {name}: use strategy='ddp'"
            )

    def _take_accumulation(self, trainer) -> None:
        assert self.run is not None
        plan = self.run.rank_plan
        for callback in trainer.callbacks:
            if isinstance(callback, pl.callbacks.GradientAccumulationScheduler):
                raise ConfigError(
                    f"BatchPlanCallback: GradientAccumulationScheduler changes accumulate_grad_batches "
                    f"by epoch, but the plan fixes it at {plan.accumulate}: remove the scheduler"
                )
        trainer.accumulate_grad_batches = self.run.accumulation(
            trainer.accumulate_grad_batches, "accumulate_grad_batches"
        )

    def _keep_the_sampler(self, trainer) -> None:
        """Lightning must not replace the planned sampler with a DistributedSampler (``on_train_start`` checks
        that it did not, wherever this Lightning keeps the setting)."""
        connector = getattr(trainer, "_accelerator_connector", None)
        if trainer.world_size > 1 and getattr(connector, "use_distributed_sampler", False):
            connector.use_distributed_sampler = False
            log.info(
                "batchplan: use_distributed_sampler=False for this run (Lightning would replace the planned "
                "sampler; validation loaders are no longer split by Lightning: give them a DistributedSampler "
                "to split them)"
            )

    def _weigh_backward(self, pl_module) -> None:
        """``pl_module.backward`` (every backward Lightning runs, automatic or manual) takes the planned factor."""
        original = pl_module.backward
        run = self.run
        assert run is not None

        def backward(loss, *args: Any, **kwargs: Any) -> None:
            return original(loss * run.loss_factor(), *args, **kwargs)

        pl_module.backward = backward
        self._module = pl_module

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit" and self._module is not None:
            with contextlib.suppress(AttributeError):
                del (
                    self._module.backward
                )  # the instance's wrapper; the class's hook is the module's own again
            self._module = None

    # ---------------------------------------------------------------------------------- the data

    def dataloader(self, dataset: Dataset, **loader_options: Any) -> DataLoader:
        """This rank's planned batches of ``dataset`` (call it from ``train_dataloader()``: the plan is read at
        ``setup``). ``loader_options`` are further ``DataLoader`` options (``num_workers``, ``collate_fn`` ...)."""
        from torch.utils.data import DataLoader

        if self.run is None:
            raise ConfigError(
                "BatchPlanCallback.dataloader() before the Trainer's setup: call it from "
                "train_dataloader() (or use datamodule()), with the callback in Trainer(callbacks=...)"
            )
        for refused in ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"):
            if refused in loader_options:
                raise ConfigError(
                    f"BatchPlanCallback.dataloader(): {refused}= is the plan's to decide; drop it"
                )
        sampler = self.run.make_sampler(len(dataset), **self.sampler_options)
        return DataLoader(dataset, batch_sampler=sampler, **loader_options)

    def datamodule(
        self,
        train_dataset: Dataset,
        *,
        val_dataset: Dataset | None = None,
        val_batch_size: int = 1,
        **loader_options: Any,
    ):
        """A ``LightningDataModule`` whose train loader is this rank's planned batches of ``train_dataset``
        (``trainer.fit(model, datamodule=batchplan.datamodule(train_set))``)."""
        from torch.utils.data import DataLoader
        from torch.utils.data.distributed import DistributedSampler

        callback = self

        class PlannedDataModule(pl.LightningDataModule):
            def train_dataloader(self):
                return callback.dataloader(train_dataset, **loader_options)

            if val_dataset is not None:

                def val_dataloader(self):
                    # Lightning splits no loader in a planned run (use_distributed_sampler is off): split it here
                    sampler = (
                        DistributedSampler(val_dataset, shuffle=False)
                        if self.trainer.world_size > 1
                        else None
                    )
                    return DataLoader(
                        val_dataset, batch_size=val_batch_size, sampler=sampler, **loader_options
                    )

        return PlannedDataModule()

    # ------------------------------------------------------------------------------------- training

    def on_train_start(self, trainer, pl_module) -> None:
        run = self._require_run()
        loader = trainer.train_dataloader
        if getattr(loader, "batch_sampler", None) is not run.sampler or run.sampler is None:
            from torch.utils.data.distributed import DistributedSampler

            if isinstance(getattr(loader, "sampler", None), DistributedSampler):
                raise ConfigError(
                    "BatchPlanCallback: Lightning replaced the planned sampler with a DistributedSampler: "
                    "build the Trainer with use_distributed_sampler=False"
                )
            raise ConfigError(
                "BatchPlanCallback: the train loader does not give this rank its planned batches: return "
                "batchplan.dataloader(dataset) from train_dataloader() (or fit with datamodule=)"
            )
        if self.rebalance is not None:
            run.attach_rebalancer(
                trainer.strategy.model if trainer.world_size > 1 else None,
                self.rebalance,
                device=pl_module.device,
            )
        self._last_global_step = trainer.global_step
        if trainer.loggers:
            for logger in trainer.loggers:
                logger.log_hyperparams({k: v for k, v in run.summary().items() if v is not None})

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        sampler = self._require_run().sampler
        if sampler is not None:
            sampler.set_epoch(
                trainer.current_epoch
            )  # Lightning sets the epoch of a loader's sampler, not its batch_sampler

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._close()
        self._open = contextlib.ExitStack()
        self._open.enter_context(self._require_run().compute())

    def on_after_backward(self, trainer, pl_module) -> None:
        self._close()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._close()  # a training_step that returned None ran no backward
        if trainer.global_step > self._last_global_step:  # an optimizer step ran in this batch
            self._last_global_step = trainer.global_step
            self._require_run().step_done()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if self._open is not None:
            stack, self._open = self._open, None
            try:
                stack.__exit__(type(exception), exception, exception.__traceback__)
            except Exception as translated:  # the re-balancer names a rank that died or hung
                if translated is not exception:
                    log.error("batchplan: %s", translated)

    def on_fit_end(self, trainer, pl_module) -> None:
        if self.run is not None:
            log.info("%s", self.run.summary_line())

    def _close(self) -> None:
        if self._open is not None:
            stack, self._open = self._open, None
            stack.close()

    def _require_run(self) -> PlannedRun:
        if self.run is None:
            raise ConfigError(
                "BatchPlanCallback: no plan yet (the callback reads it at the Trainer's fit setup)"
            )
        return self.run

    def summary(self) -> dict[str, Any]:
        """What the run applied (``PlannedRun.summary``)."""
        return self._require_run().summary()

    def summary_line(self) -> str:
        return self._require_run().summary_line()
