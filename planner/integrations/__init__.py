"""Plans applied by the trainers people use: Hugging Face (``huggingface``: a ``Trainer`` subclass and
mixin; ``accelerate``: a planned, device-placed loader for a hand-written Accelerate loop), Lightning
(``lightning``: a callback), each taking a ``plan.json`` or a ``JobSpec`` planned in the job, and Ultralytics
(``ultralytics``: the planned trainers, ``batch=-1`` on several GPUs).

Each integration gives every rank its planned batches without its framework re-sharding them, takes the
gradient accumulation from the plan, decides the per-rank loss rule from what its framework does with the
loss (``planner.runtime.weights.LossRule``: the weight ``b_i·W/B`` or none, never both), states that rule in
the log and the run's summary, and can switch on the in-job re-balancer with one argument. The shared
pieces: ``plan_source`` (where the rank's plan comes from), ``planned_run`` (sampler, rule, re-balancer,
summary), ``optional`` (the libraries, imported only by their integration).

Names are loaded lazily: ``import planner.integrations`` imports no framework; ``BatchPlanTrainer`` imports
transformers, ``BatchPlanCallback`` Lightning, ``prepare_planned`` Accelerate, each when first used.
"""

from __future__ import annotations

from torchkit.lazy import lazy_exports

# public name -> submodule that defines it
_EXPORTS: dict[str, str] = {
    "MissingLibraryError": "planner.integrations.optional",
    "PlannedRun": "planner.integrations.planned_run",
    "Rebalance": "planner.integrations.planned_run",
    "RankLaunch": "planner.integrations.plan_source",
    "resolve_plan": "planner.integrations.plan_source",
    "prepare_planned": "planner.integrations.accelerate",
    "device_loader": "planner.integrations.accelerate",
    "BatchPlanTrainer": "planner.integrations.huggingface",
    "BatchPlanMixin": "planner.integrations.huggingface",
    "BatchPlanCallback": "planner.integrations.lightning",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
