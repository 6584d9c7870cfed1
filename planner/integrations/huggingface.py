"""Planned batches in the Hugging Face ``Trainer``: ``BatchPlanTrainer`` (or ``BatchPlanMixin`` before any
``Trainer`` subclass, e.g. TRL's) trains each rank on its own planned batches with the right loss rule::

    trainer = BatchPlanTrainer(model=model, args=TrainingArguments(...), train_dataset=dataset,
                               batchplan="plan.json")            # or a JobSpec: planned in the job
    trainer.train()

What it changes in the Trainer, and why:

* **The train loader** is this rank's ``PlannedBatchSampler`` over the training set (with the Trainer's collator
  and its unused-column removal), device-placed by Accelerate as for one process
  (``planner.integrations.accelerate.device_loader``): the Trainer's own loader goes through
  ``accelerator.prepare``, whose ``BatchSamplerShard`` would slice the rank's planned slice again, and its
  ``per_device_train_batch_size`` is one number for all ranks (ignored here: the plan gives each rank its own).
* **Gradient accumulation** is the plan's: ``gradient_accumulation_steps`` left at 1 takes it, another value
  than the plan's is refused in one line.
* **The loss rule** is decided from what this Trainer does with this model's loss (``LossRule``, logged and
  in ``train()``'s metrics). The Trainer passes ``num_items_in_batch`` (the step's label count) into the loss
  when the model's forward takes ``**kwargs``; with ``average_tokens_across_devices`` (the default since
  transformers 4.54) that count is summed over all ranks and the loss multiplied by the world size, so the
  rank's loss is already normalised over the whole step: no per-rank weight (``global-mean``). Whether the
  model's loss really divides by it is *measured*, not read off the signature: the loss of one batch is
  computed with two counts (no gradient, eval mode) and must halve when the count doubles. A forward that takes
  ``**kwargs`` but ignores the count (sequence-classification heads in transformers 5.x, issue #47688) is a
  mean over the rank's samples; the Trainer is then told so (``model_accepts_loss_kwargs = False``: otherwise
  it would neither divide by ``gradient_accumulation_steps`` nor by the count) and the loss takes
  ``b_i·W/B`` (``mean``). ``loss_reduction=`` overrides the decision (the log says so).
* **Samples per second** count the plan's global batch (``Σ b_i × accumulate``) per optimizer step, and
  ``num_examples`` the samples an epoch of the planned sampler takes.
* ``rebalance=True`` (or ``Rebalance(...)``) starts the in-job re-balancer on the DDP model at the first
  training step, times each micro-step's forward and backward, and lets it switch the split at
  ``on_step_end`` (a ``TrainerCallback``); the weight follows each switch.

Known limitations: DeepSpeed, FSDP and DataParallel (``n_gpu > 1``) are refused; an ``IterableDataset`` is refused
(the sampler indexes the dataset); resuming mid-epoch with the re-balancer on is not supported (Accelerate skips
batches the re-balancer's timing would count); before transformers 4.57 the logged samples per second use the
Trainer's own ``per_device_train_batch_size`` (its total batch is not overridable there); in transformers 4.x
the causal-LM label count includes each row's first label, which the shifted loss never predicts (set it to
-100 for an exact token mean; 5.x counts ``labels[..., 1:]``); transformers 4.46 and 4.47 divide a mean loss by no
``gradient_accumulation_steps`` (#37766), so a plan with accumulation is refused there for such a loss. Tested
with transformers 4.57 and 5.x.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
from collections.abc import Mapping
from typing import Any

from planner.errors import ConfigError
from planner.integrations.optional import missing_library
from planner.integrations.plan_source import PlanSource, RankLaunch, resolve_plan
from planner.integrations.planned_run import PlannedRun, Rebalance, rebalance_options
from planner.runtime.weights import LossReduction, LossRule

#: what to install for this integration (the Trainer needs Accelerate)
PIP = "'transformers>=4.45' 'accelerate>=0.26'"

try:  # transformers' names are lazy: a broken dependency fails when they are taken, so take them here
    from transformers import Trainer, TrainerCallback, TrainingArguments
    from transformers import __version__ as _TRANSFORMERS_VERSION
except Exception as exc:  # not installed, or installed and broken (a torchvision built for another torch)
    raise missing_library(exc, "transformers", integration=__name__, pip=PIP) from None
from planner.integrations.accelerate import device_loader  # noqa: E402  (after transformers: its error first)

__all__ = ["PIP", "BatchPlanMixin", "BatchPlanTrainer"]

log = logging.getLogger("planner.integrations")

#: the two label counts the loss probe passes; a loss divided by the count halves from the first to the second
_PROBE_COUNTS = (1000.0, 2000.0)
_PROBE_REL_TOLERANCE = 1e-3


class _StepBoundary(TrainerCallback):
    """The optimizer-step boundary for the planned run (the re-balancer's ``step_done``)."""

    def __init__(self, run: PlannedRun) -> None:
        self.run = run

    def on_step_end(self, args, state, control, **kwargs):
        self.run.step_done()
        return control


class BatchPlanMixin:
    """Planned batches, accumulation and loss rule for a ``transformers.Trainer`` (module docstring). Put it
    before the Trainer class: ``class MyTrainer(BatchPlanMixin, SFTTrainer)``.

    Args (keyword-only, besides the Trainer's own):
        batchplan: a ``plan.json`` path (or its document) or a ``JobSpec`` to plan in the job (``autobatch_ddp``).
        rebalance: True or ``planner.integrations.Rebalance(...)`` to switch on the in-job re-balancer.
        loss_reduction: ``"auto"`` (decide from the Trainer and the model), or ``"mean"``, ``"sum"``,
            ``"global-mean"`` to declare it.
        autobatch: ``autobatch_ddp`` options with a ``JobSpec`` (``gpu=`` simulates a GPU type on CPU).

    Raises:
        ConfigError: the plan does not match the launch, ``gradient_accumulation_steps`` contradicts the plan,
            a DeepSpeed, FSDP or DataParallel set-up.
    """

    def __init__(
        self,
        *args: Any,
        batchplan: PlanSource,
        rebalance: bool | Rebalance = False,
        loss_reduction: LossReduction | str = "auto",
        autobatch: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._batchplan_declared = None if loss_reduction == "auto" else LossReduction.parse(loss_reduction)
        self._batchplan_rebalance = rebalance_options(rebalance)
        self._batchplan_weighting = False
        # the plan before the Trainer: its accumulation must be in the arguments when the Trainer builds its
        # Accelerator (transformers 4.45 hands it to it); reading the ranks sets up the process group
        training_args = kwargs.get("args", args[1] if len(args) > 1 else None)
        if training_args is None:
            training_args = kwargs["args"] = TrainingArguments(output_dir="tmp_trainer")
        group_rank = os.environ.get("GROUP_RANK")
        launch = RankLaunch(
            rank=training_args.process_index,
            world_size=training_args.world_size,
            local_rank=training_args.local_process_index,
            node_rank=int(group_rank) if group_rank not in (None, "") else None,
        )
        self.batchplan = PlannedRun(
            resolve_plan(batchplan, launch, autobatch=autobatch), framework="Hugging Face Trainer"
        )
        """this rank's planned run: sampler, loss rule, re-balancer, ``summary()``"""
        plan = self.batchplan.rank_plan
        training_args.gradient_accumulation_steps = self.batchplan.accumulation(
            training_args.gradient_accumulation_steps, "gradient_accumulation_steps"
        )
        if training_args.per_device_train_batch_size != plan.batch:
            log.info(
                "batchplan: per_device_train_batch_size=%d is not used: rank %d takes its planned batch %d",
                training_args.per_device_train_batch_size,
                plan.rank,
                plan.batch,
            )
        super().__init__(*args, **kwargs)
        self._batchplan_check_setup()
        self.add_callback(_StepBoundary(self.batchplan))

    def _batchplan_check_setup(self) -> None:
        for flag, name in (("is_deepspeed_enabled", "DeepSpeed"), ("is_fsdp_enabled", "FSDP")):
            if getattr(self, flag, False):
                raise ConfigError(
                    f"BatchPlanTrainer: batchplan plans DDP (a replicated model, gradients averaged over "
                    f"ranks), but this Trainer uses {name}: train with DDP, or without batchplan"
                )
        if self.args.n_gpu > 1:
            raise ConfigError(
                f"BatchPlanTrainer: this process drives {self.args.n_gpu} GPUs with DataParallel; launch "
                "one process per GPU (torchrun, accelerate launch) as the plan's ranks"
            )

    # ------------------------------------------------------------------------------- the train loader

    def get_train_dataloader(self):
        """This rank's planned batches over the training set, device-placed, not re-sharded."""
        from torch.utils.data import DataLoader, IterableDataset

        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        if isinstance(self.train_dataset, IterableDataset):
            raise ConfigError(
                "BatchPlanTrainer: the planned sampler indexes the training set; an IterableDataset has "
                "no indices (give a map-style dataset)"
            )
        dataset, collator = self._batchplan_dataset()
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        sampler = self.batchplan.make_sampler(
            len(dataset), seed=seed, drop_last=self.args.dataloader_drop_last
        )
        if self.batchplan.rule is None:
            self._batchplan_decide_rule(dataset, collator)
        options: dict[str, Any] = {
            "collate_fn": collator,
            "num_workers": self.args.dataloader_num_workers,
            "pin_memory": self.args.dataloader_pin_memory,
        }
        if self.args.dataloader_num_workers > 0:
            options["persistent_workers"] = self.args.dataloader_persistent_workers
            if self.args.dataloader_prefetch_factor is not None:
                options["prefetch_factor"] = self.args.dataloader_prefetch_factor
        return device_loader(self.accelerator, DataLoader(dataset, batch_sampler=sampler, **options))

    def _batchplan_dataset(self):
        """The training set and collator as the Trainer would feed them (unused columns removed)."""
        dataset, collator = self.train_dataset, self.data_collator
        try:
            import datasets

            is_hf_dataset = isinstance(dataset, datasets.Dataset)
        except ImportError:
            is_hf_dataset = False
        if is_hf_dataset:
            dataset = self._remove_unused_columns(dataset, description="training")
        else:
            collator = self._get_collator_with_removed_columns(collator, description="training")
        return dataset, collator

    def num_examples(self, dataloader) -> int:
        """Samples of an epoch: what the planned sampler hands out (all ranks), for the planned loader."""
        sampler = self.batchplan.sampler
        if sampler is not None and getattr(dataloader, "batch_sampler", None) is sampler:
            return sampler.samples_per_epoch
        return super().num_examples(dataloader)

    def get_total_train_batch_size(self, args) -> int:
        """The plan's global batch (``Σ b_i × accumulate``): what one optimizer step takes over all ranks, so the
        Trainer's samples per second count the real step batch."""
        return self.batchplan.rank_plan.global_batch

    # ----------------------------------------------------------------------------------- the loss rule

    def _batchplan_decide_rule(self, dataset, collator) -> None:
        """Decide the loss rule from a probe of the model's loss, the same on every rank (checked)."""
        count = min(len(dataset), self.batchplan.rank_plan.batch)
        inputs = self._prepare_inputs(collator([dataset[i] for i in range(count)]))
        reduction, why = self._batchplan_probe(inputs)
        self._batchplan_agree(reduction)
        if self._batchplan_declared is not None:
            rule = LossRule(
                reduction=self._batchplan_declared,
                declared=True,
                why=f"loss_reduction={self._batchplan_declared.value!r} given (decided would be "
                f"{reduction.value}: {why})",
            )
        else:
            rule = LossRule(reduction=reduction, why=why)
        self.batchplan.set_rule(rule)

    def _batchplan_probe(self, inputs: Mapping[str, Any]) -> tuple[LossReduction, str]:
        """How this Trainer's loss of this model reduces: ``global-mean`` when it divides by a label count the
        Trainer sums over all ranks, else ``mean``; may set ``model_accepts_loss_kwargs`` (module docstring)."""
        takes_count = (
            (self.model_accepts_loss_kwargs or self.compute_loss_func is not None)
            and isinstance(inputs, Mapping)
            and "labels" in inputs
            and "num_items_in_batch" in inspect.signature(Trainer.compute_loss).parameters
        )
        if not takes_count:
            self._batchplan_check_accumulation_scaling()
            return LossReduction.MEAN, (
                "the Trainer gives this loss no label count (the model's forward takes no "
                "**kwargs, or the batch has no labels): the model's mean over the rank's "
                "samples, divided by gradient_accumulation_steps"
            )
        losses = self._batchplan_probe_losses(inputs)
        ratio = losses[0] / losses[1] if losses[1] != 0 else math.nan
        halves = math.isclose(ratio, _PROBE_COUNTS[1] / _PROBE_COUNTS[0], rel_tol=_PROBE_REL_TOLERANCE)
        unchanged = math.isclose(ratio, 1.0, rel_tol=_PROBE_REL_TOLERANCE)
        if halves and getattr(self.args, "average_tokens_across_devices", False):
            return LossReduction.GLOBAL_MEAN, (
                "the loss is divided by num_items_in_batch, which the Trainer sums "
                "over all ranks (average_tokens_across_devices=True)"
            )
        if halves:
            return LossReduction.MEAN, (
                "the loss is divided by num_items_in_batch counted on this rank only "
                "(average_tokens_across_devices is off): a mean over the rank's own items "
                "(b_i·W/B is exact when every sample has as many labelled items)"
            )
        if unchanged and self.compute_loss_func is not None:
            raise ConfigError(
                "BatchPlanTrainer: compute_loss_func ignores num_items_in_batch, so the Trainer would not "
                "divide it by gradient_accumulation_steps: divide by num_items_in_batch in it, or pass "
                "loss_reduction='mean' and drop compute_loss_func"
            )
        if unchanged:
            self._batchplan_check_accumulation_scaling()
            self.model_accepts_loss_kwargs = False
            return LossReduction.MEAN, (
                "the model's forward takes **kwargs but its loss ignores num_items_in_batch "
                "(transformers #47688): the Trainer is told so (model_accepts_loss_kwargs="
                "False) and divides by gradient_accumulation_steps; the loss is the model's "
                "mean over the rank's samples"
            )
        raise ConfigError(
            f"BatchPlanTrainer: cannot tell how this model's loss reduces: with num_items_in_batch "
            f"{_PROBE_COUNTS[0]:g} and {_PROBE_COUNTS[1]:g} it gave {losses[0]!r} and {losses[1]!r} "
            f"(neither halved nor unchanged); pass loss_reduction='mean' or 'global-mean'"
        )

    def _batchplan_check_accumulation_scaling(self) -> None:
        """transformers 4.46 and 4.47 divide a mean loss that takes no label count by no
        ``gradient_accumulation_steps`` (transformers #37766; 4.45 lets Accelerate divide, 4.48 on divide in
        ``training_step``): with the plan's accumulation the step would be that many times too large."""
        accumulate = self.batchplan.rank_plan.accumulate
        if accumulate > 1 and _TRANSFORMERS_VERSION.startswith(("4.46.", "4.47.")):
            raise ConfigError(
                f"BatchPlanTrainer: transformers {_TRANSFORMERS_VERSION} does not divide this model's "
                f"mean loss by gradient_accumulation_steps (transformers #37766), so the plan's accumulate "
                f"{accumulate} would scale the step {accumulate}×: upgrade to transformers>=4.48, or plan "
                "without accumulation"
            )

    def _batchplan_probe_losses(self, inputs: Mapping[str, Any]) -> list[float]:
        """The training loss of one batch with two label counts: no gradient, eval mode (no dropout), unweighted."""
        import torch

        model = self.model
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                return [
                    float(
                        self.compute_loss(
                            model, dict(inputs), num_items_in_batch=torch.tensor(n, device=self.args.device)
                        )
                    )
                    for n in _PROBE_COUNTS
                ]
        finally:
            model.train(was_training)

    def _batchplan_agree(self, reduction: LossReduction) -> None:
        """Every rank must apply the same rule (a mixed rule would leave the gradient neither rule's)."""
        import torch.distributed as dist

        if self.args.world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
            return
        mine = (reduction.value, bool(self.model_accepts_loss_kwargs))
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        if len(set(everyone)) != 1:
            detail = "; ".join(f"rank {r}: {e[0]}" for r, e in enumerate(everyone))
            raise ConfigError(
                f"BatchPlanTrainer: the ranks decided different loss rules ({detail}); pass "
                "loss_reduction= to declare one"
            )

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None, **kwargs):
        """The Trainer's loss, times the planned run's factor in a training step (``b_i·W/B`` or 1)."""
        if num_items_in_batch is not None:
            kwargs["num_items_in_batch"] = num_items_in_batch
        result = super().compute_loss(model, inputs, return_outputs=return_outputs, **kwargs)
        if not self._batchplan_weighting:
            return result
        factor = self.batchplan.loss_factor()
        if factor == 1.0:
            return result
        if return_outputs:
            loss, outputs = result
            return loss * factor, outputs
        return result * factor

    # ------------------------------------------------------------------------------------ the step

    def training_step(self, model, inputs, *args, **kwargs):
        """One micro-step: weighted, and timed by the re-balancer when it is on."""
        if self._batchplan_rebalance is not None and self.batchplan.rebalancer is None:
            self.batchplan.attach_rebalancer(model, self._batchplan_rebalance, device=self.args.device)
        self._batchplan_weighting = True
        try:
            with self.batchplan.compute():
                return super().training_step(model, inputs, *args, **kwargs)
        finally:
            self._batchplan_weighting = False

    def train(self, *args: Any, **kwargs: Any):
        """The Trainer's ``train()``; its metrics (the run's summary) carry the plan applied and the loss rule."""
        output = super().train(*args, **kwargs)
        output.metrics.update(self.batchplan.summary())
        log.info("%s", self.batchplan.summary_line())
        return output


class BatchPlanTrainer(BatchPlanMixin, Trainer):
    """``transformers.Trainer`` with planned batches (``BatchPlanMixin``)."""
