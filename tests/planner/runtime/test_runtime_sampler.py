"""planner.runtime.sampler: every global step split into the planned per-rank slices, same step count on
every rank, each epoch's indices covered exactly once (pure: no processes)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset

from planner.errors import ConfigError
from planner.runtime.rank_plan import RankPlan
from planner.runtime.sampler import PlannedBatchSampler

BATCHES = (5, 3, 8)


def samplers(dataset_size, batches=BATCHES, **kwargs):
    return [PlannedBatchSampler(dataset_size, batches, rank, **kwargs) for rank in range(len(batches))]


def test_each_rank_gets_its_planned_batch_every_step_and_the_same_number_of_steps():
    all_ranks = samplers(50)  # 50 // 16 = 3 steps, 2 samples dropped
    for sampler, batch in zip(all_ranks, BATCHES, strict=True):
        steps = list(sampler)
        assert len(sampler) == 3
        assert len(steps) == 3
        assert [len(s) for s in steps] == [batch] * 3


def test_drop_last_covers_each_epoch_index_exactly_once_except_the_remainder():
    all_ranks = samplers(50, seed=3)
    for epoch in (0, 1):
        for sampler in all_ranks:
            sampler.set_epoch(epoch)
        used = [i for sampler in all_ranks for step in sampler for i in step]
        counts = Counter(used)
        assert len(used) == 48
        assert set(counts.values()) == {1}
        assert set(counts) <= set(range(50))
        assert len(set(range(50)) - set(counts)) == 50 - 48


def test_a_global_step_is_the_next_step_batch_indices_of_the_permutation_in_rank_order():
    all_ranks = samplers(50, seed=7)
    order = all_ranks[0].epoch_order()
    per_rank_steps = [list(s) for s in all_ranks]
    for step in range(3):
        joined = [i for rank_steps in per_rank_steps for i in rank_steps[step]]
        assert joined == order[step * 16 : (step + 1) * 16]


def test_ranks_draw_the_same_permutation_without_communication():
    orders = {tuple(s.epoch_order()) for s in samplers(64, seed=11)}
    assert len(orders) == 1


def test_permutation_changes_with_epoch_and_seed_and_is_reproducible():
    sampler = PlannedBatchSampler(64, BATCHES, 0, seed=1)
    first = list(sampler)
    assert list(sampler) == first
    sampler.set_epoch(1)
    second = list(sampler)
    assert second != first
    assert list(PlannedBatchSampler(64, BATCHES, 0, seed=2)) != first
    again = PlannedBatchSampler(64, BATCHES, 0, seed=1)
    again.set_epoch(1)
    assert list(again) == second


def test_shuffle_false_walks_the_dataset_in_order():
    assert list(PlannedBatchSampler(32, BATCHES, 1, shuffle=False)) == [[5, 6, 7], [21, 22, 23]]
    assert list(PlannedBatchSampler(32, BATCHES, 2, shuffle=False)) == [
        list(range(8, 16)),
        list(range(24, 32)),
    ]


def test_without_drop_last_the_tail_is_padded_by_wrapping_so_every_rank_keeps_its_batch():
    all_ranks = samplers(50, shuffle=False, drop_last=False)  # ceil(50/16) = 4 steps, 14 padded indices
    for sampler, batch in zip(all_ranks, BATCHES, strict=True):
        assert len(sampler) == 4
        assert [len(s) for s in sampler] == [batch] * 4
    used = Counter(i for sampler in all_ranks for step in sampler for i in step)
    assert set(used) == set(range(50))  # nothing dropped
    assert sum(used.values()) == 64
    assert sorted(i for i, n in used.items() if n == 2) == list(range(14))  # the wrap re-uses the start
    assert all_ranks[0].samples_per_epoch == 64


def test_without_drop_last_an_exact_multiple_is_not_padded():
    all_ranks = samplers(48, drop_last=False)
    used = Counter(i for sampler in all_ranks for step in sampler for i in step)
    assert len(all_ranks[0]) == 3
    assert set(used.values()) == {1}
    assert set(used) == set(range(48))


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=5),
    extra=st.integers(min_value=0, max_value=40),
    drop_last=st.booleans(),
    accumulate=st.integers(min_value=1, max_value=3),
    epoch=st.integers(min_value=0, max_value=3),
)
def test_coverage_and_equal_step_counts_hold_for_any_plan(batches, extra, drop_last, accumulate, epoch):
    step_batch = sum(batches)
    dataset_size = step_batch * accumulate + extra
    all_ranks = samplers(dataset_size, batches, drop_last=drop_last, accumulate=accumulate, seed=5)
    for sampler in all_ranks:
        sampler.set_epoch(epoch)
    steps = {len(s) for s in all_ranks}
    assert len(steps) == 1
    (num_steps,) = steps
    assert num_steps % accumulate == 0
    used = Counter(i for sampler in all_ranks for step in sampler for i in step)
    assert sum(used.values()) == num_steps * step_batch
    assert set(used) <= set(range(dataset_size))
    if drop_last:
        assert set(used.values()) == {1}
        assert dataset_size - len(used) < step_batch * accumulate
    else:
        assert set(used) == set(range(dataset_size))
        assert max(used.values()) <= 2
        assert num_steps * step_batch - dataset_size < step_batch * accumulate


def test_accumulate_makes_the_epoch_a_whole_number_of_optimizer_steps():
    # 100 samples, 16 per micro-step, 3 micro-steps per optimizer step: 2 optimizer steps = 6 micro-steps
    assert len(PlannedBatchSampler(100, BATCHES, 0, accumulate=3)) == 6
    assert len(PlannedBatchSampler(100, BATCHES, 0, accumulate=3, drop_last=False)) == 9


def test_works_as_a_dataloader_batch_sampler():
    data = torch.arange(40, dtype=torch.float64).unsqueeze(1)
    sampler = PlannedBatchSampler(40, BATCHES, 2, shuffle=False)
    loader = DataLoader(TensorDataset(data), batch_sampler=sampler)
    batches = [x.squeeze(1).tolist() for (x,) in loader]
    assert batches == [[float(i) for i in range(8, 16)], [float(i) for i in range(24, 32)]]
    assert len(loader) == 2


def test_from_plan_takes_batches_rank_and_accumulate_from_the_rank_plan():
    plan = RankPlan(
        rank=1,
        world_size=3,
        local_rank=1,
        node_rank=0,
        batch=3,
        loss_weight=9 / 16,
        step_batch=16,
        global_batch=32,
        accumulate=2,
        device_index=1,
        gpu="T4",
        batches=BATCHES,
    )
    sampler = PlannedBatchSampler.from_plan(plan, 100, seed=4)
    assert (sampler.rank, sampler.batches, sampler.accumulate) == (1, BATCHES, 2)
    assert (sampler.rank_batch, sampler.offset, sampler.step_batch, sampler.world_size) == (3, 5, 16, 3)
    assert len(sampler) == 6  # 100 // 32 = 3 optimizer steps of 2 micro-steps
    assert sampler.seed == 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"dataset_size": 50, "batches": BATCHES, "rank": 3},
            r"rank 3 is out of range for 3 ranks \(expected 0\.\.2\)",
        ),
        ({"dataset_size": 50, "batches": BATCHES, "rank": -1}, "rank -1 is out of range"),
        (
            {"dataset_size": 50, "batches": (5, 0, 8), "rank": 0},
            r"batches\[1\] must be a positive integer, got 0",
        ),
        (
            {"dataset_size": 50, "batches": (5, -3, 8), "rank": 0},
            r"batches\[1\] must be a positive integer, got -3",
        ),
        ({"dataset_size": 50, "batches": (), "rank": 0}, "batches is empty"),
        (
            {"dataset_size": 15, "batches": BATCHES, "rank": 0},
            r"the dataset has 15 samples, fewer than one global batch of 16 samples \(batches \[5, 3, 8\]\)",
        ),
        (
            {"dataset_size": 20, "batches": BATCHES, "rank": 0, "accumulate": 2},
            r"fewer than one optimizer step \(2 micro-steps\) of 32 samples",
        ),
        (
            {"dataset_size": 0, "batches": BATCHES, "rank": 0},
            "dataset_size must be a positive integer, got 0",
        ),
        (
            {"dataset_size": 50, "batches": BATCHES, "rank": 0, "accumulate": 0},
            "accumulate must be a positive",
        ),
    ],
)
def test_invalid_arguments_raise_config_error(kwargs, message):
    kwargs = dict(kwargs)
    with pytest.raises(ConfigError, match=message):
        PlannedBatchSampler(kwargs.pop("dataset_size"), kwargs.pop("batches"), kwargs.pop("rank"), **kwargs)


def test_dataset_of_exactly_one_global_batch_gives_one_step():
    all_ranks = samplers(16)
    assert [len(s) for s in all_ranks] == [1, 1, 1]
    assert sorted(i for s in all_ranks for step in s for i in step) == list(range(16))


def test_numpy_integer_rank_is_accepted_and_bool_is_not():
    import numpy as np

    assert PlannedBatchSampler(32, BATCHES, np.int64(2)).rank == 2
    with pytest.raises(ConfigError, match="rank True is out of range"):
        PlannedBatchSampler(32, BATCHES, True)
