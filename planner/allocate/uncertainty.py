"""How the balance of an allocation holds up when the step-time model is off.

A plan splits the batch by predicted speed; the GPUs then run at their real speed. Each GPU type's real step
time is its predicted one times an error factor shared by every rank of that type (the model's error is
systematic per type, not per rank). :func:`balance_efficiency_range` evaluates the allocation's balance
efficiency (throughput / the bound where every GPU runs alone at its cap, as ``Allocation``) with every type
at ``exp(±log_sigma)`` of its predicted time — all sign combinations for up to ``MAX_ENUMERATED_TYPES``
uncertain types, else each type alone slow or fast against the rest — and returns the lowest and highest.
Pure numpy.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

MAX_ENUMERATED_TYPES = 10
"""up to 2^10 = 1024 sign combinations; beyond, the one-type-off-against-the-rest corners"""


def _efficiency(t0, t1, cap, batches, included, factor, sync_per_step_s: float = 0.0) -> float:
    time = (t0 + t1 * batches) * factor
    step_time = float(time[included].max()) + sync_per_step_s
    throughput = float(batches[included].sum()) / step_time
    bound = float(np.sum(cap[included] / ((t0[included] + t1[included] * cap[included]) * factor[included])))
    return min(1.0, throughput / bound) if bound > 0 else 0.0


def _patterns(n_types: int):
    if n_types <= MAX_ENUMERATED_TYPES:
        yield from itertools.product((-1.0, 1.0), repeat=n_types)
        return
    for j in range(n_types):
        for sign in (-1.0, 1.0):
            pattern = [-sign] * n_types
            pattern[j] = sign
            yield tuple(pattern)


def balance_efficiency_range(
    t0: Sequence[float],
    t1: Sequence[float],
    cap: Sequence[int],
    batches: Sequence[int],
    included: Sequence[bool],
    log_sigma: Sequence[float],
    groups: Sequence[str],
    *,
    sync_s: float = 0.0,
    accumulate: int = 1,
) -> tuple[float, float]:
    """(lowest, highest) balance efficiency of the allocation ``batches`` when each group's (GPU type's) real
    step time is ``exp(±log_sigma)`` times the predicted one. ``cap``: each rank's largest batch (what the
    bound runs at), ``t0 + t1·b``: its predicted step time, ``log_sigma``: its model's log uncertainty;
    ``sync_s``: the exposed synchronisation per optimizer step of ``accumulate`` micro-steps (held fixed)."""
    per_step = sync_s / accumulate
    t0a, t1a = np.asarray(t0, dtype=np.float64), np.asarray(t1, dtype=np.float64)
    capa, ba = np.asarray(cap, dtype=np.float64), np.asarray(batches, dtype=np.float64)
    inc, sig = np.asarray(included, dtype=bool), np.asarray(log_sigma, dtype=np.float64)
    labels = np.asarray([str(g) for g in groups])
    uncertain = sorted({g for g, s, i in zip(labels, sig, inc, strict=True) if s > 0 and i})
    nominal = _efficiency(t0a, t1a, capa, ba, inc, np.ones_like(t0a), per_step)
    low = high = nominal
    for pattern in _patterns(len(uncertain)):
        factor = np.ones_like(t0a)
        for sign, group in zip(pattern, uncertain, strict=True):
            factor[labels == group] = np.exp(sign * sig[labels == group])
        eff = _efficiency(t0a, t1a, capa, ba, inc, factor, per_step)
        low, high = min(low, eff), max(high, eff)
    return low, high


def step_time_range_s(
    rank_step_time_s: Sequence[float],
    log_sigma: Sequence[float],
    *,
    accumulate: int = 1,
    sync_range_s: Sequence[float] = (0.0, 0.0),
) -> tuple[float, float]:
    """(lowest, highest) time of one optimizer step when each rank's predicted (micro-)step time
    ``rank_step_time_s`` is ``exp(∓log_sigma)`` off: ``accumulate · max_i t_i·exp(∓σ_i)`` plus the exposed
    synchronisation's low and high (``sync_range_s``: the plan's ``comm.exposed_range_s``, full overlap to
    none). The slowest rank's time grows with every rank's, so the extremes are every type fast, every type
    slow; the synchronisation is held at its range (not re-timed against the shifted compute)."""
    times = np.asarray(rank_step_time_s, dtype=np.float64)
    sig = np.asarray(log_sigma, dtype=np.float64)
    low = accumulate * float(np.max(times * np.exp(-sig))) + float(sync_range_s[0])
    high = accumulate * float(np.max(times * np.exp(sig))) + float(sync_range_s[1])
    return low, high
