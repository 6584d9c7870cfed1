"""autobatch_ddp with 4 real gloo processes on 127.0.0.1, as 2 nodes × 2 ranks with a simulated GPU type per
node: every rank holds the same plan, and only the first rank of each node profiles."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.gloo import run_ranks

pytestmark = [pytest.mark.dist, pytest.mark.slow]

WORLD_SIZE = 4
NODE_GPU = {0: "A100-SXM4-80GB", 1: "T4"}  # GROUP_RANK -> simulated GPU type of that node


def _worker(rank: int, out_dir: str) -> None:
    import torch.distributed as dist

    node = rank // 2
    os.environ.update(LOCAL_RANK=str(rank % 2), GROUP_RANK=str(node))  # 2 nodes × 2 ranks
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        from planner.codec import encode
        from planner.job import JobSpec
        from planner.runtime import autobatch_ddp

        job = JobSpec(
            model="tests.planner.tiny_models:convnet",
            input_shape=(3, 32, 32),
            global_batch=2048,
            multiple_of=8,
        )
        # each node its own cache directory, as nodes without a shared file system
        result = autobatch_ddp(job, gpu=NODE_GPU[node], cache_dir=Path(out_dir) / f"cache-node{node}")
        Path(out_dir, f"rank{rank}.json").write_text(
            json.dumps(
                {
                    "plan": encode(result.plan),
                    "profiled_here": list(result.profiled_here),
                    "batch": result.rank_plan.batch,
                    "loss_weight": result.rank_plan.loss_weight,
                }
            )
        )
        # every rank done before any tears gloo down: a rank leaving early can abort a peer mid-collective
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out_dir = tmp_path_factory.mktemp("autobatch_ddp")
    run_ranks(_worker, str(out_dir), world_size=WORLD_SIZE, log_dir=out_dir / "logs")
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(WORLD_SIZE)]


def test_every_rank_holds_the_byte_identical_plan(ranks):
    texts = {json.dumps(r["plan"], sort_keys=True) for r in ranks}
    assert len(texts) == 1
    plan = ranks[0]["plan"]
    assert plan["world_size"] == WORLD_SIZE
    assert plan["global_batch"] == 2048
    assert [e["gpu"] for e in plan["ranks"]] == ["A100-SXM4-80GB", "A100-SXM4-80GB", "T4", "T4"]


def test_only_the_first_rank_of_each_node_profiles(ranks):
    assert [r["profiled_here"] for r in ranks] == [["A100-SXM4-80GB"], [], ["T4"], []]


def test_each_rank_takes_its_own_entry_with_an_exact_loss_weight(ranks):
    plan = ranks[0]["plan"]
    for rank, result in enumerate(ranks):
        entry = plan["ranks"][rank]
        assert result["batch"] == entry["batch"]
        assert result["loss_weight"] == pytest.approx(entry["batch"] * WORLD_SIZE / plan["step_batch"])
    assert sum(r["batch"] for r in ranks) == plan["step_batch"]
    # the faster, larger card gets more samples
    assert ranks[0]["batch"] > ranks[2]["batch"]
