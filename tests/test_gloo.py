"""tests/gloo.py, the launcher every multi-process test uses: each rank gets torchrun's environment and a
working gloo group on 127.0.0.1, and when a rank fails or hangs the failure shows every rank's output (a hung
rank's stacks included) instead of a bare exit code."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path

import pytest

from tests.gloo import GlooRanks, RanksFailed, run_ranks

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(300)]

LAUNCH_ENV = ("MASTER_ADDR", "RANK", "LOCAL_RANK", "WORLD_SIZE", "GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS")


def _all_reduce(rank: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]), timeout=timedelta(seconds=120)
    )
    total = torch.tensor([rank + 1])
    dist.all_reduce(total)
    print(f"rank {rank} sums to {int(total)}")
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({name: os.environ[name] for name in LAUNCH_ENV}))
    dist.destroy_process_group()


def _rank_one_fails(rank: int) -> None:
    print(f"rank {rank} was here")
    if rank == 1:
        raise ValueError("boom on rank 1")


def _rank_zero_hangs(rank: int, ready: str) -> None:
    if rank == 0:
        Path(ready).write_text("ready")
        _sleep_forever()


def _sleep_forever() -> None:
    time.sleep(3600)


def test_ranks_get_torchrun_s_environment_and_one_gloo_group(tmp_path: Path) -> None:
    outputs = run_ranks(_all_reduce, str(tmp_path), world_size=3, log_dir=tmp_path / "logs")
    assert [line for text in outputs for line in text.splitlines() if "sums" in line] == [
        f"rank {r} sums to 6" for r in range(3)
    ]
    for rank in range(3):
        env = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert env == {
            "MASTER_ADDR": "127.0.0.1",
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "3",
            "GLOO_SOCKET_IFNAME": "lo",
            "OMP_NUM_THREADS": "1",
        }


def test_a_failing_rank_fails_the_launch_showing_every_rank_s_output(tmp_path: Path) -> None:
    with pytest.raises(RanksFailed) as failed:
        run_ranks(_rank_one_fails, world_size=2, log_dir=tmp_path)
    message = str(failed.value)
    assert "exit codes [0, 1], expected [0, 0]" in message
    assert "rank 0 was here" in message and "rank 1 was here" in message
    assert "ValueError: boom on rank 1" in message


def test_a_rank_past_the_deadline_fails_the_launch_with_its_stacks(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    with GlooRanks(_rank_zero_hangs, str(ready), world_size=2, log_dir=tmp_path / "logs") as ranks:
        ranks.wait(240, ranks=[1])
        deadline = (
            time.monotonic() + 240
        )  # rank 0 imports torch first: seconds, or a minute on a loaded machine
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        with pytest.raises(RanksFailed) as failed:
            ranks.wait(1.0)
    assert "rank(s) [0] still running after 1 s" in str(failed.value)
    assert "_sleep_forever" in str(failed.value)  # faulthandler's dump of the hung rank
    assert ranks.exitcodes[0] is not None and ranks.exitcodes[1] == 0  # and close() ended it
