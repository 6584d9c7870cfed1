"""``allocate``: per-rank batch sizes and the figures of a plan, from each rank's cap and step time.

It checks the input, solves the split with ``planner.allocate.solver`` and asks ``planner.allocate.advice``
for the options it compares; the modes and algorithms are described in ``planner.allocate.solver``.
Pure numpy: no torch, no Ray.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from planner.allocate.advice import NOTE_KINDS, Advice, AdviceKind, Option, advise
from planner.allocate.solver import MAX_GLOBAL_BATCH, SyncModel, make_rows, split_with_sync
from planner.errors import ConfigError, InfeasiblePlanError
from planner.job import MODES, Mode

__all__ = ["Allocation", "allocate"]


@dataclass(frozen=True, kw_only=True, eq=False)
class Allocation:
    """Per-rank batches and the figures of one allocation (arrays are indexed by input rank)."""

    batches: np.ndarray
    """int64 per rank: samples per step (micro-step when accumulating); 0 for excluded ranks."""
    included: np.ndarray
    """bool per rank: the rank takes part (its cap reaches the minimum batch)."""
    excluded_reasons: dict[int, str]
    """Rank index → why it was left out."""
    accumulate: int
    """Gradient accumulation steps per optimizer step (1 without a global batch)."""
    step_batch: int
    """Σ batches: samples of one (micro-)step over all ranks."""
    global_batch: int
    """step_batch · accumulate: samples per optimizer step."""
    step_time_s: float
    """Predicted time of one (micro-)step: compute_time_s + sync_time_s / accumulate (the synchronisation,
    paid once per optimizer step, spread over its micro-steps), so that accumulate · step_time_s is the
    time of one optimizer step."""
    compute_time_s: float
    """max over included ranks of t_i(b_i): one micro-step's compute, the slowest rank's."""
    sync_time_s: float
    """Exposed gradient synchronisation per optimizer step (0 without a ``sync`` model or for one rank)."""
    rank_step_time_s: np.ndarray
    """float64 per rank: t_i(b_i) = t0_i + t1_i·b_i; 0 for excluded ranks."""
    throughput_samples_per_s: float
    """step_batch / step_time_s = global_batch / (accumulate · compute_time_s + sync_time_s)."""
    balance_efficiency: float
    """throughput / Σ_i c_i / t_i(c_i) over included ranks (c_i rounded down to multiple_of): the share of
    the bound where every GPU runs alone at its cap (≤ 1)."""
    idle_fraction: np.ndarray
    """float64 per rank: 1 − t_i(b_i) / compute_time_s, the share of a step's compute the rank waits for the
    slowest; 0 for excluded."""
    mode: str
    """The mode that produced ``batches``."""
    advice: tuple[Advice, ...]
    """Warnings: sentences saying when another mode or a subset of the GPUs would be faster, by how much, and
    which ranks to drop (only for a speed-up of at least ``ADVICE_MIN_SPEEDUP``)."""
    notes: tuple[Advice, ...]
    """Information, not warnings (``planner.allocate.advice.NOTE_KINDS``): how much faster this allocation
    is than plain DDP (``uniform``), why an option could not be compared, what the balance efficiency means
    when no rank waits."""
    alternatives: dict[str, float]
    """Throughput in samples/s of the options compared (at the same global batch when one is given, i.e.
    global batch / time per global batch, each at its fastest accumulation). Keys: ``uniform``, ``max``,
    ``balanced`` (all ranks in that mode); with two or more groups also ``best_group_subset`` (the best of: the fastest group alone, the
    two fastest, ... short of all; groups ranked by cap / t(cap) per rank) and ``best_single_group`` (the
    best one group alone), both in this allocation's mode. An option that cannot reach the global batch is
    left out."""


def _as_1d(name: str, values: ArrayLike, n: int | None) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1 or (n is not None and len(arr) != n):
        raise ConfigError(
            f"{name} must be a 1-D sequence with one value per rank"
            + (f" ({n} ranks), got shape {arr.shape}" if n is not None else f", got shape {arr.shape}")
        )
    return arr


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ConfigError(f"{name} must be an integer ≥ {minimum}, got {value!r}")
    return int(value)


def _exclusion_reason(cap: int, k: int, lo_batch: int, min_batch: int) -> str:
    # lo_batch is a multiple of k, so cap < lo_batch exactly when the cap rounded down to k is too small.
    fits = "does not fit a single sample" if cap == 0 else f"fits at most {cap} samples"
    minimum = f"minimum batch {lo_batch}"
    if lo_batch != min_batch:
        minimum += f" (min_batch {min_batch} rounded up to a multiple of {k})"
    elif k > 1:
        minimum += f" (multiple of {k})"
    return f"{fits} < {minimum}"


def _checked_rank_arrays(
    max_batch: ArrayLike, time_intercept_s: ArrayLike, time_per_sample_s: ArrayLike
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The per-rank caps (int64) and time coefficients (float64), checked: one value per rank, finite, ≥ 0,
    whole caps, no rank whose step takes no time."""
    cap = _as_1d("max_batch", max_batch, None)
    n = len(cap)
    if n == 0:
        raise ConfigError("max_batch is empty: there is no rank to allocate")
    t0 = _as_1d("time_intercept_s", time_intercept_s, n).astype(np.float64)
    t1 = _as_1d("time_per_sample_s", time_per_sample_s, n).astype(np.float64)
    whole_floats = np.issubdtype(cap.dtype, np.floating) and bool(
        np.all(np.isfinite(cap) & (cap == np.round(cap)))
    )
    if not (np.issubdtype(cap.dtype, np.integer) or whole_floats):
        raise ConfigError(f"max_batch must hold whole numbers of samples, got {cap.dtype} values")
    cap = cap.astype(np.int64)
    for name, arr in (("max_batch", cap), ("time_intercept_s", t0), ("time_per_sample_s", t1)):
        bad = np.nonzero(~np.isfinite(arr) | (arr < 0))[0]
        if len(bad):
            raise ConfigError(f"{name}[{bad[0]}] = {arr[bad[0]].item()!r}: must be finite and ≥ 0")
    zero = np.nonzero((t0 == 0) & (t1 == 0))[0]
    if len(zero):
        raise ConfigError(
            f"rank {zero[0]} has step time 0 at every batch (time_intercept_s and "
            "time_per_sample_s both 0): give it a measured or estimated step time"
        )
    return cap, t0, t1


