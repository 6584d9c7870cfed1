"""torchkit.process.zero_first.torch_distributed_zero_first: a no-op without a process group; with real gloo
processes on 127.0.0.1 (tests/gloo.py), the first rank runs first, and its failure releases the others at once.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path

import pytest

from tests.gloo import run_ranks
from torchkit.process.zero_first import torch_distributed_zero_first

WORLD_SIZE = 3
PG_TIMEOUT_S = 120  # a waiting rank must be released long before this
# rank 0 sleeps this long inside the body, so a rank that did not wait would start inside that window
RANK0_BODY_S = 1.0


# ------------------------------------------------------------------------------------------------ worker


def _run_and_record(local_rank: int, fail_rank: int | None, rank: int, record: dict) -> None:
    """One zero-first round: the body records when it ran; ``fail_rank`` raises inside it."""
    try:
        with torch_distributed_zero_first(local_rank):
            record["body_start"] = time.monotonic()
            if rank == fail_rank:
                record["raised_at"] = time.monotonic()
                raise ValueError("dataset download failed")
            if rank == 0:
                time.sleep(RANK0_BODY_S)
            record["body_end"] = time.monotonic()
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["error_at"] = time.monotonic()


def worker(rank: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=PG_TIMEOUT_S))
    result: dict = {"rank": rank}
    rounds = {
        # one node: local rank = rank, nobody fails
        "ordered": (rank, None),
        # one node: rank 0 fails inside the body
        "rank0_fails": (rank, 0),
        # two "nodes" (local ranks 0, 1, 0): rank 2 is the first rank of the second node and fails
        "other_node_fails": ([0, 1, 0][rank], 2),
    }
    for name, (local_rank, fail_rank) in rounds.items():
        result[name] = {}
        _run_and_record(local_rank, fail_rank, rank, result[name])
    total = torch.tensor([rank])
    dist.all_reduce(total)  # the group still works after the failures
    result["all_reduce"] = int(total.item())
    dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))


# ------------------------------------------------------------------------------------------------ tests


@pytest.fixture(scope="module")
def gloo_results(tmp_path_factory) -> dict[int, dict]:
    out_dir = tmp_path_factory.mktemp("zero_first")
    # generous: 3 processes import torch on a shared 2-core machine; every rank must exit 0
    run_ranks(
        worker, str(out_dir), world_size=WORLD_SIZE, deadline_s=2 * PG_TIMEOUT_S, log_dir=out_dir / "logs"
    )
    return {rank: json.loads(Path(out_dir, f"rank{rank}.json").read_text()) for rank in range(WORLD_SIZE)}


def test_without_a_process_group_it_is_a_no_op():
    ran = []
    with torch_distributed_zero_first(0):
        ran.append(0)
    with torch_distributed_zero_first(1):
        ran.append(1)
    assert ran == [0, 1]
    with pytest.raises(KeyError, match="boom"), torch_distributed_zero_first(0):
        raise KeyError("boom")


def test_single_rank_group_reraises_its_own_error_and_stays_usable():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="first rank failed"), torch_distributed_zero_first(0):
            raise ValueError("first rank failed")
        with torch_distributed_zero_first(-1):
            pass
        value = torch.tensor([5])
        dist.all_reduce(value)
        assert int(value.item()) == 5
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.dist
def test_first_rank_finishes_before_the_others_start(gloo_results):
    rank0_end = gloo_results[0]["ordered"]["body_end"]
    for rank in (1, 2):
        record = gloo_results[rank]["ordered"]
        assert "error" not in record
        assert record["body_start"] >= rank0_end, f"rank {rank} started before rank 0 finished"


@pytest.mark.slow
@pytest.mark.dist
def test_first_rank_failure_releases_the_others_with_its_error(gloo_results):
    failing = gloo_results[0]["rank0_fails"]
    assert failing["error"] == "ValueError: dataset download failed"
    for rank in (1, 2):
        record = gloo_results[rank]["rank0_fails"]
        assert "body_start" not in record, f"rank {rank} ran the body after rank 0 failed"
        assert record["error"] == (
            "RuntimeError: rank 0 failed inside torch_distributed_zero_first: ValueError: dataset download failed"
        )
        # a behaviour bound, not a benchmark: released far sooner than the 120 s process-group timeout
        assert record["error_at"] - failing["raised_at"] < PG_TIMEOUT_S / 4


@pytest.mark.slow
@pytest.mark.dist
def test_a_failing_first_rank_on_another_node_stops_every_rank(gloo_results):
    assert gloo_results[2]["other_node_fails"]["error"] == "ValueError: dataset download failed"
    expected = (
        "RuntimeError: rank 2 failed inside torch_distributed_zero_first: ValueError: dataset download failed"
    )
    # rank 0 (first on its node, body succeeded) and rank 1 (waiting) both learn of it
    assert gloo_results[0]["other_node_fails"]["error"] == expected
    assert "body_end" in gloo_results[0]["other_node_fails"]
    assert gloo_results[1]["other_node_fails"]["error"] == expected
    assert "body_start" not in gloo_results[1]["other_node_fails"]


@pytest.mark.slow
@pytest.mark.dist
def test_the_group_keeps_working_after_a_failure(gloo_results):
    assert [gloo_results[rank]["all_reduce"] for rank in range(WORLD_SIZE)] == [0 + 1 + 2] * WORLD_SIZE
