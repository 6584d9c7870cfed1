"""One rank's plan applied to a framework's training loop, whatever the framework: the rank's planned batch
sampler, the per-rank loss rule and the factor it gives, the optional in-job re-balancer, and the run's
summary. The Hugging Face, Accelerate and Lightning integrations each decide the rule from what their
framework does with the loss and hook these pieces into their own loop; the rules themselves live in
``planner.runtime`` (``weights.LossRule``, ``sampler.PlannedBatchSampler``, ``rebalance.Rebalancer``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.errors import ConfigError
from planner.integrations.plan_source import ResolvedPlan
from planner.runtime.weights import LossRule

if TYPE_CHECKING:
    import torch

    from planner.runtime.rank_plan import RankPlan
    from planner.runtime.rebalance import Rebalancer
    from planner.runtime.rebalance_model import RebalancePolicy
    from planner.runtime.sampler import PlannedBatchSampler
    from planner.runtime.simulate import SimulatedSpeed

__all__ = ["PlannedRun", "Rebalance", "rebalance_options"]

log = logging.getLogger("planner.integrations")

#: the re-balancer's collective timeout unless asked otherwise (``planner.runtime.rebalance``'s default)
_COLLECTIVE_TIMEOUT_S = 30.0


@dataclass(frozen=True, kw_only=True)
class Rebalance:
    """Options of the in-job re-balancer (README "Letting the job correct its plan"); ``rebalance=True`` is
    ``Rebalance()``."""

    policy: RebalancePolicy | None = None
    """when to measure and switch (default ``RebalancePolicy()``)"""
    simulate: SimulatedSpeed | None = None
    """a declared simulation of slower devices (``planner.runtime.SimulatedSpeed``), or None for real timing"""
    collective_timeout_s: float = _COLLECTIVE_TIMEOUT_S
    """the most any of the re-balancer's collectives waits for a rank before the job stops, naming it"""


def rebalance_options(rebalance: bool | Rebalance | None) -> Rebalance | None:
    """``rebalance=`` of an integration as options, or None for off."""
    if rebalance is None or rebalance is False:
        return None
    if rebalance is True:
        return Rebalance()
    if isinstance(rebalance, Rebalance):
        return rebalance
    raise ConfigError(
        f"rebalance must be True, False or planner.integrations.Rebalance(...), got {rebalance!r}"
    )


