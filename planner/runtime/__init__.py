"""In-job helpers for DDP with the planned per-rank batches: each rank's plan entry, its loss weight and a
batch sampler that gives it its slice of every global batch.

- ``rank_plan`` (``load_rank_plan``: this rank's part of plan.json), ``rank_gpu`` (is the rank on its
  planned GPU), ``weights`` (the loss weights), ``sampler`` (``PlannedBatchSampler``), ``autobatch_ddp`` (the
  heterogeneous AutoBatch inside the running job);
- the re-balancer: ``rebalance`` (``Rebalancer``, in the training loop), ``rebalance_model`` (its rules, pure),
  ``rebalance_report`` (what it did), ``rebalance_feedback`` (the measured plan and profiles it leaves),
  ``sync_feedback`` (the measured synchronisation it files), ``rebalance_faults`` (naming a rank that stopped),
  ``default_group_timeout`` (the process group's timeout while it runs), ``simulate`` (declared slow devices).

Names are loaded lazily (PEP 562): ``import planner.runtime`` imports no torch; ``loss_weight`` and
``load_rank_plan`` stay torch-free, and only ``PlannedBatchSampler`` (a ``torch.utils.data.Sampler``)
imports torch when first used; so does ``Rebalancer``, the in-job re-balancer (``planner.runtime.rebalance``).
"""

from __future__ import annotations

from torchkit.lazy import lazy_exports

# public name -> submodule that defines it (planner.runtime.autobatch_ddp adds its names here)
_EXPORTS: dict[str, str] = {
    "loss_weight": "planner.runtime.weights",
    "loss_weights": "planner.runtime.weights",
    "sum_loss_scale": "planner.runtime.weights",
    "LossReduction": "planner.runtime.weights",
    "LossRule": "planner.runtime.weights",
    "PlannedBatchSampler": "planner.runtime.sampler",
    "agree_on_split": "planner.runtime.plan_agreement",
    "SplitTerms": "planner.runtime.plan_agreement",
    "PlanMismatchError": "planner.runtime.plan_agreement",
    "RankPlan": "planner.runtime.rank_plan",
    "load_rank_plan": "planner.runtime.rank_plan",
    "autobatch_ddp": "planner.runtime.autobatch_ddp",
    "DdpAutobatch": "planner.runtime.autobatch_ddp",
    "Rebalancer": "planner.runtime.rebalance",
    "RebalanceReport": "planner.runtime.rebalance",
    "samples_once": "planner.runtime.rebalance",
    "RebalancePolicy": "planner.runtime.rebalance_model",
    "SimulatedSpeed": "planner.runtime.simulate",
    "is_collective_failure": "planner.runtime.default_group_timeout",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
