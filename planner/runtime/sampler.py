"""A batch sampler that splits every global batch into the planned, unequal per-rank slices.

``DistributedSampler`` gives every rank ``len(dataset) / W`` samples and the DataLoader cuts them into equal
batches; with per-rank batches ``b_i`` of different sizes the ranks would then run different numbers of
steps, and DDP hangs at the first all-reduce a rank never reaches (DeepSpeed #2223). This sampler instead
walks one shared permutation of the dataset in global steps of ``B = Σ_i b_i`` indices and hands rank ``i``
the slice ``[offset_i, offset_i + b_i)`` of each, where ``offset_i = Σ_{j<i} b_j``. Every rank computes
the same permutation from ``seed + epoch`` (no communication), so the slices are disjoint, every rank runs
the same number of steps, and one global step holds exactly the samples a single process would take.

Use it as a DataLoader's ``batch_sampler``::

    sampler = PlannedBatchSampler.from_plan(rank_plan, len(dataset), seed=0)
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=4)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader: ...

Re-balancing (``planner.runtime.rebalance``) may change the split between steps with :meth:`switch_batches`:
the global step keeps its ``B`` samples and only the cut points move, so every sample of an epoch is still
handed out exactly once and every rank still runs the same number of steps, across any number of switches.
A switch takes effect at a *position* ``(pass, step)`` — the ``pass``-th iteration over the sampler and a
micro-step inside it — that no rank has yielded yet, so a DataLoader that prefetches indices never holds a
slice of the old split for a step that uses the new one.

The first time it is iterated, every rank checks with the others that they cut the same global batches
(``planner.runtime.plan_agreement``: through the job's key-value store, where a process group is initialised); a
rank with another plan (a stale ``plan.json`` on a node) ends every rank with one line naming its node. Set
``agree_on_first_use = False`` on a sampler that only some ranks iterate.

Known limitations: the permutation comes from ``torch.randperm`` with a CPU generator, so all ranks must run
the same torch version (as ``DistributedSampler`` also assumes). The sampler does not look at the data, so
samples of different cost (sequence length) are not balanced.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch
from torch.utils.data import Sampler

from planner.errors import ConfigError
from planner.runtime.plan_agreement import SplitTerms, agree_on_split
from planner.runtime.weights import positive_int

if TYPE_CHECKING:
    from planner.runtime.rank_plan import RankPlan

__all__ = ["PlannedBatchSampler"]


class PlannedBatchSampler(Sampler[list[int]]):
    """Yields this rank's index list for every global step of an epoch; on the first iteration the ranks check
    that they hold the same plan (``planner.runtime.plan_agreement``).

    Args:
        dataset_size: number of samples in the dataset (``len(dataset)``).
        batches: every rank's batch per step, in rank order (``plan.json`` ``ranks[].batch``).
        rank: this process's global rank.
        shuffle: draw a new permutation every epoch (seeded with ``seed + epoch``); else dataset order.
        seed: base seed; must be the same on every rank.
        drop_last: drop the tail of the epoch that does not fill a whole optimizer step. With ``False`` the
            tail is completed by wrapping around to the start of the epoch's order (as
            ``DistributedSampler`` pads), so a few samples are seen twice in that epoch. Either way every
            rank gets exactly its planned batch in every step, so the plan's loss weights stay exact, and
            every rank runs the same number of steps, so DDP cannot hang on a missing all-reduce.
        accumulate: micro-steps per optimizer step (``plan.json`` ``accumulate``). The number of steps per
            epoch is a multiple of it, so an epoch never ends inside an optimizer step.

    Raises:
        ConfigError: empty or non-positive batches, a rank out of range, or a dataset smaller than one
            optimizer step (``Σ batches · accumulate`` samples).
    """

    agree_on_first_use: bool = True
    """check with the other ranks, at the first iteration, that they cut the same global batches (every rank waits
    for the others: set False on a sampler that only some ranks iterate)"""

    def __init__(
        self,
        dataset_size: int,
        batches: Sequence[int],
        rank: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        accumulate: int = 1,
    ) -> None:
        super().__init__()
        if len(batches) == 0:
            raise ConfigError("batches is empty: give every rank's batch in rank order")
        self.batches: tuple[int, ...] = tuple(positive_int(b, f"batches[{i}]") for i, b in enumerate(batches))
        """every rank's batch per step, in rank order (after :meth:`switch_batches`: the latest split)"""
        try:
            checked_rank = None if isinstance(rank, bool) else operator.index(rank)
        except TypeError:
            checked_rank = None
        if checked_rank is None or not 0 <= checked_rank < len(self.batches):
            raise ConfigError(
                f"rank {rank!r} is out of range for {len(self.batches)} ranks (expected 0..{len(self.batches) - 1})"
            )
        self.rank: int = checked_rank
        """this process's global rank"""
        self.accumulate = positive_int(accumulate, "accumulate")
        """micro-steps per optimizer step"""
        self.dataset_size = positive_int(dataset_size, "dataset_size")
        """samples in the dataset"""
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        """the epoch whose permutation ``__iter__`` walks; set with :meth:`set_epoch`"""

        optimizer_step = self.step_batch * self.accumulate
        if self.dataset_size < optimizer_step:
            what = (
                "one global batch"
                if self.accumulate == 1
                else f"one optimizer step ({self.accumulate} micro-steps)"
            )
            raise ConfigError(
                f"the dataset has {self.dataset_size} samples, fewer than {what} of {optimizer_step} samples "
                f"(batches {list(self.batches)}): use a larger dataset or plan a smaller global batch"
            )
        if self.drop_last:
            optimizer_steps = self.dataset_size // optimizer_step
        else:
            optimizer_steps = -(-self.dataset_size // optimizer_step)  # ceil
        self._steps_per_epoch = optimizer_steps * self.accumulate
        # re-balancing state: (position, batches) in position order; the first entry is the plan's split
        self._schedule: list[tuple[tuple[int, int], tuple[int, ...]]] = [((0, 0), self.batches)]
        self._next_pass = 0
        self._cursor: tuple[int, int] = (0, 0)  # the next position __iter__ will yield
        self._yielded: deque[tuple[int, ...]] = deque()  # splits of lists yielded and not yet taken
        self._agreed = False  # whether the ranks have checked that they hold the same plan

    @classmethod
    def from_plan(
        cls,
        plan: RankPlan,
        dataset_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
    ) -> PlannedBatchSampler:
        """The sampler for ``plan``'s rank (batches, rank and accumulate from the plan)."""
        return cls(
            dataset_size,
            plan.batches,
            plan.rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            accumulate=plan.accumulate,
        )

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return len(self.batches)

    @property
    def rank_batch(self) -> int:
        """This rank's batch per step (``b_i``)."""
        return self.batches[self.rank]

    @property
    def step_batch(self) -> int:
        """Samples of one global (micro-)step over all ranks (``B = Σ_i b_i``)."""
        return sum(self.batches)

    @property
    def offset(self) -> int:
        """Where this rank's slice starts inside a global step (``Σ_{j<i} b_j``)."""
        return sum(self.batches[: self.rank])

    @property
    def samples_per_epoch(self) -> int:
        """Indices one epoch hands out over all ranks (less than the dataset with ``drop_last``, more
        without it when the tail was padded)."""
        return self._steps_per_epoch * self.step_batch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's permutation; call it with the same value on every rank before iterating."""
        self.epoch = int(epoch)

    def epoch_order(self) -> list[int]:
        """The epoch's global order, already cut or padded to ``samples_per_epoch`` indices.

        Global step ``s`` is ``order[s·B : (s+1)·B]``; rank ``i`` takes ``[offset_i, offset_i + b_i)`` of it.
        """
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.dataset_size, generator=generator).tolist()
        else:
            order = list(range(self.dataset_size))
        wanted = self.samples_per_epoch
        if wanted <= len(order):
            return order[:wanted]
        padding = wanted - len(order)
        # wrap around like DistributedSampler; the dataset holds at least one optimizer step, and the
        # padding is less than one, so one extra copy of the start always suffices
        return order + order[:padding]

    def split_terms(self) -> SplitTerms:
        """What decides this rank's slices, as the plan gave them (before any re-balancing switch)."""
        return SplitTerms(
            batches=self._schedule[0][1],
            accumulate=self.accumulate,
            dataset_size=self.dataset_size,
            shuffle=self.shuffle,
            seed=self.seed,
            drop_last=self.drop_last,
        )

    def __iter__(self) -> Iterator[list[int]]:
        if not self._agreed and self.agree_on_first_use:
            agree_on_split(self.split_terms())
            self._agreed = True
        this_pass = self._next_pass
        self._next_pass += 1
        self._cursor = (this_pass, 0)
        self._yielded.clear()  # lists of an abandoned pass are never taken
        order = self.epoch_order()
        step_batch = self.step_batch
        for step in range(self._steps_per_epoch):
            split = self.batches_at((this_pass, step))
            start = step * step_batch + sum(split[: self.rank])
            self._cursor = (this_pass, step + 1)
            self._yielded.append(split)
            yield order[start : start + split[self.rank]]

    # ---------------------------------------------------------------------------------- re-balancing

    def batches_at(self, position: tuple[int, int]) -> tuple[int, ...]:
        """Every rank's batch at ``position`` = ``(pass, micro-step)``: the last switch at or before it."""
        chosen = self._schedule[0][1]
        for start, batches in self._schedule:
            if start <= position:
                chosen = batches
        return chosen

    def next_boundary(self) -> tuple[int, int]:
        """The first optimizer-step boundary this rank has not yielded yet: where a switch may start."""
        this_pass, step = self._cursor
        step = -(-step // self.accumulate) * self.accumulate  # round up to a whole optimizer step
        if step >= self._steps_per_epoch:
            return (this_pass + 1, 0)
        return (this_pass, step)

    def switch_batches(self, batches: Sequence[int], at: tuple[int, int]) -> None:
        """Use ``batches`` from position ``at`` on (``at`` from :meth:`next_boundary`, the same on all ranks).

        Raises:
            ConfigError: a split of another length or sum (the global step must keep its ``B`` samples),
                a batch below 1, or a position already yielded or not on an optimizer-step boundary.
        """
        new = tuple(positive_int(b, f"batches[{i}]") for i, b in enumerate(batches))
        if len(new) != self.world_size or sum(new) != self.step_batch:
            raise ConfigError(
                f"switch to batches {list(new)}: a re-balanced split must keep {self.world_size} ranks and the "
                f"step batch {self.step_batch} (sum {sum(new)})"
            )
        at = (int(at[0]), int(at[1]))
        if at < self._cursor or at[1] % self.accumulate:
            raise ConfigError(
                f"switch at position {at}: this rank has already yielded up to {self._cursor}, or the position "
                f"is not an optimizer-step boundary (accumulate {self.accumulate}); use next_boundary()"
            )
        self._schedule = [entry for entry in self._schedule if entry[0] < at] + [(at, new)]
        self.batches = new

    def take_split(self) -> tuple[int, ...]:
        """The split of the oldest list yielded and not yet taken: the micro-step the loop is working on.

        The DataLoader returns lists in the order the sampler yields them (however far it prefetches), so
        calling this once per micro-step drawn keeps the two in step.

        Raises:
            ConfigError: more takes than lists yielded in this pass.
        """
        if not self._yielded:
            raise ConfigError(
                "take_split() called with no yielded batch pending: call it once per micro-step drawn from a "
                "DataLoader over this sampler (Rebalancer.compute() does)"
            )
        return self._yielded.popleft()

    def __len__(self) -> int:
        """Steps per epoch: the same on every rank."""
        return self._steps_per_epoch

    def __repr__(self) -> str:
        return (
            f"PlannedBatchSampler(rank={self.rank}, batches={list(self.batches)}, dataset_size={self.dataset_size}, "
            f"steps_per_epoch={len(self)}, shuffle={self.shuffle}, seed={self.seed}, drop_last={self.drop_last}, "
            f"accumulate={self.accumulate}, epoch={self.epoch})"
        )
