"""Planned batches for a hand-written Hugging Face Accelerate loop, and the device-placed loader the Trainer
integration uses too.

``accelerator.prepare(loader)`` re-shards any loader it gets once there is more than one process: it wraps the
batch sampler in ``BatchSamplerShard``, which would slice ``PlannedBatchSampler`` (already this rank's slice)
again. ``device_loader`` asks Accelerate for its ``DataLoaderShard`` as for one process (no re-sharding: the
planned sampler is the rank's) on the accelerator's device, so batches still arrive on the device, the epoch
reaches the sampler (``set_epoch``), the loader's end is seen by ``accelerator.accumulate``, and
``accelerator.save_state`` / ``skip_first_batches`` know it::

    from accelerate import Accelerator
    from planner.integrations.accelerate import prepare_planned

    accelerator = Accelerator()
    planned = prepare_planned(accelerator, "plan.json", dataset)          # after Accelerator(): ranks known
    model, optimizer = accelerator.prepare(model, optimizer)               # not the loader
    for x, y in planned.loader:
        with accelerator.accumulate(model):
            loss = criterion(model(x), y) * planned.loss_weight            # b_i·W/B under the mean rule
            accelerator.backward(loss)                                     # Accelerate divides by accumulate
            optimizer.step()
            optimizer.zero_grad()

The loss rule is the script's own: Accelerate passes the loss through unchanged, so ``loss_reduction`` says
how the script reduces it (``"mean"``, torch's default: the weight ``b_i·W/B``; ``"sum"`` or
``"global-mean"``: none). ``gradient_accumulation_steps`` comes from the plan: an ``Accelerator`` left at 1 takes
the plan's, one set to another value is refused.

Known limitations: DeepSpeed, FSDP, Megatron-LM and XLA set-ups are refused (the plan's memory and the weights
assume DDP's replicated model and gradient average); the re-balancer is available through
``PlannedRun.attach_rebalancer`` on the prepared (DDP) model, without a one-argument switch here.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from planner.errors import ConfigError
from planner.integrations.optional import missing_library
from planner.integrations.plan_source import PlanSource, RankLaunch, resolve_plan
from planner.integrations.planned_run import PlannedRun
from planner.runtime.weights import LossReduction, LossRule

#: what to install for this integration
PIP = "'accelerate>=0.26'"

try:
    from accelerate.data_loader import prepare_data_loader
except Exception as exc:  # not installed, or installed and broken: one line either way
    raise missing_library(exc, "accelerate", integration=__name__, pip=PIP) from None

if TYPE_CHECKING:
    from torch.utils.data import DataLoader, Dataset

    from planner.runtime.rank_plan import RankPlan

__all__ = ["PIP", "PlannedLoader", "device_loader", "launch_of", "prepare_planned"]

_INTEGRATION = "planner.integrations.accelerate"
#: Accelerate set-ups whose gradients or memory are not DDP's (the plan's premise)
_REFUSED_SETUPS = ("DEEPSPEED", "FSDP", "MEGATRON_LM", "XLA")


def launch_of(accelerator: Any) -> RankLaunch:
    """This process's numbers as Accelerate sees them (the node from torchrun's ``GROUP_RANK`` where set)."""
    group_rank = os.environ.get("GROUP_RANK")
    return RankLaunch(
        rank=accelerator.process_index,
        world_size=accelerator.num_processes,
        local_rank=accelerator.local_process_index,
        node_rank=int(group_rank) if group_rank not in (None, "") else None,
    )


def check_setup(accelerator: Any, who: str) -> None:
    """Refuse an Accelerate set-up that is not data-parallel DDP, in one line naming it."""
    kind = getattr(accelerator.distributed_type, "name", str(accelerator.distributed_type))
    if kind in _REFUSED_SETUPS:
        raise ConfigError(
            f"{who}: batchplan plans DDP (a replicated model, gradients averaged over ranks), but this "
            f"run uses {kind}: train with plain DDP, or without batchplan's planned batches"
        )


def set_accumulation(accelerator: Any, steps: int) -> None:
    """``accelerator.gradient_accumulation_steps = steps`` (what ``accelerator.backward`` divides by and
    ``accelerator.accumulate`` counts), or one line where this Accelerate cannot change it after construction."""
    try:
        accelerator.gradient_accumulation_steps = steps
    except AttributeError:
        raise ConfigError(
            f"this Accelerate cannot change gradient_accumulation_steps after Accelerator() is built: "
            f"build it with Accelerator(gradient_accumulation_steps={steps}) (the plan's)"
        ) from None


def device_loader(accelerator: Any, loader: DataLoader) -> DataLoader:
    """``loader`` prepared by Accelerate as for a single process: placed on ``accelerator.device`` (batches
    moved there, as ``accelerator.prepare`` would), never re-sharded, and registered with the accelerator."""
    check_setup(accelerator, _INTEGRATION)
    placement = bool(getattr(accelerator, "device_placement", True))
    options: dict[str, Any] = {
        "num_processes": 1,
        "process_index": 0,
        "put_on_device": placement,
        "rng_types": list(getattr(accelerator, "rng_types", None) or []) or None,
    }
    accepted = inspect.signature(prepare_data_loader).parameters
    for name in ("non_blocking", "use_stateful_dataloader"):
        if name in accepted and hasattr(accelerator, name):
            options[name] = getattr(accelerator, name)
    prepared = prepare_data_loader(loader, accelerator.device, **options)
    registered = getattr(accelerator, "_dataloaders", None)  # what save_state / load_state walk
    if isinstance(registered, list):
        registered.append(prepared)
    # marked as Accelerate marks what it prepared: a later accelerator.prepare(loader) returns it as it is,
    # instead of slicing the planned batches again
    prepared._is_accelerate_prepared = True
    return prepared


class PlannedLoader:
    """What ``prepare_planned`` gives the loop: the planned, device-placed loader and the loss factor."""

    def __init__(self, run: PlannedRun, loader: DataLoader) -> None:
        self.run = run
        """the rank's planned run (sampler, rule, summary; ``attach_rebalancer`` for the re-balancer)"""
        self.loader = loader
        """this rank's planned batches, on the accelerator's device"""

    @property
    def loss_weight(self) -> float:
        """What the loop multiplies its loss by: ``b_i·W/B`` under the ``mean`` rule, else 1."""
        return self.run.loss_factor()

    @property
    def rank_plan(self) -> RankPlan:
        return self.run.rank_plan

    @property
    def sampler(self):
        return self.run.sampler

    def summary_line(self) -> str:
        return self.run.summary_line()


