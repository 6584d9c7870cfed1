"""planner.runtime.default_group_timeout: the default group's timeout lowered inside the block and put back
after it; which errors are a collective's. One gloo process group (world size 1) in this process, its store in
memory (no port to pick)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from planner.runtime.default_group_timeout import is_collective_failure, lowered_default_timeout

pytestmark = pytest.mark.dist


def _timeout() -> timedelta:
    from torch.distributed.distributed_c10d import _get_default_group

    return _get_default_group()._get_backend(torch.device("cpu")).options._timeout


@pytest.fixture
def one_rank_group():
    dist.init_process_group(
        "gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=1234)
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_the_timeout_is_lowered_in_the_block_and_put_back_after(one_rank_group):
    assert _timeout() == timedelta(seconds=1234)
    with lowered_default_timeout(7.5) as lowered:
        assert lowered and _timeout() == timedelta(seconds=7.5)
    assert _timeout() == timedelta(seconds=1234)
    with pytest.raises(ValueError), lowered_default_timeout(3):
        raise ValueError("the step's own error")
    assert _timeout() == timedelta(seconds=1234)


def test_without_a_process_group_nothing_is_lowered():
    assert not dist.is_initialized()
    with lowered_default_timeout(5) as lowered:
        assert lowered is False


@pytest.mark.parametrize(
    "error, collective",
    [
        (
            RuntimeError(
                "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 10000ms"
            ),
            True,
        ),
        (RuntimeError("Application timeout caused pair closure"), True),
        (RuntimeError("NCCL communicator was aborted"), True),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 4x8)"), False),
        (ValueError("Timed out"), False),  # not a RuntimeError: the training code's own
    ],
)
def test_which_errors_are_a_collectives(error, collective):
    assert is_collective_failure(error) is collective