def allocate(
    max_batch: ArrayLike,
    time_intercept_s: ArrayLike,
    time_per_sample_s: ArrayLike,
    *,
    mode: Mode = "balanced",
    global_batch: int | None = None,
    multiple_of: int = 1,
    min_batch: int = 1,
    groups: ArrayLike | None = None,
    accumulate: int | None = None,
    sync: SyncModel | None = None,
) -> Allocation:
    """Per-rank batches for one data-parallel step (see the module docstring for modes and algorithms).

    Args:
        max_batch: per rank, the largest batch that fits (int ≥ 0).
        time_intercept_s, time_per_sample_s: per rank, t_i(b) = t0_i + t1_i·b (≥ 0, not both 0).
        mode: ``balanced`` (default), ``max`` or ``uniform``.
        global_batch: samples per optimizer step; None to maximise throughput without accumulation.
        multiple_of: every batch is a multiple of this.
        min_batch: smallest batch a rank may take (rounded up to ``multiple_of``); smaller caps are excluded.
        groups: per rank, a label of its GPU type/profile for the advice; default: identical (cap, t0, t1),
            or identical (t0, t1) when that makes more than ``planner.allocate.advice._MAX_ADVICE_GROUPS`` (32) groups.
        accumulate: with ``global_batch``, use this accumulation (a running job re-splitting its step batch
            needs 1); default: the fastest valid one.
        sync: the exposed gradient synchronisation per optimizer step of a set of ranks at a compute time
            (``planner.allocate.solver.SyncModel``); None: none. Every option compared uses it too.

    Raises:
        ConfigError: malformed input (lengths, negative values, unknown mode).
        InfeasiblePlanError: no rank reaches the minimum batch, or the global batch cannot be split.
    """
    cap, t0, t1 = _checked_rank_arrays(max_batch, time_intercept_s, time_per_sample_s)
    n = len(cap)
    k, min_batch, global_batch = _checked_options(mode, multiple_of, min_batch, global_batch)
    labels = None if groups is None else _as_1d("groups", groups, n)

    cap_u = cap // k
    min_units, included, reasons = _included_ranks(cap, k, min_batch)
    rows = make_rows(np.nonzero(included)[0], t0, t1, cap_u, k, min_units)
    accumulate = None if accumulate is None else _check_int("accumulate", accumulate, 1)
    split = split_with_sync(
        rows, mode, k, global_batch, f"in mode '{mode}'", accumulate=accumulate, sync=sync
    )
    accumulate = split.accumulate
    batches = np.zeros(n, dtype=np.int64)
    batches[rows.ranks] = split.units * k
    rank_time = np.where(included, t0 + t1 * batches, 0.0)
    compute_time = float(rank_time[included].max())
    step_time = split.global_time_s / accumulate
    step_batch = int(batches.sum())
    throughput = step_batch / step_time
    cap_r = cap_u[included] * k
    idle = np.where(included, 1.0 - rank_time / compute_time, 0.0)
    current = Option(throughput, split.global_time_s, batches[rows.ranks], accumulate)
    alternatives, said = advise(rows, t0, t1, k, mode, global_batch, labels, current, sync)
    efficiency = _balance_efficiency(throughput, cap_r, t0[included], t1[included])
    sync_share = 1.0 - compute_time / step_time if step_time > 0 else 0.0
    said.extend(_efficiency_note(efficiency, idle[included], batches[included], cap_r, sync_share=sync_share))
    return Allocation(
        batches=batches,
        included=included,
        excluded_reasons=reasons,
        accumulate=accumulate,
        step_batch=step_batch,
        global_batch=step_batch * accumulate,
        step_time_s=step_time,
        compute_time_s=compute_time,
        sync_time_s=split.sync_s,
        rank_step_time_s=rank_time,
        throughput_samples_per_s=throughput,
        balance_efficiency=efficiency,
        idle_fraction=idle,
        mode=mode,
        advice=tuple(a for a in said if a.kind not in NOTE_KINDS),
        notes=tuple(a for a in said if a.kind in NOTE_KINDS),
        alternatives=alternatives,
    )


