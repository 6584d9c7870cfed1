"""The allocator with a synchronisation term: its optimum against brute force, the figures it reports, and
options (subsets) priced with their own synchronisation."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.allocate.allocation import allocate


def _brute_throughput(cap, t0, t1, sync_s, lo=1):
    best = 0.0
    for b in itertools.product(*[range(lo, c + 1) for c in cap]):
        t = max(a + s * x for a, s, x in zip(t0, t1, b, strict=True))
        best = max(best, sum(b) / (t + sync_s))
    return best


def _brute_global(cap, t0, t1, sync_s, global_batch):
    """Least time per global batch: a·max t + C over every accumulation and split."""
    best = np.inf
    for a in range(1, global_batch + 1):
        if global_batch % a:
            continue
        q = global_batch // a
        for b in itertools.product(*[range(1, c + 1) for c in cap]):
            if sum(b) == q:
                best = min(best, a * max(x0 + s * x for x0, s, x in zip(t0, t1, b, strict=True)) + sync_s)
    return best


ranks = st.integers(min_value=2, max_value=3)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), n=ranks, sync_s=st.sampled_from([0.0, 0.01, 0.1, 1.0]))
def test_balanced_throughput_with_a_constant_sync_term_is_the_brute_force_optimum(data, n, sync_s):
    cap = data.draw(st.lists(st.integers(1, 9), min_size=n, max_size=n))
    t0 = data.draw(st.lists(st.floats(0.0, 0.05), min_size=n, max_size=n))
    t1 = data.draw(st.lists(st.floats(0.001, 0.05), min_size=n, max_size=n))
    alloc = allocate(cap, t0, t1, sync=lambda _ranks, _t: sync_s)
    assert alloc.throughput_samples_per_s >= _brute_throughput(cap, t0, t1, sync_s) / (1 + 1e-3) - 1e-9
    assert alloc.sync_time_s == sync_s
    assert alloc.step_time_s == pytest.approx(alloc.compute_time_s + sync_s)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), n=ranks, sync_s=st.sampled_from([0.0, 0.05, 0.5]))
def test_global_batch_time_with_a_constant_sync_term_is_the_brute_force_optimum(data, n, sync_s):
    cap = data.draw(st.lists(st.integers(1, 6), min_size=n, max_size=n))
    t0 = data.draw(st.lists(st.floats(0.0, 0.05), min_size=n, max_size=n))
    t1 = data.draw(st.lists(st.floats(0.001, 0.05), min_size=n, max_size=n))
    global_batch = data.draw(st.integers(n, 3 * sum(cap)))
    brute = _brute_global(cap, t0, t1, sync_s, global_batch)
    if not np.isfinite(brute):
        return
    alloc = allocate(cap, t0, t1, global_batch=global_batch, sync=lambda _ranks, _t: sync_s)
    per_global = alloc.accumulate * alloc.step_time_s
    assert per_global == pytest.approx(alloc.accumulate * alloc.compute_time_s + sync_s)
    assert per_global <= brute * (1 + 1e-9)


def test_sync_moves_the_throughput_optimum_towards_bigger_steps():
    # a slow rank that should be kept small without sync; with a large sync every sample counts
    cap, t0, t1 = [100, 100], [0.0, 0.0], [0.001, 0.01]
    plain = allocate(cap, t0, t1)
    synced = allocate(cap, t0, t1, sync=lambda _r, _t: 1.0)
    assert synced.step_batch > plain.step_batch
    assert synced.throughput_samples_per_s == pytest.approx(synced.step_batch / (synced.compute_time_s + 1.0))


def test_options_are_priced_with_the_sync_of_their_own_ranks():
    # two fast ranks and one slow one behind a slow link: the sync model charges 1 s whenever rank 2 takes part
    cap, t0, t1 = [64, 64, 64], [0.01, 0.01, 0.01], [0.001, 0.001, 0.002]
    labels = ["A", "A", "B"]

    def sync(included, _compute_s):
        return 1.0 if 2 in set(np.asarray(included).tolist()) else 0.01

    alloc = allocate(cap, t0, t1, global_batch=128, groups=labels, sync=sync)
    assert alloc.sync_time_s == 1.0
    assert alloc.alternatives["best_group_subset"] > 5 * alloc.throughput_samples_per_s
    assert any("dropping the 1 B rank" in a for a in alloc.advice)


def test_sync_evaluated_at_the_final_compute_time():
    seen = []

    def sync(_included, compute_s):
        seen.append(compute_s)
        return 0.5 * compute_s

    alloc = allocate([10, 10], [0.01, 0.02], [0.001, 0.002], global_batch=12, sync=sync)
    assert alloc.sync_time_s == pytest.approx(0.5 * alloc.compute_time_s)
