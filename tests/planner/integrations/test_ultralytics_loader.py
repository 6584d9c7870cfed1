"""planner.integrations.ultralytics_loader: Ultralytics' InfiniteDataLoader over the planned slices, with what
the trainer reads from it (batch, length, sampler.set_epoch), the same steps on every rank, every image of an
epoch used (the last step completed from the epoch's start), and the epoch's order counted by passes."""

from __future__ import annotations

import math

import pytest

from tests.planner.integrations.ultralytics_helpers import require_ultralytics

pytestmark = pytest.mark.ultralytics

BATCHES = (2, 3, 5)
IMAGES = 23


def _loaders(drop_last: bool = False) -> list:
    require_ultralytics()
    import torch
    from torch.utils.data import TensorDataset
    from ultralytics.data.build import build_dataloader

    from planner.integrations.ultralytics_loader import planned_train_loader

    dataset = TensorDataset(torch.arange(IMAGES))
    return [
        planned_train_loader(
            build_dataloader(dataset, batch=b, workers=0, shuffle=True, rank=-1),
            BATCHES,
            rank,
            seed=0,
            drop_last=drop_last,
        )
        for rank, b in enumerate(BATCHES)
    ]


def _epoch(loader) -> list[list[int]]:
    return [batch[0].tolist() for batch in loader]


def test_each_rank_reads_as_a_trainer_expects():
    steps = math.ceil(IMAGES / sum(BATCHES))
    for loader, batch in zip(_loaders(), BATCHES, strict=True):
        assert type(loader).__name__ == "InfiniteDataLoader"
        assert loader.batch_size == batch and len(loader) == steps and len(loader.sampler) == steps * batch
        assert loader.drop_last is False


def test_every_image_of_each_epoch_is_used_and_the_ranks_take_disjoint_slices():
    loaders = _loaders()
    for epoch in range(2):
        for loader in loaders:
            loader.sampler.set_epoch(epoch)
        epochs = [_epoch(loader) for loader in loaders]
        for rank, batches in enumerate(epochs):
            assert [len(b) for b in batches] == [BATCHES[rank]] * 3
        taken = [i for batches in epochs for b in batches for i in b]
        assert set(taken) == set(range(IMAGES)) and len(taken) == 30  # 7 completed from the epoch's start
        for step in range(3):
            in_step = [i for batches in epochs for i in batches[step]]
            assert len(set(in_step)) == len(in_step)


def test_the_order_follows_the_passes_whatever_set_epoch_says_later():
    # an InfiniteDataLoader with workers starts its next pass before the trainer's set_epoch for it: the first
    # set_epoch (a resumed run's start) fixes the first pass, the passes count from there
    started_at_4 = _loaders()[1]
    started_at_4.sampler.set_epoch(4)
    fourth = _epoch(started_at_4)
    started_at_4.sampler.set_epoch(9)
    fifth = _epoch(started_at_4)
    started_at_5 = _loaders()[1]
    started_at_5.sampler.set_epoch(5)
    assert fifth == _epoch(started_at_5) and fifth != fourth
