"""The job corrects its plan, and keeps correcting it: per-rank compute times measured all run long,
batches re-balanced in bounded steps, every switch verified, the gradient kept exact.

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
communication hook the re-balancer registers (it then all-reduces exactly as DDP's default hook does). The
**synchronisation wait** (``sync_wait_s``: from that moment to the end of the backward, where DDP waits for
the all-reduce, i.e. for the slower ranks and for communication not hidden behind compute) is recorded
apart. In ``no_sync`` micro-steps no hook fires, so the end of the ``compute()`` block is the end. On CUDA
the marks are CUDA events on the current stream (read when gathered, so no step waits for the GPU); peak
reserved memory is read per step as well. On CPU they are ``time.perf_counter`` readings.

When it gathers and decides. Every step is timed locally (a few clock reads). The times are all-gathered
(one all-gather of a small float64 tensor per gather, in the re-balancer's own process group): every step
of the first ``probe_steps``;
every step after a switch until it is judged; and after that, watching, the steps of a window of
``check_every_steps`` at once, the window widened so that the gathers stay under ``watch_cost_share`` of the
step time (measured; the summary states it). A watching gather is started without waiting (``async_op``)
and read at the next ``step_done``, so it runs behind that step's compute; when its rules call for a switch,
that step is gathered at once, since a switch needs every rank's sampler boundary as of now. From the gathered steps every rank runs the same pure rules
(``planner.runtime.rebalance_model``: noise-aware thresholds, neutral shape from one batch, bounded moves,
no lock-in) so all ranks reach the same decision; a checksum of the decisions is all-gathered and compared, and a rank
that decided otherwise is a ``RebalanceError`` on every rank, never a silent skew. A switch takes effect on
every rank at the same optimizer-step boundary: the first one no rank's sampler has yielded yet.

Verify and roll back. After each switch the new split is measured for ``min_points`` steps; if it is not
faster than the split before, the re-balancer switches back (a ``rollback`` in ``switches``, logged) and
does not try that split again until the speeds change. Watching compares each window with the earlier
steps at the same split; a rank whose time moved by more than the noise means the speeds changed (a
throttled GPU, a co-tenant): the older steps are set aside and the split is solved again.

Correctness across a switch: the step batch B stays the same and only the split moves, so every sample of
an epoch is still taken exactly once and every rank runs the same number of steps; ``loss_weight`` is
``b_i·W/B`` of the split of the micro-step being computed, so DDP's average stays the gradient of the global
batch. Caps: the plan's ``max_batch`` of every rank, and on GPUs the measured peak extrapolated with the
plan's memory slope, never above the rank's memory budget.

Failures. The re-balancer's collectives (its gathers and the gradient all-reduce of its comm hook) run in a
process group of their own whose timeout is ``collective_timeout_s`` (default 30 s), far below the process
group default (30 min). A rank that dies or hangs makes the others' next collective fail within that time;
each survivor then names the rank(s) that did not answer (``planner.runtime.rebalance_faults``) in a
one-line ``RebalanceError``. Raise the timeout if one rank does long work between steps (a checkpoint).
DDP's own collectives in a ``compute()`` block run on the default group (its buffer broadcast before each
forward, the bucket order once): while the block runs, that group's timeout is lowered to the same
``collective_timeout_s`` (``planner.runtime.default_group_timeout``), so a rank 0 that hangs before its
forward ends the others there within the same bound, with the same one line.

Known limitations: the step time of one rank is assumed to depend on its own batch only (samples of equal
cost); the comm hook slot of the DDP model is taken (a custom hook cannot be combined yet); DDP's constructor
and the training loop's collectives outside ``compute()`` keep the default group's timeout; the sampler's
``accumulate`` and the step batch never change; the steps of the last, unfinished window are not gathered.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import statistics
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from planner.errors import ConfigError, RebalanceError, WorkloadError
from planner.plan.types import Plan
from planner.runtime.default_group_timeout import is_collective_failure, lowered_default_timeout
from planner.runtime.rank_watchdog import start_rank_watchdog, stop_ranks
from planner.runtime.rebalance_faults import default_store, lowered_store_timeout, missing_ranks
from planner.runtime.rebalance_model import (
    Decision,
    RankLimits,
    RebalancePolicy,
    StepMeasure,
    balanced,
    decide,
    speeds_changed,
    switch_verdict,
)
from planner.runtime.rebalance_report import RebalanceReport, Switch, build_report, samples_once
from planner.runtime.sampler import PlannedBatchSampler
from planner.runtime.simulate import SimulatedSpeed
from planner.runtime.weights import loss_weight as split_loss_weight
from torchkit.step.clock import DeviceClock
from torchkit.step.fit import AffineTimeFit

__all__ = [
    "RebalanceReport",
    "Rebalancer",
    "Switch",
    "limits_from_plan",
    "samples_once",
]  # report names re-exported

log = logging.getLogger(__name__)

DecideFn = Callable[..., Decision | None]

#: default timeout of the re-balancer's collectives: a dead or hung rank ends the job within this (plus
#: a few seconds to name it), not after the process group's 30 minutes
COLLECTIVE_TIMEOUT_S = 30.0
#: gathered steps kept in memory (a long job's early steps are dropped; the plan's split's are kept apart)
_MAX_MEASURES = 2000
#: the latest gathered steps the rules look at
_MAX_RULE_STEPS = 400
#: the widest watching window, in steps
_MAX_WINDOW = 1000
_instances = itertools.count()
#: values before the steps in a gathered row: steps, checksum of (step, split)s, boundary (2), cost of the
#: last gathering step_done, whether it was watching, median step wall time
_HEADER = 7


def limits_from_plan(plan: Plan) -> tuple[tuple[RankLimits, ...], int, int]:
    """Every rank's limits (cap, prior time curve, memory budget and slope) and the job's multiple-of and
    minimum batch, from a typed (so validated) plan."""
    limits = []
    for entry in plan.ranks:
        profile = plan.profiles[entry.profile]
        memory_fit = profile.memory_fit
        limits.append(
            RankLimits(
                cap=entry.max_batch,
                prior=AffineTimeFit(
                    intercept_s=profile.time_fit.intercept_s, s_per_sample=profile.time_fit.s_per_sample
                ),
                memory_budget_bytes=entry.memory_budget_bytes,
                bytes_per_sample=float(memory_fit.bytes_per_sample) if memory_fit.kind == "affine" else None,
            )
        )
    return tuple(limits), plan.job.multiple_of, plan.job.min_batch


@dataclasses.dataclass
class _PostedGather:
    """A watching window's all-gather in flight: the work to wait for, its output, the steps it carries and
    the seconds this rank spent starting it."""

    work: Any
    everyone: list[torch.Tensor]
    records: list[tuple]
    cost_s: float


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
        collective_timeout_s: the most any collective of the re-balancer waits for a rank (module docstring).
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
        collective_timeout_s: float = COLLECTIVE_TIMEOUT_S,
        decide_fn: DecideFn = decide,
    ) -> None:
        self._check_arguments(sampler, ddp, limits, collective_timeout_s)
        self.sampler = sampler
        self.limits = tuple(limits)
        self.multiple_of = multiple_of
        self.min_batch = min_batch
        self.policy = policy or RebalancePolicy()
        self.simulate = simulate
        self.device = device
        self.collective_timeout_s = float(collective_timeout_s)
        self._decide = decide_fn
        self._clock = DeviceClock(device)
        self.rank = sampler.rank
        self.world_size = sampler.world_size
        self.plan: Plan | None = None
        """the typed plan (set by ``from_plan``); what ``write_feedback`` updates"""

        self.measures: list[StepMeasure] = []
        """the gathered steps (identical on all ranks; the latest ``_MAX_MEASURES``)"""
        self.switches: list[Switch] = []
        """every change of the split, roll-backs included"""
        self.splits: list[tuple[int, ...]] = []
        """the split each optimizer step used, in step order (this rank's view; verified when gathered)"""
        self._first_measures: list[StepMeasure] = []  # the plan's split's steps, for the report
        self._step = 0
        self._records: list[tuple[int, tuple[int, ...], list, list, int | None]] = []  # not gathered yet
        self._last_gather_step = 0
        self._window = self.policy.check_every_steps
        self._since_step = 0  # steps up to this one no longer describe the speeds (a change was seen)
        self._rejected: dict[tuple[int, ...], int] = {}  # rolled-back split -> step it was rolled back at
        self._pending: tuple[int, int] | None = None  # position of a switch not yet seen in a step
        self._verify: list[StepMeasure] | None = None  # the steps before a switch that is still to be judged
        self._sample_agreed_step = 0
        self._last_cost: tuple[float, bool] = (0.0, False)  # this rank's last gather: s, watching
        self._posted: _PostedGather | None = None  # a watching window's all-gather in flight
        self._acting_s = 0.0  # seconds the last rules' run spent deciding and switching (not watching)
        self._watch_costs: list[float] = []  # the latest gathers' costs (all ranks' view)
        self._watch_totals = [0.0, 0.0]  # watching: seconds of gathers, seconds of the steps they covered
        self._watch_overhead: float | None = None
        self._last_done_s: float | None = None
        self._step_walls: list[float] = []
        self._split: tuple[int, ...] | None = None
        self._in_compute = False
        self._start: Any = None
        self._forward_start: Any = None
        self._hook_end: Any = None
        self._slept = False
        self._credit_s = 0.0  # seconds a simulated sleep overran, taken off the host-clock marks after it
        self._intervals: list[tuple[Any, Any]] = []
        self._waits: list[tuple[Any, Any]] = []
        self._step_splits: list[tuple[int, ...]] = []
        self._peak_bytes: int | None = None
        self._comm_error: BaseException | None = None
        self._key_prefix = f"batchplan-rebalance/{next(_instances)}"
        self._boundary: tuple[int, int] = (0, 0)
        self._window_first = 0
        self._group = None
        self._watchdog = None
        self._connect(ddp)

    def _connect(self, ddp: torch.nn.Module | None) -> None:
        """The re-balancer's own process group, this rank's watchdog and the model's timing hooks."""
        if self.world_size > 1 and dist.is_available() and dist.is_initialized():
            # every rank builds its re-balancer in the same order: new_group is a collective
            self._group = dist.new_group(
                timeout=timedelta(seconds=self.collective_timeout_s), backend=dist.get_backend()
            )
        # lets the others end this rank, on whatever node, if it hangs or is stopped (planner.runtime.rank_watchdog)
        self._watchdog = (
            start_rank_watchdog(default_store(), self._key_prefix, self.rank)
            if self._group is not None
            else None
        )
        if ddp is not None and isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
            ddp.register_comm_hook(None, self._comm_hook)
            ddp.module.register_forward_pre_hook(self._forward_pre_hook)
        elif ddp is not None:
            ddp.register_forward_pre_hook(self._forward_pre_hook)

    @staticmethod
    def _check_arguments(sampler: Any, ddp: Any, limits: Sequence[RankLimits], timeout_s: float) -> None:
        if not isinstance(sampler, PlannedBatchSampler):
            raise ConfigError(
                f"Rebalancer needs the rank's PlannedBatchSampler, got {type(sampler).__name__}"
            )
        if len(limits) != sampler.world_size:
            raise ConfigError(f"{len(limits)} rank limits for a sampler of {sampler.world_size} ranks")
        distributed = dist.is_available() and dist.is_initialized()
        if distributed and dist.get_world_size() != sampler.world_size:
            raise ConfigError(
                f"the process group has {dist.get_world_size()} ranks, the sampler {sampler.world_size}"
            )
        if distributed and dist.get_rank() != sampler.rank:
            raise ConfigError(f"this is rank {dist.get_rank()} but the sampler is rank {sampler.rank}'s")
        if sampler.world_size > 1 and not isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
            raise ConfigError(
                "Rebalancer needs the DistributedDataParallel model: its comm hook marks the end of "
                "this rank's own compute (without it the all-reduce wait would be timed)"
            )
        if not 0 < timeout_s < float("inf"):
            raise ConfigError(f"collective_timeout_s must be > 0 seconds, got {timeout_s!r}")

    @classmethod
    def from_plan(
        cls,
        plan: str | Path | Mapping[str, Any] | Plan,
        sampler: PlannedBatchSampler,
        ddp: torch.nn.Module | None,
        **options: Any,
    ) -> Rebalancer:
        """The re-balancer for a plan: a path of plan.json, a typed ``Plan`` (``autobatch_ddp``'s), or the
        document as a mapping; every form is validated into the typed plan.

        Options are those of the constructor (``policy``, ``simulate``, ``device``, ...).
        """
        from planner.plan.io import load_plan, validate_plan

        typed = validate_plan(plan) if isinstance(plan, Plan | Mapping) else load_plan(plan)
        batches = [r.batch for r in typed.ranks]
        if batches != list(sampler.batches):
            raise ConfigError(
                f"the sampler's batches {list(sampler.batches)} are not the plan's {batches} (build the "
                "sampler from this plan)"
            )
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
        """Around one micro-step's forward and backward: takes its split from the sampler and times it.

        Raises:
            RebalanceError: the gradient all-reduce failed (a rank died or hung), naming the rank.
        """
        if self._in_compute:
            raise ConfigError("Rebalancer.compute() blocks cannot be nested")
        self._split = self.sampler.take_split()
        self._step_splits.append(self._split)
        if self._clock.cuda and not self._intervals:
            torch.cuda.reset_peak_memory_stats(self.device)
        self._in_compute, self._slept, self._credit_s = True, False, 0.0
        self._forward_start = self._hook_end = None
        self._start = self._clock.mark()
        bounded = (
            lowered_default_timeout(self.collective_timeout_s)
            if self._group is not None
            else contextlib.nullcontext(False)
        )
        try:
            with (
                bounded
            ):  # DDP's own collectives in the block (its buffer broadcast) end within our timeout too
                yield self
        except Exception as exc:
            if self._comm_error is not None:  # our all-reduce failed: name the rank, one line
                self._in_compute = False
                raise self.collective_failure("the gradient all-reduce", self._comm_error) from exc
            if self._group is not None and is_collective_failure(exc):
                self._in_compute = False
                raise self.collective_failure(
                    "a collective of the default process group in the step (DDP's "
                    "buffer broadcast or bucket rebuild)",
                    exc,
                ) from exc
            raise
        finally:
            self._in_compute = False
        end = self._clock.mark()
        if (
            self._hook_end is None
        ):  # no all-reduce in this micro-step (no_sync, one rank): the block is compute
            self._maybe_sleep()
            end = self._clock.mark()
            self._hook_end = self._credited(end)  # a simulated sleep's lateness is waiting, not compute
        start = self._forward_start if self._forward_start is not None else self._start
        self._intervals.append((start, self._hook_end))
        self._waits.append((self._hook_end, end))

    def _forward_pre_hook(self, module: torch.nn.Module, args: Any) -> None:
        if self._in_compute and self._forward_start is None:
            self._forward_start = self._clock.mark()

    def _maybe_sleep(self) -> None:
        """A simulated slow device still computing (``planner.runtime.simulate``): sleep its extra time, once a
        micro-step. With a measured per-sample time (sleeps of a fraction of a millisecond, which a loaded host
        overruns several times over) the host-clock marks after it are credited with the sleep's lateness
        (``_credited``); a declared one's sleeps (tens of ms) carry it as the noise of a real device's step."""
        if self.simulate is None or self._slept or self._split is None:
            return
        self._slept = True
        start = self._forward_start if self._forward_start is not None else self._start
        began = self._clock.mark()
        extra = self.simulate.extra_s(
            self.rank, self._split[self.rank], self._step + 1, real_s=self._clock.elapsed_s(start, began)
        )
        if extra > 0:
            time.sleep(extra)
            if not self._clock.cuda and self.simulate.sample_s is None:
                self._credit_s = min(0.0, began + extra - self._clock.mark())  # the host woke up late

    def _credited(self, mark: Any) -> Any:
        """A host-clock mark taken after a simulated sleep, as if the sleep had lasted what was declared: the
        simulated device computes for the time declared; the host's lateness in waking (the scheduler's, a few
        ms on a loaded machine, whatever the sleep's length) is this rank's wait, not its compute."""
        return mark + self._credit_s if self._credit_s else mark

    def _comm_hook(self, state, bucket):  # no annotations: DDP checks them, and this module's are strings
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        if self._in_compute:
            self._maybe_sleep()  # a simulated slow device is still computing here
            self._hook_end = self._credited(
                self._clock.mark()
            )  # the last bucket's mark wins: own backward is done
        # DDP's default all-reduce, in the re-balancer's group: its timeout bounds a wait for a dead rank
        return allreduce_hook(self._group, bucket).then(self._after_allreduce)  # type: ignore[arg-type]

    def _after_allreduce(self, future):
        try:
            return future.value()
        except Exception as exc:  # gloo/NCCL: a peer died, or the timeout passed
            self._comm_error = exc
            raise

    # --------------------------------------------------------------------------------- step boundary

    def step_done(self) -> None:
        """After the optimizer step: record the step; on a gathering step gather, judge, decide, maybe switch.

        Raises:
            RebalanceError: a rank died, hung or disagreed (on every rank that is still alive).
            ConfigError: no ``compute()`` block in this step, or blocks of different splits.
        """
        if self._in_compute:
            raise ConfigError("step_done() inside a compute() block: call it after the optimizer step")
        if not self._intervals:
            raise ConfigError(
                "step_done() without a compute() block in this step: wrap forward+backward in "
                "rebalancer.compute()"
            )
        if len(set(self._step_splits)) != 1:
            raise ConfigError(
                f"the micro-steps of one optimizer step used different splits {self._step_splits}: "
                "a switch fell inside an optimizer step (is accumulate the sampler's?)"
            )
        began = time.perf_counter()
        self._step += 1
        split = self._step_splits[0]
        self.splits.append(split)
        if self._clock.cuda:
            self._peak_bytes = int(torch.cuda.max_memory_reserved(self.device))
        self._records.append((self._step, split, self._intervals, self._waits, self._peak_bytes))
        self._intervals, self._waits, self._step_splits, self._split = [], [], [], None
        if self._pending is not None and split == self.switches[-1].batches:
            self._pending = None  # the switch is in effect
        if self._last_done_s is not None:
            self._step_walls = [*self._step_walls[-49:], began - self._last_done_s]
        if self._posted is not None:
            self._complete_posted(split)
        watching = self._step > self.policy.probe_steps and self._verify is None and self._pending is None
        if self._gather_due():
            if watching and self.world_size > 1:
                self._post_gather()
            else:
                self._gather_steps()
                self._last_gather_step = self._step
                self._after_gather(split)
                self._last_cost = (time.perf_counter() - began, watching)
        self._last_done_s = time.perf_counter()

    def _gather_due(self) -> bool:
        """The same answer on every rank: it depends only on gathered data and the step count."""
        if self._step <= max(self.policy.probe_steps, self.policy.warmup_steps, 1):
            return True
        if self._pending is not None:
            return False  # nothing to judge before the switch is in effect
        if self._verify is not None:
            return True  # a switch to see through and judge
        return self._step - self._last_gather_step >= self._window

    def _gather_steps(self) -> None:
        """All-gather the steps recorded since the last gather (one tensor collective); append them to
        ``measures``."""
        values, records = self._step_values()
        self._absorb(self._gather_tensor(values, "step times"), records)

    def _post_gather(self) -> None:
        """Start a watching window's all-gather without waiting for it: it completes in the background while
        the next step computes, and :meth:`_complete_posted` reads it at the next ``step_done``. Watching then
        costs a step a few clock reads and one collective's start, not a round trip of every rank."""
        began = time.perf_counter()
        values, records = self._step_values()
        mine = torch.tensor(values, dtype=torch.float64, device=self._collective_device())
        everyone = [torch.empty_like(mine) for _ in range(self.world_size)]
        try:
            work = dist.all_gather(everyone, mine, group=self._group, async_op=True)
        except Exception as exc:  # gloo: connection closed by a dead peer
            raise self.collective_failure("the all-gather of step times", exc) from exc
        self._last_gather_step = self._step
        self._posted = _PostedGather(
            work=work, everyone=everyone, records=records, cost_s=time.perf_counter() - began
        )

    def _complete_posted(self, split: tuple[int, ...]) -> None:
        """Wait for the watching window posted at the last gathering step, take its steps in, and run the
        rules on them; a decision to switch gathers this step at once (a switch needs every rank's boundary
        as of now, not as of the posting)."""
        began = time.perf_counter()
        posted = self._take_posted()
        self._acting_s = 0.0
        self._after_gather(split, boundary_fresh=False)
        # watching's cost: starting the gather, waiting for it, the rules; a decision it led to (a gather of
        # this step, the agreement, the switch) is the cost of re-balancing, as in the probing steps
        self._last_cost = (posted.cost_s + time.perf_counter() - began - self._acting_s, True)

    def _step_values(self) -> tuple[list[float], list[tuple]]:
        """This rank's row of the next gather (header, then per step: step, compute s, wait s, peak bytes) and
        the steps it holds; the recorded steps are handed over."""
        records = [
            (
                step,
                split,
                sum(self._clock.elapsed_s(a, b) for a, b in compute),
                sum(self._clock.elapsed_s(a, b) for a, b in waits),
                peak,
            )
            for step, split, compute, waits, peak in self._records
        ]
        wall_s = statistics.median(self._step_walls) if self._step_walls else -1.0
        header = [
            len(records),
            zlib.crc32(repr([(r[0], r[1]) for r in records]).encode()),
            *self.sampler.next_boundary(),
            self._last_cost[0],
            float(self._last_cost[1]),
            wall_s,
        ]
        values = header + [v for r in records for v in (r[0], r[2], r[3], -1 if r[4] is None else r[4])]
        self._records = []
        return values, records

    def _absorb(self, rows: list[list[float]], records: list[tuple]) -> None:
        """Every rank's gathered rows of ``records``' steps into ``measures``, checked to be in step."""
        if len({(row[0], row[1]) for row in rows}) != 1:
            raise RebalanceError(
                f"rebalance: ranks are out of step after optimizer step {self._step} (their steps "
                "or splits differ): every rank must call compute() once per micro-step and "
                "step_done() once per optimizer step"
            )
        self._window_first = records[0][0]
        self._boundary = max((int(row[2]), int(row[3])) for row in rows)
        for index, (step, split, _, _, _) in enumerate(records):
            fields = [row[_HEADER + 4 * index : _HEADER + 4 * index + 4] for row in rows]
            peaks = [f[3] for f in fields]
            measure = StepMeasure(
                step=step,
                batches=split,
                compute_s=tuple(float(f[1]) for f in fields),
                sync_wait_s=tuple(float(f[2]) for f in fields),
                peak_bytes=None if any(p < 0 for p in peaks) else tuple(int(p) for p in peaks),
            )
            self.measures.append(measure)
            if not self.switches and len(self._first_measures) < 100:
                self._first_measures.append(measure)
        del self.measures[:-_MAX_MEASURES]
        self._update_window(rows, len(records))

    def _update_window(self, rows: list[list[float]], steps: int) -> None:
        """The cost of watching, and its window: at least ``check_every_steps``, wide enough that a watching
        gather costs at most ``watch_cost_share`` of the steps it covers (on the mean of the latest 20).

        The cost of a watching gather is the fastest rank's time spent on it: starting it in one
        ``step_done``, waiting for it and running the rules in the next (the others' extra time there is
        waiting for the last rank to arrive, which they would otherwise wait at the next all-reduce). What the
        gather takes from the step it overlaps is not in it: on a GPU job nothing (the step runs on the
        device), on a CPU-only job a gloo thread's moment of a core."""
        walls = [row[6] for row in rows if row[6] > 0]
        if not walls:
            return
        wall_s = statistics.median(walls)
        cost_s = min(row[4] for row in rows)
        if not rows[0][5]:
            return  # a probing or verifying gather (synchronous, the cost of re-balancing): not watching's
        # the last gather was a watching one (started in one step_done, read in the next): watching's cost
        self._watch_costs = [*self._watch_costs[-19:], cost_s]
        self._watch_totals[0] += cost_s
        self._watch_totals[1] += steps * wall_s
        self._watch_overhead = self._watch_totals[0] / self._watch_totals[1]
        if self.policy.watch_cost_share > 0:
            # the mean, not the median: the share stated is a ratio of sums, and the costs are heavy-tailed
            needed = math.ceil(statistics.fmean(self._watch_costs) / (self.policy.watch_cost_share * wall_s))
            self._window = max(self.policy.check_every_steps, min(_MAX_WINDOW, needed))

    def _usable(self) -> list[StepMeasure]:
        """The steps the rules see: after the warm-up (and the simulation's agreement), since the speeds last
        changed."""
        since = max(self.policy.warmup_steps, self._sample_agreed_step, self._since_step)
        # the latest steps only: the rules' cost stays bounded in a long job, and recent steps describe it best
        return [m for m in self.measures[-_MAX_RULE_STEPS:] if m.step > since]

    def _after_gather(self, split: tuple[int, ...], *, boundary_fresh: bool = True) -> None:
        """Judge a switch, watch for changed speeds, decide: the same on every rank (gathered data only).

        ``boundary_fresh`` False: the gathered rows are a posted window's, whose sampler boundaries are a step
        old; before deciding, this step is gathered at once for fresh ones."""
        self._maybe_agree_simulation()
        if self._pending is not None:
            return
        usable = self._usable()
        at_split = [m for m in usable if m.batches == split]
        if self._verify is not None:
            since = max((m.step for m in self.measures if m.batches != split), default=0)
            after = [m for m in at_split if m.step > since]
            if len(after) < self.policy.min_points:
                return
            verdict = self._judge(self._verify, after, split)
            if verdict != "keep":
                return  # rolled back, or measuring on
            self._verify = None
        elif self._step > self.policy.probe_steps:
            self._watch_for_change(at_split)
            usable = self._usable()
            at_split = [m for m in usable if m.batches == split]
        if (
            len(at_split) < self.policy.min_points
            or len(self.switches) >= self.policy.max_switches
            or balanced(usable, self.limits, current=split, multiple_of=self.multiple_of, policy=self.policy)
        ):
            return  # the same on every rank (gathered data): no decision, no agreement to gather
        acting_from = time.perf_counter()
        if not boundary_fresh:
            self._gather_steps()
            self._last_gather_step = self._step
            usable = self._usable()
        decision = self._decide(
            usable,
            self.limits,
            current=split,
            multiple_of=self.multiple_of,
            min_batch=self.min_batch,
            policy=self.policy,
            rejected=self._recently_rejected(),
        )
        self._agree(decision)
        if decision is not None:
            self._verify = [m for m in usable if m.batches == split]
            self._switch(
                decision.batches, decision.predicted_step_s, decision.current_step_s, decision.reason
            )
        self._acting_s = time.perf_counter() - acting_from

    def _maybe_agree_simulation(self) -> None:
        """A measured simulation: after the warm-up, one per-sample time for every rank (the median of the
        ranks' real seconds per sample in the last warm-up step)."""
        if self.simulate is None or not self.simulate.measuring or not self.measures:
            return
        last = self.measures[-1]
        if last.step < max(self.policy.warmup_steps, 1):
            return
        per_sample = [t / max(b, 1) for t, b in zip(last.compute_s, last.batches, strict=True)]
        self.simulate.agree(statistics.median(per_sample))
        self._sample_agreed_step = last.step
        log.info("rebalance: %s", self.simulate.describe())

    def _recently_rejected(self) -> frozenset[tuple[int, ...]]:
        return frozenset(
            s for s, step in self._rejected.items() if self._step - step < self.policy.retry_after_steps
        )

    def _judge(self, before: list[StepMeasure], after: list[StepMeasure], split: tuple[int, ...]) -> str:
        """Keep the switch to ``split``, measure on, or roll it back (``switch_verdict``)."""
        if not before or self.switches[-1].kind == "rollback":
            return "keep"
        verdict, before_s, after_s = switch_verdict(before, after, self.policy)
        if verdict != "rollback":
            return verdict
        previous = before[0].batches
        self._verify = None
        self._rejected[split] = self._step
        log.warning(
            "rebalance: step %d: %s measured %.4f s per step, not faster than %s's %.4f s: rolled back",
            self._step,
            list(split),
            after_s,
            list(previous),
            before_s,
        )
        self._switch(previous, before_s, after_s, "rollback")
        return verdict

    def _watch_for_change(self, at_split: list[StepMeasure]) -> None:
        """A window whose times at the same split moved beyond the noise: the speeds changed; the steps
        before it are set aside and the roll-backs forgotten."""
        window = [m for m in at_split if m.step >= self._window_first]
        earlier = [m for m in at_split if m.step < self._window_first]
        if speeds_changed(earlier, window, self.policy):
            self._since_step = self._window_first - 1
            self._rejected.clear()
            log.warning(
                "rebalance: step %d: the ranks' compute times at %s changed (speeds changed under the "
                "job): re-balancing from the last %d steps",
                self._step,
                list(window[0].batches),
                len(window),
            )

    def _switch(self, batches: tuple[int, ...], predicted_s: float, previous_s: float, kind: str) -> None:
        position = self._boundary
        self.sampler.switch_batches(batches, position)
        self._pending = position
        current = self.splits[-1]
        self.switches.append(
            Switch(
                decided_at_step=self._step,
                position=position,
                batches=batches,
                predicted_step_s=predicted_s,
                previous_step_s=previous_s,
                kind=kind,
            )
        )
        log.info(
            "rebalance: step %d: %s -> %s (%s; step %.4f s -> %.4f s) from position %s",
            self._step,
            list(current),
            list(batches),
            kind,
            previous_s,
            predicted_s,
            position,
        )

    def _gather_tensor(self, values: list[float], what: str) -> list[list[float]]:
        """Every rank's ``values`` (the same length on every rank), as float64 in one all-gather."""
        if self.world_size == 1:
            return [values]
        mine = torch.tensor(values, dtype=torch.float64, device=self._collective_device())
        everyone = [torch.empty_like(mine) for _ in range(self.world_size)]
        try:
            dist.all_gather(everyone, mine, group=self._group)
        except Exception as exc:  # gloo: connection closed by a dead peer, or the group's timeout
            raise self.collective_failure(f"the all-gather of {what}", exc) from exc
        return [t.tolist() for t in everyone]

    def _collective_device(self) -> torch.device | None:
        """Where the gathered tensors live: the current CUDA device under NCCL, else the CPU."""
        return (
            torch.device("cuda", torch.cuda.current_device())
            if dist.get_backend(self._group) == "nccl"
            else None
        )

    def _gather(self, payload: dict, what: str) -> list[dict]:
        if self.world_size == 1:
            return [payload]
        gathered: list[Any] = [None] * self.world_size
        try:
            dist.all_gather_object(gathered, payload, group=self._group)
        except Exception as exc:  # gloo: connection closed by a dead peer, or the group's timeout
            raise self.collective_failure(f"the all-gather of {what}", exc) from exc
        return gathered

    def _flush_posted(self) -> None:
        """Take in a posted watching window that no later step read (the run ended after it): its steps
        count for the report and the feedback; no rule runs on them."""
        if self._posted is not None:
            self._take_posted()

    def _take_posted(self) -> _PostedGather:
        """Wait for the posted watching window and take its steps into ``measures``."""
        posted, self._posted = self._posted, None
        assert posted is not None
        try:
            posted.work.wait()
        except Exception as exc:  # gloo: connection closed by a dead peer, or the group's timeout
            raise self.collective_failure("the all-gather of step times", exc) from exc
        self._absorb([t.tolist() for t in posted.everyone], posted.records)
        return posted

    def collective_failure(self, what: str, exc: BaseException) -> RebalanceError:
        """The one-line error of a failed collective (``what``: e.g. "the loss all-reduce"), naming the rank(s)
        that did not answer; for the training loop's own collectives too."""
        # the survivors fail within moments of each other, seconds apart on a loaded machine: 2 s was seen to let
        # the store's host (rank 0 of an env:// launch) leave before a slower survivor could name (1 run in 20 at
        # load 12-19 on 2 cores)
        grace_s = min(4.0, self.collective_timeout_s / 2)
        store = default_store()
        missing = missing_ranks(store, self._key_prefix, self.rank, self.world_size, self._step, grace_s)
        if missing:
            who = f"rank {missing[0]}" if len(missing) == 1 else "ranks " + ", ".join(str(r) for r in missing)
            who += " stopped answering"
            with lowered_store_timeout(store, grace_s):  # a hung or stopped rank's node must end too
                ended = stop_ranks(store, self._key_prefix, missing)
        else:
            who, ended = "a rank stopped answering (which one could not be told)", []
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        return RebalanceError(
            f"rebalance: {who} after optimizer step {self._step}: it died or hung ({what} failed on rank "
            f"{self.rank} within the re-balancer's {self.collective_timeout_s:g} s timeout: "
            f"{type(exc).__name__}: {first_line[:200]}); rank {self.rank} stops too"
            + (
                f"; ended rank {', '.join(str(r) for r in ended)} through its watchdog, so that its node stops as well"
                if ended
                else ""
            )
        )

    def _agree(self, decision: Decision | None) -> None:
        """Every rank's decision must be the same; otherwise every rank raises (nobody waits forever)."""
        mine = None if decision is None else list(decision.batches)
        # one tiny tensor all-gather of a checksum; the decisions themselves only when they differ
        digests = self._gather_tensor([zlib.crc32(repr(mine).encode())], "re-balancing decisions")
        if len({row[0] for row in digests}) == 1:
            return
        everyone = self._gather({"decision": mine}, "re-balancing decisions")
        if any(g["decision"] != mine for g in everyone):
            detail = "; ".join(f"rank {r}: {g['decision'] or 'keep'}" for r, g in enumerate(everyone))
            raise RebalanceError(
                f"rebalance: ranks reached different decisions after optimizer step {self._step} "
                f"({detail}); they must all run the same code on the same gathered times"
            )

    # --------------------------------------------------------------------------------- results

    def report(self) -> RebalanceReport:
        """What happened so far (the same on every rank: gathered data only)."""
        if not self.splits:
            raise ConfigError("Rebalancer.report() before any step")
        self._flush_posted()
        kept = {m.step for m in self.measures}
        measures = [m for m in self._first_measures if m.step not in kept] + self.measures
        return build_report(
            self.splits,
            measures,
            self.switches,
            warmup_steps=self.policy.warmup_steps,
            watch_overhead=self._watch_overhead,
        )

    def feedback(self) -> tuple[Plan, dict]:
        """The updated plan (final batches, weights, ``measured`` section) and the measured profiles by cache
        key (``planner.runtime.rebalance_feedback``). Needs ``from_plan``.

        A simulated run gives no profiles: its times are the simulation's, not the model's on that GPU, and
        must never answer a later plan of the real job (its plan file still gets the ``measured`` section,
        marked simulated). The section's ``sync`` is the exposed synchronisation against the plan's model
        (``planner.runtime.sync_feedback``; for a simulated run, why nothing is filed)."""
        from planner.runtime.rebalance_feedback import (
            job_marks,
            measured_section,
            updated_plan,
        )

        if self.plan is None:
            raise ConfigError("Rebalancer.feedback() needs the plan: build the re-balancer with from_plan()")
        kept = {m.step for m in self.measures}
        every = [m for m in self._first_measures if m.step not in kept] + self.measures
        usable = [
            m for m in every if m.step > max(self.policy.warmup_steps, self._sample_agreed_step)
        ] or every
        simulated = self.simulate.describe() if self.simulate is not None else None
        from planner.runtime.sync_feedback import sync_entry

        marks = job_marks(self._link())
        report = self.report()
        sync = sync_entry(
            self.plan.comm,
            usable,
            report.batches_last,
            self.plan.accumulate,
            ", ".join(f"{name} {value}" for name, value in marks.items()),
            simulated,
        )
        section = measured_section(
            self.plan,
            usable,
            report,
            self.limits,
            prior_weight=self.policy.prior_weight,
            simulated=simulated,
            marks=marks,
            sync=sync,
        )
        profiles = {} if simulated else self._measured_profiles(usable, marks)
        return updated_plan(self.plan, section), profiles

    def _measured_profiles(self, usable: Sequence[StepMeasure], marks: Mapping[str, str]) -> dict:
        """The measured profiles, or none (with a warning) where the plan's model cannot be rebuilt in this
        process to name them (a ``module:factory`` not importable from the job's working directory, a library
        not installed on the training nodes): a finished job must not fail over its feedback."""
        from planner.runtime.rebalance_feedback import measured_profiles

        try:
            return measured_profiles(self.plan, usable, prior_weight=self.policy.prior_weight, marks=marks)
        except WorkloadError as exc:
            log.warning(
                "rebalance: the measured profiles were not filed in the profile cache (the plan file still "
                "gets them): %s",
                exc,
            )
            return {}

    @staticmethod
    def _file_sync(plan: Plan, cache_dir: str | Path | None) -> list[Path]:
        """The measured synchronisation filed for the next plan (``planner.runtime.sync_feedback``), or nothing
        (with a warning) where the plan's model cannot be rebuilt here to name it or the cache cannot be written."""
        from planner.runtime.sync_feedback import file_job_sync

        try:
            path = file_job_sync(plan, cache_dir)
        except (WorkloadError, ConfigError) as exc:
            log.warning(
                "rebalance: the measured synchronisation was not filed (the plan file still has it): %s", exc
            )
            return []
        return [path] if path is not None else []

    def _link(self) -> str:
        """How the ranks were connected: backend, nodes and ranks (the feedback's mark)."""
        backend = dist.get_backend() if dist.is_available() and dist.is_initialized() else "none"
        nodes = len({r.node for r in self.plan.ranks}) if self.plan is not None else 1
        return f"{backend}, {nodes} node(s), {self.world_size} rank(s)"

    def write_feedback(self, plan_path: str | Path | None, cache_dir: str | Path | None = None) -> list[Path]:
        """On rank 0: write the updated plan to ``plan_path`` (atomically; None: not written) and the measured
        profiles and the measured synchronisation to the profile cache (``cache_dir``, default the planner's;
        a simulated run writes none).
        Other ranks write nothing.

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
        job = self.plan.job
        written = []
        if plan_path is not None:
            written.append(write_plan(plan, plan_path))
        written.extend(self._file_sync(plan, cache_dir))
        if profiles:
            fingerprint = measured_fingerprint(job)
            cache = ProfileCache(cache_dir)
            written.extend(
                cache.put(
                    key,
                    profile,
                    inputs=measured_key_inputs(job, profile.gpu, profile.amp, fingerprint=fingerprint),
                )
                for key, profile in profiles.items()
            )
        return written
