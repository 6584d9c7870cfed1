"""The job corrects its plan: per-rank compute times measured in the first steps, batches re-balanced,
the gradient kept exact.

Three lines in a training loop that already uses ``PlannedBatchSampler`` and DDP::

    rebalancer = Rebalancer.from_plan("plan.json", sampler, ddp)       # (1) after wrapping the model in DDP
    for x, y in loader:
        with rebalancer.compute():                                     # (2) around forward + backward
            loss = criterion(ddp(x), y) * rebalancer.loss_weight       #     (the weight of this step's split)
            loss.backward()
        optimizer.step()
        rebalancer.step_done()                                         # (3) once per optimizer step

With gradient accumulation, put every micro-step in its own ``compute()`` block and call ``step_done()``
after the optimizer step.

What is measured, and why so. Each rank times **its own compute**: from the start of the model's forward
inside ``compute()`` to the moment its last gradient bucket is ready, which DDP signals by calling the
communication hook the re-balancer registers (it then all-reduces exactly as DDP's default hook does).
The wait for the slower ranks happens after that point, inside DDP's ``finalize_backward``, and is not
counted; a fast rank therefore reports its real compute, not the slowest rank's. In ``no_sync`` micro-steps
no hook fires and there is no communication, so the end of the ``compute()`` block is the end. The start is
taken at the inner module's forward (a forward pre-hook), after DDP's own pre-forward collectives (buffer
broadcast, bucket rebuild). On CUDA both marks are CUDA events on the current stream, so the time is the
GPU's, not the CPU's launch time; peak reserved memory is read per step as well. On CPU they are
``time.perf_counter`` readings.

When it measures and switches (``RebalancePolicy``): every step of the first ``probe_steps`` and, after
that, one step in ``check_every_steps`` while the imbalance stays above the threshold. A measured step is
all-gathered (one ``all_gather_object`` of a few numbers); from the gathered steps every rank refits every
rank's ``t_i(b)`` and re-solves the allocation (``planner.runtime.rebalance_model``), so all ranks reach the
same decision. The decisions are then all-gathered as well and compared: a rank that decided otherwise is
a ``RebalanceError`` on every rank, never a silent skew. A switch takes effect on every rank at the same
optimizer-step boundary: the first one no rank's sampler has yielded yet (``PlannedBatchSampler``), so a
prefetching DataLoader is safe.

Correctness across a switch: the step batch B stays the same and only the split moves, so every sample of
an epoch is still taken exactly once and every rank runs the same number of steps; ``loss_weight`` is
``b_i·W/B`` of the split of the micro-step being computed, so DDP's average stays the gradient of the global
batch. Caps: the plan's ``max_batch`` of every rank, and on GPUs the measured peak extrapolated with the
plan's memory slope, never above the rank's memory budget.

Failures: a rank that dies or hangs makes the others' all-gather fail (gloo: connection closed, or the
process group's timeout); that is raised as ``RebalanceError`` naming the step.

Known limitations: the step time of one rank is assumed to depend on its own batch only (samples of equal
cost); the comm hook slot of the DDP model is taken (a custom hook cannot be combined yet); the sampler's
``accumulate`` and the step batch never change.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from planner.errors import ConfigError, RebalanceError
from planner.runtime.rebalance_model import (
    Decision,
    RankLimits,
    RebalancePolicy,
    StepMeasure,
    decide,
    max_idle,
    median_points,
)
from planner.runtime.rebalance_report import RebalanceReport, Switch, build_report, samples_once
from planner.runtime.sampler import PlannedBatchSampler
from planner.runtime.simulate import SimulatedSpeed
from planner.runtime.weights import loss_weight as split_loss_weight
from torchkit.step.fit import AffineTimeFit

if TYPE_CHECKING:
    from planner.plan.types import Plan

__all__ = ["RebalanceReport", "Rebalancer", "Switch", "limits_from_plan", "samples_once"]  # report names re-exported

log = logging.getLogger(__name__)

DecideFn = Callable[..., Decision | None]


def limits_from_plan(plan: Plan) -> tuple[tuple[RankLimits, ...], int, int]:
    """Every rank's limits (cap, prior time curve, memory budget and slope) and the job's multiple-of and
    minimum batch, from a typed (so validated) plan."""
    limits = []
    for entry in plan.ranks:
        profile = plan.profiles[entry.profile]
        memory_fit = profile.memory_fit
        limits.append(RankLimits(
            cap=entry.max_batch,
            prior=AffineTimeFit(intercept_s=profile.time_fit.intercept_s, s_per_sample=profile.time_fit.s_per_sample),
            memory_budget_bytes=entry.memory_budget_bytes,
            bytes_per_sample=float(memory_fit.bytes_per_sample) if memory_fit.kind == "affine" else None,
        ))
    return tuple(limits), plan.job.multiple_of, plan.job.min_batch


class _Clock:
    """Marks and elapsed seconds: CUDA events on ``device``'s current stream, else ``perf_counter``."""

    def __init__(self, device: torch.device | None) -> None:
        self.cuda = device is not None and device.type == "cuda"
        self.device = device

    def mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return event
        return time.perf_counter()

    def elapsed_s(self, start: Any, end: Any) -> float:
        if self.cuda:
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        return end - start