def prepare_planned(
    accelerator: Any,
    plan: PlanSource,
    dataset: Dataset,
    *,
    loss_reduction: LossReduction | str = LossReduction.MEAN,
    seed: int = 0,
    shuffle: bool = True,
    drop_last: bool = True,
    autobatch: Mapping[str, Any] | None = None,
    **loader_options: Any,
) -> PlannedLoader:
    """This rank's planned loader for ``dataset`` and the loss factor, for a loop driven by ``accelerator``.

    Args:
        accelerator: the run's ``accelerate.Accelerator`` (its process group is up: a ``JobSpec`` is planned
            here, a collective every rank must reach).
        plan: a ``plan.json`` path (or its document) or a ``JobSpec`` to plan in the job.
        dataset: the training set (map-style: the sampler indexes it).
        loss_reduction: how the loop reduces its loss over the rank's samples (module docstring).
        seed, shuffle, drop_last: the sampler's (``PlannedBatchSampler``); the seed must be the same on all ranks.
        autobatch: ``autobatch_ddp`` options with a ``JobSpec`` (``gpu=`` to simulate a GPU type on CPU).
        loader_options: further ``DataLoader`` options (``collate_fn``, ``num_workers``, ``pin_memory`` ...).

    Raises:
        ConfigError: the plan does not match the launch, the accelerator's ``gradient_accumulation_steps``
            contradicts the plan's, or a DeepSpeed/FSDP/Megatron/XLA set-up.
        MissingLibraryError: Accelerate is not installed.
    """
    from torch.utils.data import DataLoader

    check_setup(accelerator, _INTEGRATION)
    for refused in ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"):
        if refused in loader_options:
            raise ConfigError(
                f"prepare_planned: DataLoader option {refused}= is the plan's to decide (the planned "
                "sampler gives every rank its batch); drop it"
            )
    reduction = LossReduction.parse(loss_reduction)
    run = PlannedRun(resolve_plan(plan, launch_of(accelerator), autobatch=autobatch), framework="Accelerate")
    wanted = run.accumulation(accelerator.gradient_accumulation_steps, "gradient_accumulation_steps")
    if wanted != accelerator.gradient_accumulation_steps:
        set_accumulation(accelerator, wanted)
    run.set_rule(
        LossRule(
            reduction=reduction,
            declared=True,
            why=f"Accelerate passes the loop's loss through unchanged (loss_reduction={reduction.value!r})",
        )
    )
    sampler = run.make_sampler(len(dataset), seed=seed, shuffle=shuffle, drop_last=drop_last)
    loader = DataLoader(dataset, batch_sampler=sampler, **loader_options)
    return PlannedLoader(run, device_loader(accelerator, loader))
