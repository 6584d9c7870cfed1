"""Which rank stopped answering: the survivors of a failed re-balancer collective name it in one line.

A collective that fails (gloo: connection closed by a dead peer, or the re-balancer's own timeout) says
neither which rank is gone nor why. Each surviving rank therefore writes "rank r reached the failure at
step s" into the job's key-value store (the process group's rendezvous store, which torchrun's agent hosts)
and waits a short grace for the others' marks: the ranks without a mark are the ones that died or hung. Each
then waits (the same grace at most) until every survivor has named, so that a survivor hosting the store
does not take it away from one still asking.
Nothing is written while the job is healthy; the cost is paid only on the way out.

The store is asked with its timeout lowered to the grace (a store host stopped with SIGSTOP answers nothing,
and the store's own timeout is the process group's: 30 min).

Known limitations: a job whose store lives in the dead or stopped rank (rank 0 of a plain ``env://`` launch
without torchrun) cannot be asked; the line then says that the rank could not be named.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

__all__ = ["default_store", "lowered_store_timeout", "missing_ranks"]

_POLL_S = 0.05


def default_store() -> Any | None:
    """The default process group's store, or None (torch keeps it private; an older or newer torch without
    it only loses the naming)."""
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except Exception:  # no process group, or the private accessor is gone
        return None


def missing_ranks(
    store: Any, prefix: str, rank: int, world_size: int, step: int, grace_s: float
) -> list[int] | None:
    """The ranks other than ``rank`` that did not mark the failure within ``grace_s``; None when the store
    cannot be reached.

    Args:
        prefix: a key prefix unique to this re-balancer (all ranks use the same).
        step: the optimizer step this rank failed after (written with its mark).
    """
    if store is None:
        return None
    previous = _lower_timeout(
        store, grace_s
    )  # a stopped (SIGSTOP) store host must not hold us for its timeout
    try:
        try:
            store.set(f"{prefix}/failed/{rank}", str(step))
            others = [r for r in range(world_size) if r != rank]
            missing = _unmarked(store, f"{prefix}/failed", others, grace_s)
        except Exception:  # the store's host is gone too, or stopped
            return None
        # then wait (as long again at most) for every survivor to have named: the rank that hosts the store (rank 0
        # of a plain env:// launch) must not end it while another is still asking. What this rank found stands
        # whatever happens to the store now (a survivor may end the named rank, and with it the store it hosted)
        with contextlib.suppress(Exception):
            store.set(f"{prefix}/named/{rank}", "1")
            _unmarked(store, f"{prefix}/named", [r for r in others if r not in missing], grace_s)
        return missing
    finally:
        if previous is not None:
            with contextlib.suppress(Exception):
                store.set_timeout(previous)


def _unmarked(store: Any, prefix: str, ranks: list[int], grace_s: float) -> list[int]:
    """The ``ranks`` whose key ``prefix/rank`` is still absent after ``grace_s``."""
    waiting = list(ranks)
    deadline = time.monotonic() + grace_s
    while waiting and time.monotonic() < deadline:
        waiting = [r for r in waiting if not store.check([f"{prefix}/{r}"])]
        if waiting:
            time.sleep(_POLL_S)
    return waiting


@contextlib.contextmanager
def lowered_store_timeout(store: Any, seconds: float):
    """While the block runs, ``store``'s operations time out after ``seconds`` (a stopped or gone store host must
    not hold a failing rank for the store's own timeout, 30 min)."""
    previous = _lower_timeout(store, seconds)
    try:
        yield
    finally:
        if previous is not None:
            with contextlib.suppress(Exception):
                store.set_timeout(previous)


def _lower_timeout(store: Any, seconds: float) -> Any | None:
    """Set the store's timeout to ``seconds``; the previous one, or None when it cannot be read or set (the
    store's own timeout then bounds the naming: 30 min for a default ``env://`` group)."""
    from datetime import timedelta

    try:
        previous = store.timeout
        store.set_timeout(timedelta(seconds=seconds))
        return previous
    except Exception:
        return None
