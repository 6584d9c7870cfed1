"""``torch_distributed_zero_first``: let the first rank of each node do a job (download, cache, profile)
while the other ranks wait, then let them follow — and tell them when it failed.

The seed (Ultralytics ``torch_utils``) used two bare barriers: ranks other than 0 wait at a barrier before
the body, rank 0 hits it after the body. If rank 0's body raises, rank 0 never reaches its barrier and the
others hang until the process-group timeout (hours). Here the first ranks publish a status after their body,
in a ``finally``, through one ``all_gather_object`` every rank takes part in: the waiting ranks are released
as soon as the first ranks are done, and raise ``RuntimeError("rank N failed inside
torch_distributed_zero_first: ...")`` at once if one of them failed.

Known limitations: every rank of the default process group must enter the context (as with the seed's
barriers). With NCCL the status travels through the current CUDA device, so each rank must have called
``torch.cuda.set_device`` first (the seed's barrier needed the same, pytorch#53934).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

LOGGER = logging.getLogger(__name__)

__all__ = ["torch_distributed_zero_first"]

# what a first rank publishes: None for "ok"; a waiting rank publishes _WAITING
_WAITING = "waiting"


def _gather_status(status: object) -> list[object]:
    import torch.distributed as dist

    statuses: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(statuses, status)
    return statuses


def _failures(statuses: list[object]) -> list[tuple[int, str]]:
    return [(rank, str(s)) for rank, s in enumerate(statuses) if s is not None and s != _WAITING]


@contextmanager
def torch_distributed_zero_first(local_rank: int) -> Iterator[None]:
    """Run the body on the first rank of every node (``local_rank`` 0, or -1) before the other ranks.

    A no-op when ``torch.distributed`` is not initialised. The first ranks run the body, then report ok or
    failed; the others wait for that report before running the body. If any first rank's body raised, that
    rank re-raises its own exception and every other rank raises
    ``RuntimeError("rank N failed inside torch_distributed_zero_first: <exception>")`` instead of running the
    body, within the time one collective takes (not at the process-group timeout).

    Differences from the seed: exception-safe (above); ``local_rank == -1`` under an initialised process
    group counts as a first rank (the seed skipped both barriers for it, which hung the others); a first rank
    whose own body succeeded still raises when another node's first rank failed, since the job cannot go on.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        yield
        return
    rank = dist.get_rank()
    if local_rank not in {-1, 0}:
        failures = _failures(_gather_status(_WAITING))
        if failures:
            first_rank, message = failures[0]
            raise RuntimeError(f"rank {first_rank} failed inside torch_distributed_zero_first: {message}")
        yield
        return

    try:
        yield
    except BaseException as exc:
        message = f"{type(exc).__name__}: {exc}"
        try:
            _gather_status(message)
        except Exception as report_error:  # the group is broken too; keep the original exception
            LOGGER.error("rank %d could not tell the other ranks that it failed: %s", rank, report_error)
        raise
    failures = _failures(_gather_status(None))
    if failures:
        first_rank, message = failures[0]
        raise RuntimeError(f"rank {first_rank} failed inside torch_distributed_zero_first: {message}")
