"""The default process group's timeout, lowered while a re-balanced micro-step runs.

Inside ``Rebalancer.compute()`` DDP itself runs collectives on the default process group, not on the
re-balancer's own: the broadcast of the module's buffers from rank 0 before every forward (BatchNorm's running
statistics, with ``broadcast_buffers=True``, DDP's default) and, once, the broadcast of the rebuilt bucket
order before the second forward. With the group's default timeout (30 min for gloo, 10 for NCCL) a rank 0 that
hangs keeps every other rank waiting there that long. So while the block runs, the default group's
collectives time out after the re-balancer's ``collective_timeout_s`` (``torch.distributed``'s
``_set_pg_timeout``, on each backend of the group), and the previous timeout is put back when it ends: the
training loop's own collectives outside the block (a checkpoint barrier) keep theirs.

Known limitations: the timeout is read from and written to private torch API (a backend's ``options._timeout``,
``_set_pg_timeout``); where either is missing the block runs with the group's own timeout, said once in the
log. With NCCL a timed-out collective aborts the process (NCCL's watchdog) instead of raising, so the job still
ends within the bound but without the one line naming the rank. DDP's constructor (its parameter broadcast)
runs before any re-balancer exists and keeps the group's timeout.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["is_collective_failure", "lowered_default_timeout"]

#: words of the errors gloo and NCCL raise for a dead peer or a timeout (``RuntimeError``s; newer torch
#: raises ``torch.distributed.DistError`` subclasses, recognised by type)
#: ("Application timeout caused pair closure": gloo, on a rank whose peer's pair was closed by that peer's timeout)
_COLLECTIVE_ERROR_WORDS = (
    "gloo",
    "NCCL",
    "Connection closed by peer",
    "Connection reset by peer",
    "Timed out",
    "pair closure",
)
_said: list[bool] = []


def _backends(group: Any) -> list[Any]:
    import torch

    found = []
    for device in ("cpu", "cuda"):
        with contextlib.suppress(Exception):  # a group without a backend for that device
            backend = group._get_backend(torch.device(device))
            if backend not in found:
                found.append(backend)
    return found


@contextlib.contextmanager
def lowered_default_timeout(timeout_s: float) -> Iterator[bool]:
    """While the block runs the default group's collectives time out after ``timeout_s``; yields whether they
    do (False: no default group, or this torch does not let the timeout be read or set)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        yield False
        return
    try:
        from torch.distributed.distributed_c10d import _get_default_group, _set_pg_timeout

        group = _get_default_group()
        previous = [(backend, backend.options._timeout) for backend in _backends(group)]
        if not previous:
            raise AttributeError("no gloo or NCCL backend")
        _set_pg_timeout(timedelta(seconds=timeout_s), group)
    except Exception as exc:  # private API moved: the group's own timeout applies
        if not _said:
            _said.append(True)
            log.warning(
                "rebalance: the default process group's timeout cannot be lowered here (%s): DDP's buffer "
                "broadcast keeps the group's own timeout",
                exc,
            )
        yield False
        return
    try:
        yield True
    finally:
        for backend, timeout in previous:
            with contextlib.suppress(Exception):
                backend._set_default_timeout(timeout)


def is_collective_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that failed (a dead peer, a timeout) rather than the training code's own
    error."""
    import torch.distributed as dist

    dist_error = getattr(dist, "DistError", None)
    if dist_error is not None and isinstance(exc, dist_error):
        return True
    return isinstance(exc, RuntimeError) and any(word in str(exc) for word in _COLLECTIVE_ERROR_WORDS)