def _included_ranks(cap: np.ndarray, k: int, min_batch: int) -> tuple[int, np.ndarray, dict[int, str]]:
    """The fewest units of ``k`` samples a rank may take (``min_batch`` rounded up), which ranks' caps hold
    that many (a mask), and why each other rank is excluded.

    Raises:
        InfeasiblePlanError: no rank can run the minimum batch.
    """
    lo = -(-min_batch // k)  # minimum units per rank
    included = cap // k >= lo
    reasons = {int(i): _exclusion_reason(int(cap[i]), k, lo * k, min_batch) for i in np.nonzero(~included)[0]}
    if not included.any():
        best = int(np.argmax(cap))
        raise InfeasiblePlanError(
            f"no rank can run the minimum batch {lo * k}: the largest cap is {int(cap[best])} samples "
            f"(rank {best}); lower min_batch or multiple_of, free GPU memory, raise the memory fraction, or "
            "use a smaller model or input"
        )
    return lo, included, reasons


def _balance_efficiency(
    throughput_samples_per_s: float, cap: np.ndarray, t0: np.ndarray, t1: np.ndarray
) -> float:
    """The throughput over its bound, every rank running alone at its cap ``cap`` with no gradient
    synchronisation (t0, t1: those ranks' time coefficients); at most 1."""
    bound_samples_per_s = float(np.sum(cap / (t0 + t1 * cap)))
    return min(1.0, throughput_samples_per_s / bound_samples_per_s) if bound_samples_per_s > 0 else 0.0


def _checked_options(
    mode: str, multiple_of: int, min_batch: int, global_batch: int | None
) -> tuple[int, int, int | None]:
    """:func:`allocate`'s scalar options checked: (multiple_of, min_batch, global_batch)."""
    if mode not in MODES:
        raise ConfigError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    if global_batch is not None:
        global_batch = _check_int("global_batch", global_batch, 1)
        if global_batch > MAX_GLOBAL_BATCH:
            raise ConfigError(f"global_batch {global_batch} is above {MAX_GLOBAL_BATCH}; use a smaller one")
    return _check_int("multiple_of", multiple_of, 1), _check_int("min_batch", min_batch, 1), global_batch


#: the largest idle share at which the table does not explain a balance efficiency below 1 by itself (the
#: ranks visibly wait beyond it): below it the note says where the rest went
_LITTLE_IDLE = 0.05
#: efficiencies from here up need no explanation (the design goal for a balanced plan is 0.95)
_EXPLAIN_EFFICIENCY_BELOW = 0.95


def _efficiency_note(
    efficiency: float, idle: np.ndarray, batches: np.ndarray, caps: np.ndarray, *, sync_share: float = 0.0
) -> list[Advice]:
    """Why the balance efficiency is below 1 when (almost) no rank waits: the bound is every GPU alone at its
    cap with no gradient synchronisation, and the plan pays the exposed synchronisation and runs the ranks
    below their caps, where the fixed part of a step (t0) weighs more per sample."""
    if efficiency >= _EXPLAIN_EFFICIENCY_BELOW or len(idle) == 0 or float(idle.max()) >= _LITTLE_IDLE:
        return []
    reasons = []
    if sync_share >= 0.01:
        reasons.append(f"the exposed gradient sync is {sync_share:.0%} of the step")
    below = batches < caps
    if below.any():
        share = float(np.mean(batches[below] / caps[below]))
        reasons.append(
            f"the ranks run below their caps (on average at {share:.0%} of the cap), where the fixed cost "
            "of a step weighs more per sample"
        )
    if not reasons:
        return []
    waiting = (
        "no rank waiting"
        if float(idle.max()) < 0.005
        else f"no rank waiting more than {float(idle.max()):.0%}"
    )
    return [
        Advice(
            AdviceKind.EFFICIENCY,
            f"balance efficiency {efficiency:.2f} with {waiting}: the bound (1.00) is every GPU running alone "
            f"at its cap with no gradient sync; here {' and '.join(reasons)}",
        )
    ]
