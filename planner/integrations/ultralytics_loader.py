"""The train loader of one planned rank in Ultralytics: its slice of every global batch
(``planner.runtime.PlannedBatchSampler``) inside Ultralytics' own ``InfiniteDataLoader``, so that its
persistent workers, ``reset()`` at ``close_mosaic`` and ``close()`` work as in any Ultralytics run.

Ultralytics' DDP loader is a ``DistributedSampler`` (every rank ``N / W`` images) cut into equal batches; with
uneven per-rank batches the ranks would then run different numbers of steps and DDP would hang. Here every
rank walks the same permutation in global steps of ``B = Σ b_i`` images and takes its planned slice, so every
rank runs the same number of steps and each image of the epoch is used once (the last step of an epoch is
completed from the start of the epoch's order, as ``DistributedSampler`` pads, unless ``drop_last``).

The permutation of the ``k``-th pass over the loader is seeded with ``seed + first_epoch + k`` on every rank,
whatever ``set_epoch`` the trainer calls when: an ``InfiniteDataLoader`` with workers starts the next pass
while prefetching, before the trainer's ``sampler.set_epoch`` for that epoch, and how far it runs ahead depends
on the rank's number of workers, which Ultralytics sizes from the rank's batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from planner.runtime.sampler import PlannedBatchSampler


class _EpochBatches:
    """The batch sampler the loader repeats: one ``PlannedBatchSampler`` pass per epoch, the epoch counted by
    passes (see the module docstring)."""

    def __init__(self, planned: PlannedBatchSampler) -> None:
        self.planned = planned
        self.first_epoch: int | None = None
        self.passes = 0

    def __iter__(self) -> Iterator[list[int]]:
        if self.first_epoch is None:
            self.first_epoch = 0
        self.planned.set_epoch(self.first_epoch + self.passes)
        self.passes += 1
        return iter(self.planned)

    def __len__(self) -> int:
        """Steps per epoch: the same on every rank."""
        return len(self.planned)


class _SamplerView:
    """What the trainer sees as ``train_loader.sampler``: ``set_epoch`` (the first call fixes the epoch of the
    first pass, for a resumed run) and the number of images this rank takes per epoch."""

    def __init__(self, batches: _EpochBatches) -> None:
        self._batches = batches

    def set_epoch(self, epoch: int) -> None:
        if self._batches.first_epoch is None:
            self._batches.first_epoch = int(epoch)

    def __len__(self) -> int:
        planned = self._batches.planned
        return len(planned) * planned.rank_batch


def planned_train_loader(
    loader: Any, batches: Sequence[int], rank: int, *, seed: int, drop_last: bool
) -> Any:
    """An ``InfiniteDataLoader`` over ``loader``'s dataset giving ``rank`` its slice of every global batch.

    Args:
        loader: the train loader the task's trainer built for this rank (not iterated yet: its workers have
            not started); its dataset, workers, collate function and seeds are kept, its sampler is not.
        batches: every rank's batch per step, in rank order.
        seed: the shuffle seed, the same on every rank (Ultralytics' ``args.seed``).
        drop_last: drop the images that do not fill a last global step instead of completing it.
    """
    from ultralytics.data.build import InfiniteDataLoader

    planned = PlannedBatchSampler(
        len(loader.dataset), batches, rank, shuffle=True, seed=seed, drop_last=drop_last
    )
    epoch_batches = _EpochBatches(planned)
    options: dict[str, Any] = {
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "collate_fn": loader.collate_fn,
        "worker_init_fn": loader.worker_init_fn,
        "generator": loader.generator,
    }
    if loader.num_workers > 0:
        options["prefetch_factor"] = loader.prefetch_factor
    if getattr(loader, "pin_memory_device", ""):
        options["pin_memory_device"] = loader.pin_memory_device
    planned_loader = InfiniteDataLoader(loader.dataset, batch_sampler=epoch_batches, **options)
    # what the trainer reads from a loader (DataLoader refuses these after __init__; InfiniteDataLoader sets its
    # own batch_sampler the same way): its batch, whether it drops the last one, the sampler it sets epochs on
    object.__setattr__(planned_loader, "batch_size", planned.rank_batch)
    object.__setattr__(planned_loader, "drop_last", bool(drop_last))
    object.__setattr__(planned_loader, "sampler", _SamplerView(epoch_batches))
    return planned_loader