class PlannedRun:
    """This rank's share of a planned job inside one framework's training (module docstring)."""

    def __init__(self, resolved: ResolvedPlan, *, framework: str) -> None:
        self.resolved = resolved
        self.framework = framework
        """who applies the plan, for the log and the summary (``"Hugging Face Trainer"``)"""
        self.sampler: PlannedBatchSampler | None = None
        self.rule: LossRule | None = None
        self.rebalancer: Rebalancer | None = None
        self._optimizer_steps = 0
        plan = self.rank_plan
        log.info(
            "batchplan: %s rank %d/%d takes batch %d of %s (accumulate %d, global batch %d), plan from %s",
            framework,
            plan.rank,
            plan.world_size,
            plan.batch,
            list(plan.batches),
            plan.accumulate,
            plan.global_batch,
            resolved.origin,
        )

    @property
    def rank_plan(self) -> RankPlan:
        return self.resolved.rank_plan

    def accumulation(self, configured: int, setting: str) -> int:
        """The accumulation to train with: the plan's. A framework setting left at 1 takes it; another value
        than the plan's is refused in one line naming ``setting``."""
        plan = self.rank_plan
        if configured == plan.accumulate:
            return configured
        if configured == 1:
            log.info("batchplan: %s=%d from the plan", setting, plan.accumulate)
            return plan.accumulate
        raise ConfigError(
            f"{setting}={configured} contradicts the plan's accumulate {plan.accumulate} (global batch "
            f"{plan.global_batch} = {plan.step_batch} per micro-step × {plan.accumulate}): leave "
            f"{setting} at 1 or set it to {plan.accumulate}"
        )

    # ------------------------------------------------------------------------------------------- data

    def make_sampler(
        self, dataset_size: int, *, seed: int = 0, shuffle: bool = True, drop_last: bool = True
    ) -> PlannedBatchSampler:
        """This rank's batch sampler over a dataset of ``dataset_size`` samples (one per run: the re-balancer
        switches it)."""
        from planner.runtime.sampler import PlannedBatchSampler

        if self.sampler is not None and self.sampler.dataset_size != dataset_size:
            raise ConfigError(
                f"the planned sampler is for {self.sampler.dataset_size} samples, the dataset now has "
                f"{dataset_size}: one planned run trains one dataset"
            )
        if self.sampler is None:
            self.sampler = PlannedBatchSampler.from_plan(
                self.rank_plan, dataset_size, seed=seed, shuffle=shuffle, drop_last=drop_last
            )
        return self.sampler

    def _require_sampler(self) -> PlannedBatchSampler:
        if self.sampler is None:
            raise ConfigError(
                f"{self.framework}: no planned loader was made yet (the train loader must be batchplan's)"
            )
        return self.sampler

    # ------------------------------------------------------------------------------------------- loss

    def set_rule(self, rule: LossRule) -> None:
        """The loss rule this run applies; logged once per rank."""
        self.rule = rule
        log.info(
            "batchplan: rank %d: %s (factor %.6g with the plan's split)",
            self.rank_plan.rank,
            rule.line(),
            self._factor(self.rank_plan.batch),
        )

    def loss_factor(self) -> float:
        """What this rank multiplies its loss by now: ``b_i·W/B`` of the split of the micro-step being computed
        (the re-balancer's, after a switch) under the ``mean`` rule, else 1."""
        if self.rule is None:
            raise ConfigError(
                f"{self.framework}: the loss rule is not decided yet (the planned loader decides it)"
            )
        rank_batch = self.rebalancer.batch if self.rebalancer is not None else self.rank_plan.batch
        return self._factor(rank_batch)

    def _factor(self, rank_batch: int) -> float:
        assert self.rule is not None
        return self.rule.factor(rank_batch, self.rank_plan.world_size, self.rank_plan.step_batch)

    # ----------------------------------------------------------------------------------- re-balancing

    def attach_rebalancer(
        self, ddp_model: torch.nn.Module | None, options: Rebalance, device: torch.device | None = None
    ) -> Rebalancer:
        """Start the in-job re-balancer on the DDP-wrapped model (before its first backward; a collective:
        every rank calls it at the same point)."""
        from planner.runtime.rebalance import Rebalancer

        if self.rebalancer is not None:
            return self.rebalancer
        self.rebalancer = Rebalancer.from_plan(
            self.resolved.plan,
            self._require_sampler(),
            ddp_model,
            policy=options.policy,
            simulate=options.simulate,
            device=device if device is not None and device.type == "cuda" else None,
            collective_timeout_s=options.collective_timeout_s,
        )
        what = options.simulate.describe() if options.simulate is not None else "measured compute"
        log.info("batchplan: rank %d: in-job re-balancing on (%s)", self.rank_plan.rank, what)
        return self.rebalancer

    @contextlib.contextmanager
    def compute(self) -> Iterator[None]:
        """Around one micro-step's forward and backward: the re-balancer's timing (nothing without it)."""
        if self.rebalancer is None:
            yield
            return
        with self.rebalancer.compute():
            yield

    def step_done(self) -> None:
        """After each optimizer step: the re-balancer may switch the split (at the same boundary on every rank)."""
        self._optimizer_steps += 1
        if self.rebalancer is not None:
            self.rebalancer.step_done()

    # ------------------------------------------------------------------------------------------ summary

    def summary(self) -> dict[str, Any]:
        """What the run applied, for the framework's own run summary (metrics, hyperparameters)."""
        plan = self.rank_plan
        summary: dict[str, Any] = {
            "batchplan_batches": list(plan.batches),
            "batchplan_rank_batch": plan.batch,
            "batchplan_accumulate": plan.accumulate,
            "batchplan_global_batch": plan.global_batch,
            "batchplan_loss_rule": self.rule.reduction.value if self.rule is not None else None,
            "batchplan_loss_factor": self._factor(plan.batch) if self.rule is not None else None,
            "batchplan_plan": self.resolved.origin,
        }
        if self.rebalancer is not None and self.rebalancer.splits:
            report = self.rebalancer.report()
            summary["batchplan_batches_last"] = list(report.batches_last)
            summary["batchplan_rebalance_switches"] = len(report.switches)
        return summary

    def summary_line(self) -> str:
        """One line: the split, the loss rule and what re-balancing did."""
        plan = self.rank_plan
        rule = self.rule.short() if self.rule is not None else "loss rule not decided (no training step ran)"
        line = (
            f"batchplan: {self.framework}, rank {plan.rank}/{plan.world_size}: batches {list(plan.batches)} "
            f"accumulate {plan.accumulate} global batch {plan.global_batch}; {rule}"
        )
        if self.rebalancer is not None and self.rebalancer.splits:
            report = self.rebalancer.report()
            line += (
                f"; re-balanced: switches={len(report.switches)} batches_last={list(report.batches_last)} "
                f"rollbacks={report.rollbacks}"
            )
        return line
