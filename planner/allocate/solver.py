"""The solver behind ``planner.allocate.allocation.allocate``: per-rank batch sizes for data-parallel training
on mixed GPUs (pure numpy: no torch, no Ray).

Each rank i has a cap c_i (the largest per-step batch that fits its memory budget) and an affine step
time t_i(b) = t0_i + t1_i·b (DESIGN.md "Profiles"; the form Pollux uses). ``allocate`` chooses the
per-rank batches b_i, the gradient accumulation and the figures a plan reports.

Modes (K = ``multiple_of``, every b_i is a multiple of K and ``min_batch ≤ b_i ≤ c_i``):

- ``uniform``: every rank gets the smallest cap (plain DDP; the baseline).
- ``max``: every rank gets its own cap (per-device autobatch).
- ``balanced`` (default): without a global batch, the b_i that maximise throughput Σ b_i / max_i t_i(b_i);
  with a global batch B, Σ b_i = B / accumulate and the b_i minimise the step time max_i t_i(b_i).

With a global batch B, ``accumulate`` is the fastest a ≥ 1 (least time per global batch, a · step time;
the smaller a on ties; for ``uniform`` that is always the smallest; ``max``, memory first, takes the smallest)
with B/a an integer step batch that the mode can split: ``uniform`` needs B/a = N·b with one per-rank b;
``balanced`` and ``max`` need B/a between N·min and Σ caps. Fewer, bigger steps are not always faster: when
the fast ranks are full, more accumulation lets the split balance (see ``_fastest_accumulate``). ``max`` with a global batch cannot give every rank its whole cap, so it keeps the
spirit of "as much as memory allows": every rank fills the same share of its cap (a memory-proportional
split; the largest fill share b_i/c_i is minimised, exactly, in integers). No split → InfeasiblePlanError
naming the nearest valid global batch sizes.

Algorithms, in units of K (u_i = b_i / K), on the distinct (cap, t0, t1) rows with their counts, so a
cluster of 100,000 ranks of five GPU types costs about what a few hundred distinct ranks cost. The key
fact: u_i(T) = the largest u in [min, cap_i] with t_i(u) ≤ T (min when none) is monotone in T, and
F(T) = Σ u_i(T) only changes at the times where some rank steps up.

- ``balanced`` with B (and ``max`` with B, on fill shares): the smallest T with F(T) ≥ B/a, by bisection
  on T down to a few thousand candidate steps, then enumerating those; the surplus is taken from the
  ranks that stepped up at T (they are the ones at the step time; higher rank index first). This is the
  exact optimum of the integer problem: no allocation has a smaller step time.
- ``balanced`` without B: the optimum is at one of the step-up times. Branch and bound over time
  intervals (see ``_best_throughput_time``): exact enumeration where an interval holds few candidates,
  otherwise halving with two upper bounds (F(b)/a and the concave continuous relaxation). Exact for
  small clusters and few distinct profiles; otherwise within 0.1% of the optimum by construction.

Ranks whose time does not depend on the batch (t1 = 0) keep every sample they can hold at the optimal
step time (those samples are free); the other ranks are lowered as evenly in time as integers allow.

Advice (``Allocation.advice``/``notes``/``alternatives``, in ``planner.allocate.advice``): the three modes,
the fastest groups (dropping the slowest one by one, by cap / t(cap) per rank)
and each group alone, all at the same global batch when one is given; the options are solved to 1% (the
advice speaks from 5%).

Gradient synchronisation (``sync_s``): a time per optimizer step added to the compute, ``time per global
batch = a·max_i t_i(b_i) + C`` (with ``no_sync()`` accumulation the all-reduce runs once per optimizer
step). The solver treats C as a constant of the ranks taking part: it leaves the split of a given step batch
and the choice of accumulation unchanged (both minimise the compute term) and moves the throughput optimum
without a global batch towards bigger steps (Σ b / (T + C) is maximised). ``split_with_sync`` evaluates C
at the solved step and re-solves once with it, since overlap with the backward pass makes C depend on T.

Known limitations: accumulation micro-steps are assumed to cost one step each; only
the ``_MAX_ACCUMULATE_TRIALS`` smallest valid accumulations are compared; more than
``planner.allocate.advice._MAX_ADVICE_GROUPS`` (32) groups get no group advice (a line says so).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from planner.errors import InfeasiblePlanError

# Throughput mode (see _best_throughput_time): the largest number of candidate step times enumerated
# exactly at once (2^15 sort in ~3 ms), the tolerance at which branch and bound stops (result ≥ optimum /
# (1 + tolerance)): 0.1% for the plan (1% for the options the advice compares, ``_ADVICE_TOLERANCE`` in
# planner.allocate.advice), and a cap on the interval halvings (each costs O(distinct profiles)).
_EXACT_CANDIDATE_LIMIT = 2**15
_THROUGHPUT_TOLERANCE = 1e-3
_MAX_EVALUATIONS = 2000
# Global batches above this are refused: divisor search enumerates up to sqrt(B / multiple_of).
MAX_GLOBAL_BATCH = 10**12
# The fastest accumulation is searched among this many valid ones, smallest first (a global batch has at most
# a few thousand divisors; past the first hundreds the per-step overhead t0 makes more steps slower anyway).
_MAX_ACCUMULATE_TRIALS = 256


@dataclass(frozen=True)
class Rows:
    """Ranks merged into distinct (cap, t0, t1) rows; units are multiples of K, times t0 + s·u."""

    ranks: np.ndarray  # int64 input indices of these ranks, ascending
    row: np.ndarray  # row of each rank
    t0: np.ndarray  # per row, seconds
    s: np.ndarray  # per row, seconds per unit (t1·K)
    cap: np.ndarray  # per row, float units
    weight: np.ndarray  # per row, float count of ranks
    lo: int  # minimum units per rank

    def __post_init__(self) -> None:
        flat = self.s == 0  # time independent of batch: the whole cap as soon as T reaches t0
        object.__setattr__(self, "_flat", flat if flat.any() else None)
        object.__setattr__(self, "_inv_s", 1.0 / np.where(flat, 1.0, self.s))

    def units_at(self, time_s: float) -> np.ndarray:
        """Per row: the largest u in [lo, cap] with t0 + s·u ≤ time_s (lo when none), as floats."""
        t0, s, cap, lo = self.t0, self.s, self.cap, self.lo
        u = np.clip(np.floor((time_s - t0) * self._inv_s), lo, cap)
        # The division can be one off either way; correct with the exact comparison used everywhere.
        u += (u < cap) & (t0 + s * (u + 1) <= time_s)
        u -= (u > lo) & (t0 + s * u > time_s)
        if self._flat is not None:
            u[self._flat] = np.where(t0[self._flat] <= time_s, cap[self._flat], lo)
        return u

    def total(self, units: np.ndarray) -> float:
        """Σ units over ranks. (einsum, not ``@``: a BLAS dot spins up threads and is ~20× slower here.)"""
        return float(np.einsum("i,i->", self.weight, units))

    def relaxed_at(self, time_s: float) -> tuple[float, float]:
        """Continuous relaxation at T ≥ T_lb: Σ units with fractions allowed, and its slope d/dT (right)."""
        real = np.clip((time_s - self.t0) * self._inv_s, self.lo, self.cap)
        rising = real < self.cap
        if self._flat is not None:
            real[self._flat] = self.cap[self._flat]  # t0 ≤ T_lb ≤ T: at their cap
            rising &= ~self._flat
        return self.total(real), float(np.einsum("i,i->", self.weight[rising], self._inv_s[rising]))

    def subset(self, keep_rank: np.ndarray) -> Rows:
        """The rows of the ranks where ``keep_rank`` (bool per rank of these rows) is true."""
        weight = np.bincount(self.row[keep_rank], minlength=len(self.t0)).astype(np.float64)
        used = weight > 0
        renumber = np.cumsum(used) - 1
        return Rows(
            ranks=self.ranks[keep_rank],
            row=renumber[self.row[keep_rank]],
            t0=self.t0[used],
            s=self.s[used],
            cap=self.cap[used],
            weight=weight[used],
            lo=self.lo,
        )

    def step_times(self, u_a: np.ndarray, u_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sorted times at which some row steps up from u_a towards u_b, and the ranks stepping at each."""
        extra = (u_b - u_a).astype(np.int64)
        num = int(extra.sum())
        rid = np.repeat(np.arange(len(extra)), extra)
        u = u_a[rid] + 1 + (np.arange(num) - np.repeat(np.cumsum(extra) - extra, extra))
        times = self.t0[rid] + self.s[rid] * u
        order = np.argsort(times)  # ties need no order: totals are read at the last of equal times
        return times[order], self.weight[rid][order]


