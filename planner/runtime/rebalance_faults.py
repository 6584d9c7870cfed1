"""Which rank stopped answering: the survivors of a failed re-balancer collective name it in one line.

A collective that fails (gloo: connection closed by a dead peer, or the re-balancer's own timeout) says
neither which rank is gone nor why. Each surviving rank therefore writes "rank r reached the failure at
step s" into the job's key-value store (the process group's rendezvous store, which torchrun's agent hosts)
and waits a short grace for the others' marks: the ranks without a mark are the ones that died or hung.
Nothing is written while the job is healthy; the cost is paid only on the way out.

Known limitations: a job whose store lives in the dead rank (rank 0 of a plain ``env://`` launch without
torchrun) cannot be asked; the line then says that the rank could not be named.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["default_store", "missing_ranks"]

_POLL_S = 0.05


def default_store() -> Any | None:
    """The default process group's store, or None (torch keeps it private; an older or newer torch without
    it only loses the naming)."""
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except Exception:  # no process group, or the private accessor is gone
        return None


def missing_ranks(store: Any, prefix: str, rank: int, world_size: int, step: int, grace_s: float) -> list[int] | None:
    """The ranks other than ``rank`` that did not mark the failure within ``grace_s``; None when the store
    cannot be reached.

    Args:
        prefix: a key prefix unique to this re-balancer (all ranks use the same).
        step: the optimizer step this rank failed after (written with its mark).
    """
    if store is None:
        return None
    try:
        store.set(f"{prefix}/failed/{rank}", str(step))
        waiting = [r for r in range(world_size) if r != rank]
        deadline = time.monotonic() + grace_s
        while waiting and time.monotonic() < deadline:
            waiting = [r for r in waiting if not store.check([f"{prefix}/failed/{r}"])]
            if waiting:
                time.sleep(_POLL_S)
        return waiting
    except Exception:  # the store's host is gone too
        return None
