"""The advice of an allocation: the options ``allocate`` compares and the sentences it says about them.

Options (``Allocation.alternatives``): the three modes (each at its fastest accumulation), the fastest
groups (dropping the slowest one by one, by cap / t(cap) per rank) and each
group alone, all at the same global batch when one is given; each is solved with ``planner.allocate.solver``'s
solver to ``_ADVICE_TOLERANCE`` (1%; the advice speaks only from ``ADVICE_MIN_SPEEDUP``, 5%). A sentence is
advice (a warning: another choice would be faster) or a note (``NOTE_KINDS``: the comparison with plain DDP,
an option that could not be compared and why); the plan never advises against its own accumulation, which is
already the fastest.

Pure numpy: no torch, no Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from planner.allocate.solver import Rows, SyncModel, split_with_sync
from planner.errors import InfeasiblePlanError
from planner.job import MODES

# Advice is given only for a speed-up of at least 5%: estimated step times carry errors of several percent
# (operator-level estimators: ~5-10% mean error, peers.md §2), so smaller differences are not evidence.
ADVICE_MIN_SPEEDUP = 1.05
# Branch and bound stops within 1% of the optimum for the options the advice compares (it speaks only
# above 5%); the plan itself is solved to 0.1% (``planner.allocate.solver._THROUGHPUT_TOLERANCE``).
_ADVICE_TOLERANCE = 1e-2
# Group advice (drop the slowest groups, keep one) costs two solves per group: at most this many groups.
# Default groups are identical (cap, t0, t1); with more of them than this, identical (t0, t1).
_MAX_ADVICE_GROUPS = 32


class AdviceKind(Enum):
    """What an advice sentence is about, for programs (preflight) that must not read the sentence."""

    MODE = "mode"
    """another mode would be faster"""
    VERSUS_UNIFORM = "versus_uniform"
    """how much faster this mode is than plain DDP"""
    UNIFORM_NOT_COMPARED = "uniform_not_compared"
    """plain DDP cannot reach the global batch, so it is not compared (and why)"""
    EFFICIENCY = "efficiency"
    """what a balance efficiency below 1 with no rank waiting means"""
    DROP_GROUPS = "drop_groups"
    """dropping the slowest GPU groups would be faster"""
    SINGLE_GROUP = "single_group"
    """one GPU group alone would be faster"""
    NO_GROUP_ADVICE = "no_group_advice"
    """too many groups to compare"""


#: kinds that are information, not warnings: they go to a plan's ``notes``
NOTE_KINDS = frozenset(
    {
        AdviceKind.VERSUS_UNIFORM,
        AdviceKind.UNIFORM_NOT_COMPARED,
        AdviceKind.NO_GROUP_ADVICE,
        AdviceKind.EFFICIENCY,
    }
)


class Advice(str):
    """One advice sentence with its kind. A ``str`` (the text), so that it reads, prints and serialises as
    the sentence it is; ``kind`` says what it is about."""

    kind: AdviceKind

    def __new__(cls, kind: AdviceKind, text: str) -> Advice:
        advice = super().__new__(cls, text)
        advice.kind = kind
        return advice

    def __reduce__(self):
        return Advice, (self.kind, str(self))


@dataclass(frozen=True)
class Option:
    """One option compared by the advice."""

    throughput: float  # samples/s (global batch / time per global batch when B is given)
    global_time_s: float  # accumulate · step time
    batches: np.ndarray  # per rank of the option's rows, samples
    accumulate: int


def _option(rows: Rows, k: int, mode: str, global_batch: int | None, sync: SyncModel | None) -> Option | None:
    try:
        split = split_with_sync(rows, mode, k, global_batch, "", tolerance=_ADVICE_TOLERANCE, sync=sync)
    except InfeasiblePlanError:
        return None
    b = split.units * k
    return Option(
        float(b.sum()) * split.accumulate / split.global_time_s, split.global_time_s, b, split.accumulate
    )


def _rank_list(idx: np.ndarray) -> str:
    """The ranks ``idx`` in words: "rank 5", "ranks 4-5", "ranks 0-3, 8-11, … (40 ranks in all)"."""
    breaks = np.nonzero(np.diff(idx) != 1)[0]
    starts = np.concatenate(([idx[0]], idx[breaks + 1]))
    ends = np.concatenate((idx[breaks], [idx[-1]]))
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in zip(starts[:4], ends[:4], strict=True)]
    more = f", … ({len(idx)} ranks in all)" if len(starts) > 4 else ""
    return ("rank " if len(idx) == 1 else "ranks ") + ", ".join(parts) + more


def _describe(ranks: np.ndarray, gid: np.ndarray, chosen: np.ndarray, names: np.ndarray | None) -> str:
    """The ranks of the chosen groups, by group name when the caller labelled the groups."""
    members = np.isin(gid, chosen)
    idx = ranks[members]
    if names is None:
        return _rank_list(idx)
    counts = np.bincount(gid[members], minlength=len(names))
    listed = [f"{counts[g]} {names[g]}" for g in chosen]
    kinds = listed[0] if len(listed) == 1 else ", ".join(listed[:-1]) + f" and {listed[-1]}"
    return f"the {kinds} rank{'s' if len(idx) > 1 else ''} ({_rank_list(idx)})"


def _rate(samples_per_s: float) -> str:
    return f"{samples_per_s:,.0f}" if samples_per_s >= 100 else f"{samples_per_s:.3g}"


def _versus(new: Option, cur: Option, global_batch: int | None) -> str:
    if global_batch is None:
        return f"{_rate(new.throughput)} vs {_rate(cur.throughput)} samples/s"
    return f"{new.global_time_s:.4g} s vs {cur.global_time_s:.4g} s per global batch of {global_batch}"


def _uniform_missing(rows: Rows, k: int, global_batch: int | None) -> str:
    """Why plain DDP (``uniform``) has no option to compare: one sentence with the numbers."""
    n = len(rows.ranks)
    if global_batch is not None and global_batch % (n * k):
        below, above = global_batch // (n * k) * n * k, (global_batch // (n * k) + 1) * n * k
        near = f"{below} or {above}" if below else f"{above}"
        return (
            f"'uniform' (plain DDP) is not compared: global batch {global_batch} does not split into {n} "
            f"equal per-rank batches{f' of multiples of {k}' if k > 1 else ''} (a multiple of {n * k} "
            f"would, e.g. {near})"
        )
    return (
        f"'uniform' (plain DDP) is not compared: no accumulation splits global batch {global_batch} into "
        f"{n} equal per-rank batches of at most {int(rows.cap.min()) * k} (the smallest cap)"
    )


def advise(
    rows: Rows,
    t0: np.ndarray,
    t1: np.ndarray,
    k: int,
    mode: str,
    global_batch: int | None,
    labels: np.ndarray | None,
    current: Option,
    sync: SyncModel | None = None,
) -> tuple[dict[str, float], list[Advice]]:
    """Alternatives (throughput per option) and advice sentences; O(groups · N log N). ``sync``: the
    synchronisation model every option is priced with (``planner.allocate.solver.SyncModel``)."""
    options = {m: (current if m == mode else _option(rows, k, m, global_batch, sync)) for m in MODES}
    alternatives = {m: o.throughput for m, o in options.items() if o is not None}
    advice: list[Advice] = []
    best_mode = max((m for m in MODES if options[m] is not None), key=lambda m: options[m].throughput)
    gain = options[best_mode].throughput / current.throughput
    if best_mode != mode and gain >= ADVICE_MIN_SPEEDUP:
        advice.append(
            Advice(
                AdviceKind.MODE,
                f"mode '{best_mode}' would be {gain:.2f}× faster than '{mode}' "
                f"({_versus(options[best_mode], current, global_batch)})",
            )
        )
    elif mode != "uniform" and options["uniform"] is not None:
        over = current.throughput / options["uniform"].throughput
        if over >= ADVICE_MIN_SPEEDUP:
            advice.append(
                Advice(
                    AdviceKind.VERSUS_UNIFORM,
                    f"'{mode}' is {over:.2f}× faster than 'uniform' (plain DDP, every rank at batch "
                    f"{int(options['uniform'].batches[0])}): "
                    f"{_versus(current, options['uniform'], global_batch)}",
                )
            )

    if options["uniform"] is None:
        advice.append(Advice(AdviceKind.UNIFORM_NOT_COMPARED, _uniform_missing(rows, k, global_batch)))

    _group_advice(rows, t0, t1, k, mode, global_batch, labels, current, alternatives, advice, sync)
    return alternatives, advice


def _rank_groups(
    rows: Rows, t0: np.ndarray, t1: np.ndarray, labels: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Each rank's group id (0, 1, ...) and the groups' names: by ``labels`` where given (names sorted), else
    one group per row, or per time profile where there are more rows than ``_MAX_ADVICE_GROUPS`` (no names)."""
    ranks = rows.ranks
    if labels is not None:
        names, gid = np.unique(np.asarray(labels)[ranks].astype(str), return_inverse=True)
        return gid, names
    gid = rows.row
    if len(rows.t0) > _MAX_ADVICE_GROUPS:
        # Caps differ with each GPU's free memory; the time profile is what a GPU type shares.
        profile = np.stack((t0[ranks], t1[ranks]), axis=1)
        gid = np.unique(profile, axis=0, return_inverse=True)[1].reshape(-1)
    return gid, None