def make_rows(ranks: np.ndarray, t0: np.ndarray, t1: np.ndarray, cap_u: np.ndarray, k: int, lo: int) -> Rows:
    t0r, t1r, capr = t0[ranks], t1[ranks], cap_u[ranks]
    order = np.lexsort((t1r, t0r, capr))
    new = np.ones(len(ranks), dtype=bool)
    new[1:] = (np.diff(capr[order]) != 0) | (np.diff(t0r[order]) != 0) | (np.diff(t1r[order]) != 0)
    row_sorted = np.cumsum(new) - 1
    row = np.empty(len(ranks), dtype=np.int64)
    row[order] = row_sorted
    first = order[new]
    return Rows(
        ranks=ranks,
        row=row,
        t0=t0r[first],
        s=t1r[first] * k,
        cap=capr[first].astype(np.float64),
        weight=np.bincount(row).astype(np.float64),
        lo=lo,
    )


def _give_back(units: np.ndarray, room: np.ndarray, amount: int) -> np.ndarray:
    """Take ``amount`` units off, at most ``room`` per rank, highest rank index first."""
    rev = room[::-1]
    before = np.cumsum(rev) - rev
    return units - np.clip(amount - before, 0, rev)[::-1]


def _min_max_time(rows: Rows, target: int) -> np.ndarray:
    """Per-rank units with Σ = target minimising max t0 + s·u (exact); ties by rank index.

    Ranks whose time does not depend on the batch (s = 0) keep what they hold at the optimal step time
    (their samples are free), and the others are lowered as evenly in time as integers allow."""
    n = len(rows.ranks)
    if target <= n * rows.lo:
        return np.full(n, rows.lo, dtype=np.int64)
    # Bracket (a, b] with F(a) < target ≤ F(b), F = Σ units. At T = 0 every rank is at lo (times are > 0).
    a, b = 0.0, float(np.max(rows.t0 + rows.s * rows.cap))
    u_a, u_b = rows.units_at(a), rows.cap
    while float(np.sum(u_b - u_a)) > _EXACT_CANDIDATE_LIMIT and a < 0.5 * (a + b) < b:
        mid = 0.5 * (a + b)
        u_m = rows.units_at(mid)
        if rows.total(u_m) >= target:
            b, u_b = mid, u_m
        else:
            a, u_a = mid, u_m
    if a < 0.5 * (a + b) < b:
        times, weights = rows.step_times(u_a, u_b)
        reach = rows.total(u_a) + np.cumsum(weights)
        b = float(times[int(np.searchsorted(reach, target, side="left"))])
    u_hi = rows.units_at(b)[rows.row].astype(np.int64)
    if rows._flat is not None:
        flat = rows._flat[rows.row]
        rest = target - int(u_hi[flat].sum())
        units = u_hi.copy()
        if flat.all():
            return _give_back(units, units - rows.lo, -rest)
        others = rows.subset(~flat)
        units[~flat] = _min_max_time(others, max(rest, int((~flat).sum()) * rows.lo))
        if rest < int((~flat).sum()) * rows.lo:  # the free ranks alone overshoot: they give back
            units[flat] = _give_back(units[flat], units[flat] - rows.lo, int((~flat).sum()) * rows.lo - rest)
        return units
    # Ranks that stepped up at T are exactly those at the step time; the highest rank indices give back.
    u_lo = rows.units_at(float(np.nextafter(b, 0.0)))[rows.row].astype(np.int64)
    return _give_back(u_hi, u_hi - u_lo, int(u_hi.sum()) - target)