class Rebalancer:
    """Measures this rank's compute per optimizer step and re-balances the sampler's split (module docstring).

    Args:
        sampler: the rank's ``PlannedBatchSampler`` (the DataLoader's ``batch_sampler``).
        ddp: the ``DistributedDataParallel`` model (its comm hook slot is used); None only for one rank.
        limits: every rank's cap and prior time curve (``limits_from_plan``).
        multiple_of, min_batch: the job's constraints.
        policy: when to measure and switch.
        simulate: a declared speed simulation (``planner.runtime.simulate``), or None.
        device: where the model computes (CUDA: timed with events, peaks read); default CPU timing.
        decide_fn: the decision function (``planner.runtime.rebalance_model.decide``); replaceable for tests
            of disagreement.
    """

    def __init__(
        self,
        sampler: PlannedBatchSampler,
        ddp: torch.nn.Module | None,
        limits: Sequence[RankLimits],
        *,
        multiple_of: int = 1,
        min_batch: int = 1,
        policy: RebalancePolicy | None = None,
        simulate: SimulatedSpeed | None = None,
        device: torch.device | None = None,
        decide_fn: DecideFn = decide,
    ) -> None:
        if not isinstance(sampler, PlannedBatchSampler):
            raise ConfigError(f"Rebalancer needs the rank's PlannedBatchSampler, got {type(sampler).__name__}")
        if len(limits) != sampler.world_size:
            raise ConfigError(f"{len(limits)} rank limits for a sampler of {sampler.world_size} ranks")
        distributed = dist.is_available() and dist.is_initialized()
        if distributed and dist.get_world_size() != sampler.world_size:
            raise ConfigError(f"the process group has {dist.get_world_size()} ranks, the sampler {sampler.world_size}")
        if distributed and dist.get_rank() != sampler.rank:
            raise ConfigError(f"this is rank {dist.get_rank()} but the sampler is rank {sampler.rank}'s")
        if sampler.world_size > 1 and not isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
            raise ConfigError("Rebalancer needs the DistributedDataParallel model: its comm hook marks the end of "
                              "this rank's own compute (without it the all-reduce wait would be timed)")
        self.sampler = sampler
        self.limits = tuple(limits)
        self.multiple_of = multiple_of
        self.min_batch = min_batch
        self.policy = policy or RebalancePolicy()
        self.simulate = simulate
        self.device = device
        self._decide = decide_fn
        self._clock = _Clock(device)
        self.rank = sampler.rank
        self.world_size = sampler.world_size

        self.measures: list[StepMeasure] = []
        """every gathered step (identical on all ranks)"""
        self.switches: list[Switch] = []
        self.splits: list[tuple[int, ...]] = []
        """the split each optimizer step used, in step order (this rank's view; verified when gathered)"""
        self._step = 0
        self._checking = True
        self._pending: tuple[int, int] | None = None  # position of a switch not yet seen in a step
        self._split: tuple[int, ...] | None = None
        self._in_compute = False
        self._start: Any = None
        self._forward_start: Any = None
        self._hook_end: Any = None
        self._slept = False
        self._real_start_s = 0.0
        self._intervals: list[tuple[Any, Any]] = []
        self._step_splits: list[tuple[int, ...]] = []
        self._peak_bytes: int | None = None
        self.plan: Plan | None = None
        """the typed plan (set by ``from_plan``); what ``write_feedback`` updates"""
        if ddp is not None and isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
            ddp.register_comm_hook(None, self._comm_hook)
            ddp.module.register_forward_pre_hook(self._forward_pre_hook)
        elif ddp is not None:
            ddp.register_forward_pre_hook(self._forward_pre_hook)

    @classmethod
    def from_plan(
        cls,
        plan: str | Path | Mapping[str, Any] | Plan,
        sampler: PlannedBatchSampler,
        ddp: torch.nn.Module | None,
        **options: Any,
    ) -> Rebalancer:
        """The re-balancer for a plan: a path of plan.json, the document as a mapping (``autobatch_ddp``'s), or
        a typed ``Plan``; every form is validated into the typed plan.

        Options are those of the constructor (``policy``, ``simulate``, ``device``, ...).
        """
        from planner.plan.io import load_plan, validate_plan
        from planner.plan.types import Plan

        if isinstance(plan, Plan):
            typed = plan
        elif isinstance(plan, Mapping):
            typed = validate_plan(dict(plan))
        else:
            typed = load_plan(plan)
        batches = [r.batch for r in typed.ranks]
        if batches != list(sampler.batches):
            raise ConfigError(f"the sampler's batches {list(sampler.batches)} are not the plan's {batches} (build the "
                              "sampler from this plan)")
        limits, multiple_of, min_batch = limits_from_plan(typed)
        rebalancer = cls(sampler, ddp, limits, multiple_of=multiple_of, min_batch=min_batch, **options)
        rebalancer.plan = typed
        return rebalancer

    # --------------------------------------------------------------------------------- in the step

    @property
    def loss_weight(self) -> float:
        """``b_i·W/B`` for the split of the micro-step being computed (inside ``compute()``)."""
        split = self._split if self._split is not None else self.sampler.batches
        return split_loss_weight(split[self.rank], self.world_size, sum(split))

    @property
    def batch(self) -> int:
        """This rank's batch in the micro-step being computed."""
        split = self._split if self._split is not None else self.sampler.batches
        return split[self.rank]

    @contextlib.contextmanager
    def compute(self) -> Iterator[Rebalancer]:
        """Around one micro-step's forward and backward: takes its split from the sampler and times it."""
        if self._in_compute:
            raise ConfigError("Rebalancer.compute() blocks cannot be nested")
        self._split = self.sampler.take_split()
        self._step_splits.append(self._split)
        if self._clock.cuda and not self._intervals:
            torch.cuda.reset_peak_memory_stats(self.device)
        self._in_compute, self._slept = True, False
        self._forward_start = self._hook_end = None
        self._start = self._clock.mark()
        self._real_start_s = time.perf_counter()
        try:
            yield self
        finally:
            if self._hook_end is None:  # no all-reduce in this micro-step (no_sync, one rank): the block is compute
                self._maybe_sleep()
                self._hook_end = self._clock.mark()
            start = self._forward_start if self._forward_start is not None else self._start
            self._intervals.append((start, self._hook_end))
            self._in_compute = False

    def _forward_pre_hook(self, module: torch.nn.Module, args: Any) -> None:
        if self._in_compute and self._forward_start is None:
            self._forward_start = self._clock.mark()
            self._real_start_s = time.perf_counter()

    def _maybe_sleep(self) -> None:
        if self.simulate is not None and not self._slept and self._split is not None:
            self._slept = True
            extra = self.simulate.extra_s(self.rank, self._split[self.rank], time.perf_counter() - self._real_start_s)
            if extra > 0:
                time.sleep(extra)

    def _comm_hook(self, state, bucket):  # no annotations: DDP checks them, and this module's are strings
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        if self._in_compute:
            self._maybe_sleep()  # a simulated slow device is still computing here
            self._hook_end = self._clock.mark()  # the last bucket's mark wins: own backward is done
        return allreduce_hook(None, bucket)  # type: ignore[arg-type]  # None: the default group, as DDP

    # --------------------------------------------------------------------------------- step boundary

    def step_done(self) -> None:
        """After the optimizer step: record the step; on a measuring step gather, decide and maybe switch.

        Raises:
            RebalanceError: a rank died, hung or disagreed (on every rank that is still alive).
            ConfigError: no ``compute()`` block in this step, or blocks of different splits.
        """
        if self._in_compute:
            raise ConfigError("step_done() inside a compute() block: call it after the optimizer step")
        if not self._intervals:
            raise ConfigError("step_done() without a compute() block in this step: wrap forward+backward in "
                              "rebalancer.compute()")
        if len(set(self._step_splits)) != 1:
            raise ConfigError(f"the micro-steps of one optimizer step used different splits {self._step_splits}: "
                              "a switch fell inside an optimizer step (is accumulate the sampler's?)")
        self._step += 1
        split = self._step_splits[0]
        self.splits.append(split)
        compute_s = sum(self._clock.elapsed_s(a, b) for a, b in self._intervals)
        if self._clock.cuda:
            self._peak_bytes = int(torch.cuda.max_memory_reserved(self.device))
        self._intervals, self._step_splits, self._split = [], [], None
        if self._pending is not None and split == self.switches[-1].batches:
            self._pending = None  # the switch is in effect
        if not self._measuring_step(split):
            return
        gathered = self._gather({"step": self._step, "split": split, "compute_s": compute_s,
                                 "peak": self._peak_bytes, "boundary": self.sampler.next_boundary()}, "step times")
        self._check_same_step(gathered)
        peaks = [g["peak"] for g in gathered]
        self.measures.append(StepMeasure(
            step=self._step, batches=split, compute_s=tuple(float(g["compute_s"]) for g in gathered),
            peak_bytes=None if any(p is None for p in peaks) else tuple(int(p) for p in peaks)))
        self._update_checking(split)
        usable = self._usable()
        if (self._pending is not None or self._at_split(split) < self.policy.min_points
                or len(self.switches) >= self.policy.max_switches):
            return  # the same on every rank: nothing to decide (yet)
        decision = self._decide(usable, self.limits, current=split, multiple_of=self.multiple_of,
                                min_batch=self.min_batch, policy=self.policy)
        self._agree(decision)
        if decision is not None:
            position = max(tuple(g["boundary"]) for g in gathered)
            self.sampler.switch_batches(decision.batches, position)
            self._pending = position
            self._checking = True
            self.switches.append(Switch(decided_at_step=self._step, position=position, batches=decision.batches,
                                        predicted_step_s=decision.predicted_step_s,
                                        previous_step_s=decision.current_step_s))
            log.info("rebalance: step %d: %s -> %s (predicted step %.4f s -> %.4f s) from position %s",
                     self._step, list(split), list(decision.batches), decision.current_step_s,
                     decision.predicted_step_s, position)

    def _usable(self) -> list[StepMeasure]:
        return [m for m in self.measures if m.step > self.policy.warmup_steps]

    def _at_split(self, split: tuple[int, ...]) -> int:
        return sum(1 for m in self._usable() if m.batches == split)

    def _measuring_step(self, split: tuple[int, ...]) -> bool:
        """The same answer on every rank: it depends only on gathered data and the step count."""
        policy = self.policy
        if self._step <= policy.probe_steps:
            return True
        if self._pending is not None or (self.switches and self._at_split(split) < policy.min_points):
            return True  # a switch to see through and verify
        return self._checking and self._step % policy.check_every_steps == 0

    def _update_checking(self, split: tuple[int, ...]) -> None:
        at_split = [m for m in self._usable() if m.batches == split]
        if at_split:
            medians = [median_points(at_split, r)[0][1] for r in range(self.world_size)]
            self._checking = max_idle(medians) > self.policy.imbalance_threshold

    def _gather(self, payload: dict, what: str) -> list[dict]:
        if self.world_size == 1:
            return [payload]
        gathered: list[Any] = [None] * self.world_size
        try:
            dist.all_gather_object(gathered, payload)
        except Exception as exc:  # gloo: connection closed by a dead peer, or the process group's timeout
            raise RebalanceError(
                f"rebalance: the all-gather of {what} after optimizer step {self._step} failed on rank {self.rank} "
                f"({type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}): a rank "
                "died or hung (it did not answer within the process group's timeout); stopping rather than "
                "training with ranks out of step"
            ) from exc
        return gathered

    def _check_same_step(self, gathered: list[dict]) -> None:
        steps = {g["step"] for g in gathered}
        splits = {tuple(g["split"]) for g in gathered}
        if len(steps) != 1 or len(splits) != 1:
            detail = "; ".join(f"rank {r}: step {g['step']} split {list(g['split'])}" for r, g in enumerate(gathered))
            raise RebalanceError(f"rebalance: ranks are out of step ({detail}): every rank must call compute() once "
                                 "per micro-step and step_done() once per optimizer step")

    def _agree(self, decision: Decision | None) -> None:
        """Every rank's decision must be the same; otherwise every rank raises (nobody waits forever)."""
        mine = None if decision is None else list(decision.batches)
        everyone = self._gather({"decision": mine}, "re-balancing decisions")
        if any(g["decision"] != mine for g in everyone):
            detail = "; ".join(f"rank {r}: {g['decision'] or 'keep'}" for r, g in enumerate(everyone))
            raise RebalanceError(f"rebalance: ranks reached different decisions after optimizer step {self._step} "
                                 f"({detail}); they must all run the same code on the same gathered times")

    # --------------------------------------------------------------------------------- results

    def report(self) -> RebalanceReport:
        """What happened so far (the same on every rank)."""
        if not self.splits:
            raise ConfigError("Rebalancer.report() before any step")
        return build_report(self.splits, self.measures, self.switches, warmup_steps=self.policy.warmup_steps)

    def feedback(self) -> tuple[dict, dict]:
        """The updated plan's JSON document (final batches, weights, ``measured`` section) and the measured
        profiles by cache key (``planner.runtime.rebalance_feedback``). Needs ``from_plan``."""
        from planner.runtime.rebalance_feedback import measured_profiles, measured_section, updated_plan

        if self.plan is None:
            raise ConfigError("Rebalancer.feedback() needs the plan: build the re-balancer with from_plan()")
        usable = self._usable() or self.measures
        simulated = self.simulate.describe() if self.simulate is not None else None
        section = measured_section(self.plan, usable, self.report(), self.limits,
                                   prior_weight=self.policy.prior_weight, simulated=simulated)
        profiles = measured_profiles(self.plan, usable, prior_weight=self.policy.prior_weight,
                                     note=f"declared simulation: {simulated}" if simulated else "")
        return updated_plan(self.plan, section).to_json(), profiles

    def write_feedback(self, plan_path: str | Path | None, cache_dir: str | Path | None = None) -> list[Path]:
        """On rank 0: write the updated plan to ``plan_path`` (atomically; None: not written) and the measured
        profiles to the profile cache (``cache_dir``, default the planner's). Other ranks write nothing.

        Returns:
            the files written.
        """
        if self.rank != 0:
            return []
        from planner.plan.io import write_plan
        from planner.profiles.cache import ProfileCache
        from planner.profiles.measured import measured_key_inputs
        from planner.runtime.rebalance_feedback import measured_fingerprint

        plan, profiles = self.feedback()
        job = self.plan.job.to_json()
        fingerprint = measured_fingerprint(job)
        written = []
        if plan_path is not None:
            written.append(write_plan(plan, plan_path))
        cache = ProfileCache(cache_dir)
        written.extend(
            cache.put(key, profile, inputs=measured_key_inputs(job, profile.gpu, profile.amp, fingerprint=fingerprint))
            for key, profile in profiles.items()
        )
        return written