def _groups_fastest_first(rows: Rows, t0: np.ndarray, t1: np.ndarray, k: int, gid: np.ndarray) -> np.ndarray:
    """The group ids, fastest first by the mean of each rank's best rate alone (cap / t(cap)); ties by first
    rank index."""
    ranks = rows.ranks
    cap_b = rows.cap[rows.row] * k
    rate = cap_b / (t0[ranks] + t1[ranks] * cap_b)
    speed = np.bincount(gid, weights=rate) / np.bincount(gid)
    first = np.unique(gid, return_index=True)[1]
    return np.lexsort((first, -speed))


def _group_advice(
    rows: Rows,
    t0: np.ndarray,
    t1: np.ndarray,
    k: int,
    mode: str,
    global_batch: int | None,
    labels: np.ndarray | None,
    current: Option,
    alternatives: dict[str, float],
    advice: list[Advice],
    sync: SyncModel | None = None,
) -> None:
    """Add the group options (the fastest groups, each group alone) to ``alternatives`` and ``advice``."""
    ranks = rows.ranks
    gid, names = _rank_groups(rows, t0, t1, labels)
    num_groups = int(gid.max()) + 1
    if num_groups > _MAX_ADVICE_GROUPS:
        advice.append(
            Advice(
                AdviceKind.NO_GROUP_ADVICE,
                f"no advice on dropping GPU groups: the ranks form {num_groups} groups (more than "
                f"{_MAX_ADVICE_GROUPS}); pass groups= (e.g. the GPU type per rank) to compare them",
            )
        )
        return
    if num_groups < 2:
        return
    order = _groups_fastest_first(rows, t0, t1, k, gid)

    def subset_option(groups_kept: np.ndarray) -> Option | None:
        return _option(rows.subset(np.isin(gid, groups_kept)), k, mode, global_batch, sync)

    prefixes = [(order[:j], subset_option(order[:j])) for j in range(1, num_groups)]
    singles = [(np.array([g]), subset_option(np.array([g]))) for g in range(num_groups)]
    best_prefix = max(
        ((g, o) for g, o in prefixes if o is not None), key=lambda p: p[1].throughput, default=None
    )
    best_single = max(
        ((g, o) for g, o in singles if o is not None), key=lambda p: p[1].throughput, default=None
    )
    said_prefix = None
    if best_prefix is not None:
        alternatives["best_group_subset"] = best_prefix[1].throughput
        gain = best_prefix[1].throughput / current.throughput
        if gain >= ADVICE_MIN_SPEEDUP:
            kept, dropped = best_prefix[0], order[len(best_prefix[0]) :]
            if len(kept) < len(dropped):  # the shorter list to read: what stays
                left_out = int(np.isin(gid, dropped).sum())
                change = (
                    f"keeping only {_describe(ranks, gid, kept, names)} and dropping the other {left_out}"
                )
            else:
                change = f"dropping {_describe(ranks, gid, dropped, names)}"
            advice.append(
                Advice(
                    AdviceKind.DROP_GROUPS,
                    f"{change} would be {gain:.2f}× faster ({_versus(best_prefix[1], current, global_batch)})",
                )
            )
            said_prefix = set(best_prefix[0].tolist())
    if best_single is not None:
        alternatives["best_single_group"] = best_single[1].throughput
        gain = best_single[1].throughput / current.throughput
        if gain >= ADVICE_MIN_SPEEDUP and said_prefix != set(best_single[0].tolist()):
            advice.append(
                Advice(
                    AdviceKind.SINGLE_GROUP,
                    f"using only {_describe(ranks, gid, best_single[0], names)} would be {gain:.2f}× "
                    f"faster ({_versus(best_single[1], current, global_batch)})",
                )
            )
