"""PlannedBatchSampler.switch_batches: the split moves between optimizer steps, the epoch does not.

Every sample of an epoch once, the same number of steps on every rank, across any number of switches,
with lazy iteration and with a prefetching DataLoader (worker processes)."""

from __future__ import annotations

import random

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from planner.errors import ConfigError
from planner.runtime.sampler import PlannedBatchSampler

WORLD = 3
B = 16


def samplers(batches=(5, 3, 8), size=100, accumulate=1, seed=3):
    return [PlannedBatchSampler(size, batches, r, seed=seed, accumulate=accumulate) for r in range(WORLD)]


def test_switch_between_steps_keeps_every_sample_of_the_epoch_exactly_once():
    group = samplers()
    iterators = [iter(s) for s in group]
    taken: list[list[int]] = [[] for _ in range(WORLD)]
    steps = 0
    splits = [(5, 3, 8), (8, 4, 4), (1, 14, 1), (6, 6, 4)]
    for step in range(len(group[0])):
        if step in (1, 3, 4):
            new = splits[(1, 3, 4).index(step) + 1]
            at = max(s.next_boundary() for s in group)
            for s in group:
                s.switch_batches(new, at)
        lists = [next(it) for it in iterators]
        for r, indices in enumerate(lists):
            taken[r].append(indices)
        assert sum(len(x) for x in lists) == B
        assert [s.take_split() for s in group] == [group[0].batches_at((0, step))] * WORLD
        steps += 1
    for it in iterators:
        assert next(it, None) is None  # the same number of steps on every rank
    order = group[0].epoch_order()
    joined = [i for step in range(steps) for r in range(WORLD) for i in taken[r][step]]
    assert joined == order and len(set(joined)) == len(joined)
    assert [len(taken[0][s]) for s in range(steps)] == [5, 8, 8, 1, 6, 6]


def test_random_switches_with_accumulation_land_on_optimizer_step_boundaries():
    rng = random.Random(0)
    group = samplers(size=200, accumulate=2)
    iterators = [iter(s) for s in group]
    lists_by_rank: list[list[list[int]]] = [[] for _ in range(WORLD)]
    for _step in range(len(group[0])):
        if rng.random() < 0.5:
            cut = sorted(rng.sample(range(1, B), WORLD - 1))
            new = (cut[0], cut[1] - cut[0], B - cut[1])
            at = max(s.next_boundary() for s in group)
            assert at[1] % 2 == 0
            for s in group:
                s.switch_batches(new, at)
        for r, it in enumerate(iterators):
            lists_by_rank[r].append(next(it))
    order = group[0].epoch_order()
    joined = [i for step in range(len(group[0])) for r in range(WORLD) for i in lists_by_rank[r][step]]
    assert joined == order
    # both micro-steps of an optimizer step use one split
    for step in range(0, len(group[0]), 2):
        assert len(lists_by_rank[0][step]) == len(lists_by_rank[0][step + 1])


def test_a_switch_applies_to_the_next_pass_when_this_one_is_exhausted_and_is_kept_afterwards():
    sampler = PlannedBatchSampler(32, (5, 3, 8), 0, seed=0)
    assert [len(x) for x in sampler] == [5, 5]
    assert sampler.next_boundary() == (1, 0)
    sampler.switch_batches((8, 4, 4), sampler.next_boundary())
    sampler.set_epoch(1)
    assert [len(x) for x in sampler] == [8, 8]
    sampler.set_epoch(2)
    assert [len(x) for x in sampler] == [8, 8]


def test_switching_a_position_already_yielded_or_changing_the_step_batch_is_refused():
    sampler = PlannedBatchSampler(64, (5, 3, 8), 1, seed=0, accumulate=2)
    iterator = iter(sampler)
    next(iterator)
    with pytest.raises(ConfigError, match="already yielded"):
        sampler.switch_batches((8, 4, 4), (0, 0))
    with pytest.raises(ConfigError, match="optimizer-step boundary"):
        sampler.switch_batches((8, 4, 4), (0, 3))
    with pytest.raises(ConfigError, match="step batch 16"):
        sampler.switch_batches((8, 4, 5), (0, 2))
    with pytest.raises(ConfigError, match="positive integer"):
        sampler.switch_batches((16, 0, 0), (0, 2))
    assert sampler.next_boundary() == (0, 2)


def test_take_split_without_a_pending_list_says_how_to_use_it():
    with pytest.raises(ConfigError, match="once per micro-step"):
        PlannedBatchSampler(64, (5, 3, 8), 0).take_split()


def test_a_prefetching_dataloader_with_workers_never_mixes_splits_within_a_step():
    size = 160
    data = TensorDataset(torch.arange(size))
    group = samplers(size=size, seed=5)
    loaders = [DataLoader(data, batch_sampler=s, num_workers=1, prefetch_factor=3) for s in group]
    iterators = [iter(loader) for loader in loaders]
    joined: list[int] = []
    for step in range(len(group[0])):
        batches = [next(it)[0].tolist() for it in iterators]
        splits = [s.take_split() for s in group]
        assert [len(b) for b in batches] == list(splits[0])
        joined.extend(i for b in batches for i in b)
        if step == 2:
            at = max(s.next_boundary() for s in group)
            assert at[1] > 3  # the workers have already taken index lists beyond the next step
            for s in group:
                s.switch_batches((2, 2, 12), at)
    assert joined == group[0].epoch_order()
    assert [len(x) for x in [*group[0]]][-1] == 2
