"""The search over candidate clusters: which to plan, which the bound rules out, and the Pareto front of cost
per epoch against time per epoch.

Every candidate gets its bound first (``AdviseContext.bound_samples_per_s``: no plan, microseconds): a time
per epoch and a cost per epoch it cannot beat. Candidates are then planned best bound first (lowest
``bound cost × bound time``, so that the first points planned are the ones likely on the front); a candidate
whose bound is dominated by a point already planned is never planned: whatever its plan, that point is at
least as fast and as cheap, and strictly better in one (so the front is exactly the brute-force front, which
``search(..., prune=False)`` computes and the tests and ``bench/bench_advise.py`` compare).

Filters: ``budget_per_hour_usd`` (the candidate's price, known without a plan), ``deadline_s`` (the bound
time rules a candidate out without a plan; a planned one over it is rejected too). Every rejected candidate
says why in one line. Pure Python over the context: no torch at import.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from planner.advise.candidates import Candidate
from planner.advise.evaluate import AdviseContext, Evaluated

#: progress every this many plans
_PROGRESS_EVERY = 200


@dataclass(frozen=True, kw_only=True)
class Filters:
    budget_per_hour_usd: float | None = None
    deadline_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class Rejected:
    cluster: str
    """the candidate's label, or an offer's name where the whole offer is ruled out"""
    reason: str


@dataclass(kw_only=True)
class SearchResult:
    candidates: int
    """candidates enumerated (within the GPU limit, over the usable offers)"""
    evaluated: list[Evaluated] = field(default_factory=list)
    """every candidate planned, in the order planned (infeasible ones are in ``rejected``)"""
    front: list[Evaluated] = field(default_factory=list)
    """the Pareto front, fastest first"""
    rejected: list[Rejected] = field(default_factory=list)
    pruned: int = 0
    """candidates never planned: their bound was dominated"""
    planned: int = 0
    """plans made (``evaluated`` plus the candidates whose plan was infeasible or over the deadline)"""
    seconds: float = 0.0


def _dominates(time_s: float, cost_usd: float, other_time_s: float, other_cost_usd: float) -> bool:
    """(time, cost) is at least as good in both and strictly better in one."""
    return (
        time_s <= other_time_s
        and cost_usd <= other_cost_usd
        and (time_s < other_time_s or cost_usd < other_cost_usd)
    )


def pareto_front(points: Sequence[Evaluated]) -> list[Evaluated]:
    """The points no other dominates, fastest first; of points equal in both, the first by label."""
    ordered = sorted(points, key=lambda p: (p.time_per_epoch_s, p.cost_per_epoch_usd, p.candidate.label))
    front: list[Evaluated] = []
    for point in ordered:
        if not front or point.cost_per_epoch_usd < front[-1].cost_per_epoch_usd:
            front.append(point)
    return front


class _Front:
    """The planned points not dominated so far, as (time, cost) sorted by time: a bound is checked against it in
    O(log n)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.costs: list[float] = []

    def add(self, time_s: float, cost_usd: float) -> None:
        if self.dominated(time_s, cost_usd) or (time_s, cost_usd) in zip(self.times, self.costs, strict=True):
            return
        keep = [
            (t, c)
            for t, c in zip(self.times, self.costs, strict=True)
            if not _dominates(time_s, cost_usd, t, c)
        ]
        keep.append((time_s, cost_usd))
        keep.sort()
        self.times = [t for t, _ in keep]
        self.costs = [c for _, c in keep]

    def dominated(self, time_s: float, cost_usd: float) -> bool:
        """Some point here dominates (time_s, cost_usd)."""
        import bisect

        # the cheapest point at least as fast is the last one with time <= time_s (costs fall as times grow)
        i = bisect.bisect_right(self.times, time_s) - 1
        return i >= 0 and _dominates(self.times[i], self.costs[i], time_s, cost_usd)


def search(
    context: AdviseContext,
    candidates: Sequence[Candidate],
    filters: Filters = Filters(),
    *,
    prune: bool = True,
    on_progress: Callable[[str], None] = lambda _line: None,
) -> SearchResult:
    """Plan the candidates (all of them with ``prune=False``) and keep the Pareto front."""
    start = time.monotonic()
    result = SearchResult(candidates=len(candidates))
    queue: list[tuple[float, float, Candidate]] = []
    for candidate in candidates:
        price = candidate.price_per_hour_usd
        if filters.budget_per_hour_usd is not None and price > filters.budget_per_hour_usd:
            result.rejected.append(
                Rejected(
                    cluster=candidate.label,
                    reason=(f"costs ${price:,.2f}/h, over --budget-per-hour {filters.budget_per_hour_usd:g}"),
                )
            )
            continue
        bound_time_s = context.epoch_samples / context.bound_samples_per_s(candidate)
        if filters.deadline_s is not None and bound_time_s > filters.deadline_s:
            result.rejected.append(
                Rejected(
                    cluster=candidate.label,
                    reason=(
                        f"takes at least {bound_time_s / 3600:.3g} h per epoch (its best case), over --deadline "
                        f"{filters.deadline_s / 3600:g}"
                    ),
                )
            )
            continue
        queue.append((bound_time_s, bound_time_s * price / 3600.0, candidate))
    # best bound first: the product is small for points that are fast, cheap or both (owned machines: cost 0)
    queue.sort(key=lambda q: (q[0] * q[1], q[0], q[2].label))
    front = _Front()
    for bound_time_s, bound_cost_usd, candidate in queue:
        if prune and front.dominated(bound_time_s, bound_cost_usd):
            result.pruned += 1
            continue
        outcome = context.evaluate(candidate)
        result.planned += 1
        if result.planned % _PROGRESS_EVERY == 0:
            on_progress(
                f"planned {result.planned} of {len(queue)} candidates ({result.pruned} ruled out by their "
                f"bound) in {time.monotonic() - start:.1f} s"
            )
        if isinstance(outcome, str):
            result.rejected.append(Rejected(cluster=candidate.label, reason=outcome))
            continue
        if filters.deadline_s is not None and outcome.time_per_epoch_s > filters.deadline_s:
            result.rejected.append(
                Rejected(
                    cluster=candidate.label,
                    reason=(
                        f"takes {outcome.time_per_epoch_s / 3600:.3g} h per epoch, over --deadline "
                        f"{filters.deadline_s / 3600:g}"
                    ),
                )
            )
            continue
        result.evaluated.append(outcome)
        front.add(outcome.time_per_epoch_s, outcome.cost_per_epoch_usd)
    result.front = pareto_front(result.evaluated)
    result.seconds = time.monotonic() - start
    return result