def _best_in_interval(
    rows: Rows, u_a: np.ndarray, u_b: np.ndarray, sync_s: float = 0.0
) -> tuple[float, float]:
    """Exact best (throughput in units/s, time) over the step times where some row steps up in (a, b]; the
    throughput of a step time T is F(T) / (T + sync_s)."""
    times, weights = rows.step_times(u_a, u_b)
    totals = rows.total(u_a) + np.cumsum(weights)
    last = np.ones(len(times), dtype=bool)
    last[:-1] = times[1:] != times[:-1]  # the total at a time counts every step at that time
    h = totals[last] / (times[last] + sync_s)
    j = int(np.argmax(h))
    return float(h[j]), float(times[last][j])


def _best_throughput_time(rows: Rows, tolerance: float, sync_s: float = 0.0) -> float:
    """The step time T whose allocation u(T) maximises Σ u / (max t + sync_s) (the smallest T among equals).

    Throughput only changes where some rank steps up, so the optimum is at one of those times in
    [T_lb, T_hi] (T_lb: every rank at the minimum; T_hi: every rank at its cap). Branch and bound over
    time intervals: an interval (a, b] cannot beat F(b)/a (F = Σ units); intervals with at most
    ``_EXACT_CANDIDATE_LIMIT`` step times are enumerated exactly, the others are halved, and an interval
    whose bound is within ``tolerance`` of the best found is dropped. Small clusters (or
    clusters of few distinct profiles) are therefore solved exactly in one enumeration. With ``sync_s`` = C
    every bound divides by J + C instead of J (still valid: F is non-decreasing, and a linear function over
    J + C is monotone on an interval, so its maximum is at an end).
    """
    c = sync_s
    t0, s, lo = rows.t0, rows.s, rows.lo
    t_lb = float(np.max(t0 + s * lo))
    t_hi = float(np.max(t0 + s * rows.cap))
    u_lb = rows.units_at(t_lb)
    best_h, best_t = rows.total(u_lb) / (t_lb + c), t_lb
    if t_hi <= t_lb:
        return best_t

    def consider(h: float, time_s: float) -> None:
        nonlocal best_h, best_t
        if h > best_h or (h == best_h and time_s < best_t):
            best_h, best_t = h, time_s

    u_hi = rows.cap
    consider(rows.total(u_hi) / (t_hi + c), t_hi)  # = mode "max": never worse than it
    u_uniform = rows.units_at(float(np.max(t0 + s * np.min(rows.cap))))
    t_uniform = float(np.max(t0 + s * u_uniform))
    consider(rows.total(u_uniform) / (t_uniform + c), t_uniform)  # ≥ mode "uniform": never worse than it

    def bound(a: float, b: float, f_b: float, relaxed_a: tuple[float, float]) -> float:
        # Any step time J in (a, b] gives F(J)/J ≤ F(b)/a; and the relaxation Fc ≥ F is concave on
        # [T_lb, ∞) (each rank: linear, then flat at its cap), so F(J) ≤ Fc(a) + Fc'(a)·(J − a).
        fc_a, slope = relaxed_a
        return min(f_b / (a + c), max(fc_a / (a + c), (fc_a + slope * (b - a)) / (b + c)))

    relaxed_lb = rows.relaxed_at(t_lb)
    heap = [(-bound(t_lb, t_hi, rows.total(u_hi), relaxed_lb), t_lb, t_hi, u_lb, u_hi, relaxed_lb)]
    evaluations = 0
    while heap:
        neg_bound, a, b, u_a, u_b, relaxed_a = heapq.heappop(heap)
        if -neg_bound <= best_h * (1.0 + tolerance) or evaluations >= _MAX_EVALUATIONS:
            break  # best-first: no interval left can beat the best by more than the tolerance
        f_a, f_b = rows.total(u_a), rows.total(u_b)
        mid = 0.5 * (a + b)
        if not a < mid < b:
            consider(f_b / (b + c), b)
            continue
        if float(np.sum(u_b - u_a)) <= _EXACT_CANDIDATE_LIMIT:
            consider(*_best_in_interval(rows, u_a, u_b, c))
            continue
        evaluations += 1
        u_m = rows.units_at(mid)
        f_m = rows.total(u_m)
        t_m = float(np.max(t0 + s * u_m))
        consider(f_m / (t_m + c), t_m)
        if f_m > f_a:
            heapq.heappush(heap, (-bound(a, mid, f_m, relaxed_a), a, mid, u_a, u_m, relaxed_a))
        if f_b > f_m:
            relaxed_m = rows.relaxed_at(mid)
            heapq.heappush(heap, (-bound(mid, b, f_b, relaxed_m), mid, b, u_m, u_b, relaxed_m))
    return best_t


