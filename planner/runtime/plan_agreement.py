"""The ranks of a job agree on the plan before the first sample is drawn.

A stale ``plan.json`` on one node (copied before the last re-plan) gives that node's ranks other batches than the
rest: the slices of every global step then overlap or leave gaps, the loss weights no longer sum to the global
mean, and nothing fails (rc 0). So the first time a rank's :class:`~planner.runtime.sampler.PlannedBatchSampler`
is iterated, every rank gathers what decides its slices (every rank's batch, ``accumulate``, the dataset size,
the shuffle, seed and ``drop_last``: :class:`SplitTerms`) from every other, through the job's key-value store
(the default process group's; no CUDA device needed, JSON only); where they differ, every rank raises the same :class:`PlanMismatchError`: one line naming the
nodes (host, torchrun's node rank) and ranks whose plan differs from the others' and what differs. Every rank
sees the same gathered list, so every rank stops, none waits for the others.

:func:`agree_on_split` is the same check for an integration that cuts batches itself (a trainer whose
loader is built elsewhere): call it once on every rank, at the same point, with the terms it uses.

Known limitations: every rank waits for every other's entry (up to the store's timeout, the process group's), so
every rank must iterate its planned samplers, in the same order: a sampler iterated on one rank only (an
evaluation loader on rank 0) must have ``sampler.agree_on_first_use = False`` set before iterating. Without an
initialised process group (one process) there is nothing to agree with and nothing is checked.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import socket
from collections.abc import Sequence
from dataclasses import asdict, astuple, dataclass

from planner.errors import ConfigError

__all__ = ["PlanMismatchError", "SplitTerms", "agree_on_split"]

#: ranks named in a message before "..." (a job can have thousands)
_MAX_NAMED = 8
#: agreements made in this process, in order: samplers are iterated in the same order on every rank
_rounds = itertools.count()


class PlanMismatchError(ConfigError):
    """The ranks of a job hold different plans (a stale ``plan.json`` on a node); raised on every rank."""


@dataclass(frozen=True)
class SplitTerms:
    """What decides which samples a rank takes: two ranks with different terms take overlapping slices."""

    batches: tuple[int, ...]
    """every rank's batch per micro-step, in rank order"""
    accumulate: int
    """micro-steps per optimizer step"""
    dataset_size: int
    """samples in the dataset"""
    shuffle: bool
    seed: int
    drop_last: bool

    def digest(self) -> str:
        """A short hash of the terms (what ranks compare)."""
        return hashlib.sha256(repr(astuple(self)).encode()).hexdigest()[:16]

    def describe(self) -> str:
        """``batches [64, 64, 32], accumulate 1, dataset 1024, seed 0``: the terms as a message shows them."""
        shown = list(self.batches[:_MAX_NAMED]) + (["..."] if len(self.batches) > _MAX_NAMED else [])
        batches = "[" + ", ".join(str(b) for b in shown) + "]"
        return (
            f"batches {batches} ({len(self.batches)} ranks), accumulate {self.accumulate}, dataset "
            f"{self.dataset_size}, {'shuffle seed ' + str(self.seed) if self.shuffle else 'no shuffle'}"
            f"{', drop_last' if self.drop_last else ''}"
        )


def _this_node() -> str:
    """This process's node as a message names it: its host, and torchrun's node rank where it set one."""
    host = socket.gethostname().split(".")[0] or "?"
    group_rank = os.environ.get("GROUP_RANK")
    return f"{host} (node rank {group_rank})" if group_rank and group_rank.isdigit() else host