def _accumulates(global_batch: int, unit: int, lo: int, hi: int) -> list[int]:
    """Every a with global_batch = a·q·unit and lo ≤ q ≤ hi, ascending (divisors up to sqrt: cheap)."""
    if global_batch % unit:
        return []
    total = global_batch // unit
    small = np.arange(1, math.isqrt(total) + 1, dtype=np.int64)
    small = small[total % small == 0]
    steps = np.concatenate((small, total // small))  # q candidates (a duplicate at a square is harmless)
    steps = np.unique(steps[(steps >= lo) & (steps <= hi)])
    return [total // int(q) for q in steps[::-1]]


def _nearest_valid(global_batch: int, unit: int, lo: int, hi: int) -> tuple[int | None, int]:
    """Nearest global batches below (None if none) and above B of the form a·q·unit, a ≥ 1, lo ≤ q ≤ hi."""
    below: int | None = None
    above: int | None = None
    chunk = 1 << 20  # bounded memory for huge clusters (hi is Σ caps in units)
    for start in range(lo, hi + 1, chunk):
        step = np.arange(start, min(hi, start + chunk - 1) + 1, dtype=np.int64) * unit
        down = (global_batch // step) * step
        down = down[down > 0]
        if len(down):
            below = max(below or 0, int(down.max()))
        up = int((-(-global_batch // step) * step).min())
        above = up if above is None else min(above, up)
    assert above is not None  # lo ≤ hi: at least one step size
    return below, above


def split_units(
    rows: Rows,
    mode: str,
    k: int,
    global_batch: int | None,
    what: str,
    tolerance: float = _THROUGHPUT_TOLERANCE,
    accumulate: int | None = None,
    sync_s: float = 0.0,
) -> tuple[np.ndarray, int]:
    """Per-rank units (in rows.ranks order) and accumulate for one mode; raises when B cannot be split.

    ``accumulate`` forces one of the valid accumulations (default: the fastest, see the module docstring);
    ``sync_s``: the synchronisation time per optimizer step, a constant (module docstring)."""
    n, lo = len(rows.ranks), rows.lo
    cap_rank = rows.cap[rows.row].astype(np.int64)
    if global_batch is None:
        if mode == "uniform":
            return np.full(n, int(cap_rank.min()), dtype=np.int64), 1
        if mode == "max":
            return cap_rank, 1
        return rows.units_at(_best_throughput_time(rows, tolerance, sync_s))[rows.row].astype(np.int64), 1
    unit, q_lo, q_hi = _step_bounds(rows, mode, k)
    valid = _accumulates(global_batch, unit, q_lo, q_hi)
    if not valid:
        if mode == "uniform":
            rule = f"{n} equal batches of {lo * k}..{q_hi * k} samples per step"
        else:
            rule = f"{q_lo * k}..{q_hi * k} samples per step over {n} ranks"
        if k > 1:
            rule += f", multiples of {k}"
        below, above = _nearest_valid(global_batch, unit, q_lo, q_hi)
        near = f"{below} or {above}" if below is not None else f"{above} (nothing smaller works)"
        raise InfeasiblePlanError(
            f"global batch {global_batch} cannot be split {what}: each step holds {rule}, repeated by "
            f"gradient accumulation; nearest valid global batch sizes: {near}"
        )
    if accumulate is None and mode == "max":
        accumulate = valid[0]  # "as much as memory allows": the biggest steps, whatever they cost in time
    if accumulate is not None:
        if accumulate not in valid:
            raise InfeasiblePlanError(
                f"global batch {global_batch} cannot be split {what} in {accumulate} step(s) (valid "
                f"accumulations: {', '.join(map(str, valid[:8]))}{', ...' if len(valid) > 8 else ''})"
            )
        return _split_step(rows, mode, global_batch // unit // accumulate), accumulate
    return _fastest_accumulate(rows, mode, k, global_batch, unit, valid[:_MAX_ACCUMULATE_TRIALS])


def _split_step(rows: Rows, mode: str, q: int) -> np.ndarray:
    """Per-rank units of one step of ``q`` (uniform: per rank; else in all) units."""
    if mode == "uniform":
        return np.full(len(rows.ranks), q, dtype=np.int64)
    if mode == "max":
        # Memory-proportional: minimise the largest fill share u/cap (time model t0 = 0, s = 1/cap).
        fill = Rows(
            ranks=rows.ranks,
            row=rows.row,
            t0=np.zeros_like(rows.cap),
            s=1.0 / rows.cap,
            cap=rows.cap,
            weight=rows.weight,
            lo=rows.lo,
        )
        return _min_max_time(fill, q)
    return _min_max_time(rows, q)


def _relaxed_step_time(rows: Rows, units: float) -> float:
    """A lower bound on the step time of any split of ``units`` units: the smallest T at which the continuous
    relaxation (fractional units, each rank within [lo, cap]) holds them, by bisection."""
    lo_t = float(np.max(rows.t0 + rows.s * rows.lo))
    hi_t = float(np.max(rows.t0 + rows.s * rows.cap))
    if rows.relaxed_at(lo_t)[0] >= units:
        return lo_t
    for _ in range(60):  # halves (hi - lo) each time: far below float resolution of a step time
        mid = 0.5 * (lo_t + hi_t)
        if rows.relaxed_at(mid)[0] >= units:
            hi_t = mid
        else:
            lo_t = mid
    return lo_t


def _fastest_accumulate(
    rows: Rows, mode: str, k: int, global_batch: int, unit: int, valid: list[int]
) -> tuple[np.ndarray, int]:
    """The split and accumulation with the least time per global batch (a · step time) among ``valid``.

    Each a is bounded below by a · (relaxed step time of its step batch); candidates are solved in order of
    that bound until the bound passes the best time found, so usually only one or two are solved exactly.
    Ties (within 1e-9) go to the smaller accumulation."""
    bounds = sorted((a * _relaxed_step_time(rows, global_batch // a // k), a) for a in valid)
    best: tuple[float, int, np.ndarray] | None = None
    for bound, a in bounds:
        if best is not None and bound > best[0] * (1.0 + 1e-9):
            break
        units = _split_step(rows, mode, global_batch // unit // a)
        total_s = a * float(np.max(rows.t0[rows.row] + rows.s[rows.row] * units))
        if (
            best is None
            or total_s < best[0] * (1.0 - 1e-9)
            or (total_s <= best[0] * (1.0 + 1e-9) and a < best[1])
        ):
            best = (total_s, a, units)
    assert best is not None
    return best[2], best[1]


def _step_bounds(rows: Rows, mode: str, k: int) -> tuple[int, int, int]:
    """A step of a mode holds q·unit samples with q_lo ≤ q ≤ q_hi: (unit, q_lo, q_hi)."""
    n = len(rows.ranks)
    if mode == "uniform":  # n equal per-rank batches of q multiples of k
        return k * n, rows.lo, int(rows.cap.min())
    return k, n * rows.lo, int(rows.total(rows.cap))


SyncModel = Callable[[np.ndarray, float], float]
"""(input rank indices taking part, compute time of one micro-step in s) -> exposed synchronisation per
optimizer step, s (``planner.plan.comm`` builds one from the cost model of ``torchkit.estimate.ddp_sync``)"""


@dataclass(frozen=True)
class SyncedSplit:
    """A mode's split with its synchronisation."""

    units: np.ndarray
    """per rank of the rows, in units of K"""
    accumulate: int
    compute_s: float
    """max_i t_i(b_i): one micro-step's compute"""
    sync_s: float
    """exposed synchronisation per optimizer step, at ``compute_s``"""

    @property
    def global_time_s(self) -> float:
        """accumulate · compute + sync: one optimizer step"""
        return self.accumulate * self.compute_s + self.sync_s


def split_with_sync(
    rows: Rows,
    mode: str,
    k: int,
    global_batch: int | None,
    what: str,
    *,
    tolerance: float = _THROUGHPUT_TOLERANCE,
    accumulate: int | None = None,
    sync: SyncModel | None = None,
) -> SyncedSplit:
    """``split_units`` with the synchronisation: solved without it, its time evaluated at that step, solved
    again with that constant, and evaluated at the final step (what the plan reports is the model at its
    own split)."""
    units, acc = split_units(rows, mode, k, global_batch, what, tolerance, accumulate)
    compute = _compute_s(rows, units)
    if sync is None:
        return SyncedSplit(units, acc, compute, 0.0)
    sync_s = float(sync(rows.ranks, compute))
    if sync_s > 0:
        units, acc = split_units(rows, mode, k, global_batch, what, tolerance, accumulate, sync_s)
        compute = _compute_s(rows, units)
        sync_s = float(sync(rows.ranks, compute))
    return SyncedSplit(units, acc, compute, sync_s)


def _compute_s(rows: Rows, units: np.ndarray) -> float:
    return float(np.max(rows.t0[rows.row] + rows.s[rows.row] * units))