def agree_on_split(terms: SplitTerms, *, what: str = "the plan") -> None:
    """Every rank of the default process group holds ``terms``, or every rank raises.

    Exchanged through the job's key-value store (the process group's rendezvous store), not a collective on the
    group's backend: a NCCL group would need each rank's CUDA device set first, which a training script may not have
    done yet, and a store needs none. What is exchanged is plain JSON, never a pickle. Every rank must call it at the
    same point (as every sampler's first iteration is); without an initialised process group it does nothing.

    Raises:
        PlanMismatchError: some rank holds other terms (one line: the nodes and ranks that differ, both terms),
            or the process group is not the size of the plan.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    from planner.runtime.rebalance_faults import default_store

    store = default_store()
    world_size, rank = dist.get_world_size(), dist.get_rank()
    if store is None:  # a torch without the private accessor: the same check over a collective
        gathered: list = [None] * world_size
        dist.all_gather_object(gathered, (terms.digest(), _this_node(), terms))
    else:
        # one key per rank, per sampler in creation order and per torchrun restart: every rank counts alike
        prefix = (
            f"batchplan-plan-agreement/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{next(_rounds)}"
        )
        mine = {"node": _this_node(), "terms": asdict(terms)}
        store.set(f"{prefix}/{rank}", json.dumps(mine))
        keys = [f"{prefix}/{r}" for r in range(world_size)]
        store.wait(keys)
        gathered = [_entry(store.get(key)) for key in keys]
        # rank 0 may host the store (an env:// launch without torchrun's agent): it leaves only after every rank
        # has read, or a rank still reading would meet a closed store instead of the mismatch's one line
        store.set(f"{prefix}/read/{rank}", "1")
        if rank == 0:
            store.wait([f"{prefix}/read/{r}" for r in range(world_size)])
    problem = mismatch(gathered, world_size, what=what)
    if problem is not None:
        raise PlanMismatchError(problem)


def _entry(raw: bytes) -> tuple[str, str, SplitTerms]:
    """A rank's filed terms as :func:`mismatch` takes them."""
    data = json.loads(raw)
    fields = data["terms"]
    terms = SplitTerms(
        batches=tuple(int(b) for b in fields["batches"]),
        accumulate=int(fields["accumulate"]),
        dataset_size=int(fields["dataset_size"]),
        shuffle=bool(fields["shuffle"]),
        seed=int(fields["seed"]),
        drop_last=bool(fields["drop_last"]),
    )
    return terms.digest(), str(data["node"]), terms


def mismatch(gathered: Sequence[tuple[str, str, SplitTerms]], world_size: int, *, what: str) -> str | None:
    """The one line for ranks that do not hold the same terms (``gathered[rank] = (digest, node, terms)``),
    or None where they all do and the plan has ``world_size`` ranks. Pure: the same on every rank."""
    groups: dict[str, list[int]] = {}
    for rank, (digest, _, _) in enumerate(gathered):
        groups.setdefault(digest, []).append(rank)
    if len(groups) == 1:
        planned = len(gathered[0][2].batches)
        if planned == world_size:
            return None
        return (
            f"{what} is for {planned} ranks but the job has {world_size}: every rank holds the same plan, made "
            "for another launch (re-plan for this job, or launch with the plan's torchrun lines)"
        )
    # the terms most ranks hold are "the plan"; a tie goes to the terms of rank 0
    usual = max(groups, key=lambda d: (len(groups[d]), d == gathered[0][0]))
    odd = [rank for digest, ranks in groups.items() if digest != usual for rank in ranks]
    nodes = list(dict.fromkeys(gathered[rank][1] for rank in odd))
    ranks = ", ".join(str(r) for r in odd[:_MAX_NAMED]) + (", ..." if len(odd) > _MAX_NAMED else "")
    where = ", ".join(nodes[:_MAX_NAMED]) + (
        f" and {len(nodes) - _MAX_NAMED} more" if len(nodes) > _MAX_NAMED else ""
    )
    other = gathered[odd[0]][2]
    return (
        f"the ranks do not agree on {what}: node(s) {where} (rank(s) {ranks}) hold {other.describe()}, the "
        f"other {len(groups[usual])} rank(s) {gathered[groups[usual][0]][2].describe()}; their slices of each "
        "global batch would overlap (copy the same plan.json, and plan.json.index, to every node and start "
        "every rank again)"
    )
