"""autobatch_ddp followed by re-balancing: three gloo ranks plan their batches in the job from estimated
profiles (simulated T4, A10, A100), then run with simulated speeds 1,2,4 that contradict the estimate; the
re-balancer moves the split to the optimum for those speeds under the plan's caps."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.gloo import run_ranks

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(300)]

WORLD_SIZE = 3
GPUS = ("T4", "A10", "A100-SXM4-80GB")
SPEEDS = (1.0, 2.0, 4.0)  # the A100 "runs" slowest: the estimate cannot know that
SAMPLE_S = 0.003
GLOBAL_BATCH, MULTIPLE_OF = 56, 8


def _worker(rank: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    os.environ.update(LOCAL_RANK="0", GROUP_RANK=str(rank))  # each rank a node of its own
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        from planner.codec import encode
        from planner.job import JobSpec
        from planner.runtime import PlannedBatchSampler, SimulatedSpeed, autobatch_ddp

        job = JobSpec(
            model="tests.planner.tiny_models:convnet",
            input_shape=(3, 32, 32),
            global_batch=GLOBAL_BATCH,
            multiple_of=MULTIPLE_OF,
            method="estimate",
        )
        result = autobatch_ddp(job, gpu=GPUS[rank], cache_dir=Path(out_dir) / f"cache-{rank}")
        x = torch.randn(10 * GLOBAL_BATCH, 8)
        y = x.sum(dim=1, keepdim=True)
        sampler = PlannedBatchSampler.from_plan(result.rank_plan, len(x), seed=0)
        model = DistributedDataParallel(torch.nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        rebalancer = result.rebalancer(
            sampler, model, simulate=SimulatedSpeed(factors=SPEEDS, sample_s=SAMPLE_S)
        )
        for step, indices in enumerate(sampler, start=1):
            optimizer.zero_grad()
            with rebalancer.compute():
                (
                    torch.nn.functional.mse_loss(model(x[indices]), y[indices]) * rebalancer.loss_weight
                ).backward()
            optimizer.step()
            rebalancer.step_done()
            if step == 10:
                break
        plan_path = Path(out_dir) / "plan.json"
        rebalancer.write_feedback(plan_path, Path(out_dir) / "measured-cache")
        Path(out_dir, f"rank{rank}.json").write_text(
            json.dumps(
                {
                    "plan": encode(result.plan),
                    "line": rebalancer.report().line(samples_once=True),
                    "batches_last": list(rebalancer.report().batches_last),
                }
            )
        )
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> tuple[list[dict], Path]:
    out_dir = tmp_path_factory.mktemp("rebalance_autobatch")
    run_ranks(_worker, str(out_dir), world_size=WORLD_SIZE, log_dir=out_dir / "logs")
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(WORLD_SIZE)], out_dir


def test_the_in_job_plan_is_corrected_to_the_optimum_for_the_speeds_that_ran(ranks):
    from planner.allocate.allocation import allocate

    results, out_dir = ranks
    plan = results[0]["plan"]
    caps = [r["max_batch"] for r in plan["ranks"]]
    start = [r["batch"] for r in plan["ranks"]]
    best = allocate(
        caps,
        [0.0] * 3,
        [k * SAMPLE_S for k in SPEEDS],
        global_batch=GLOBAL_BATCH,
        multiple_of=MULTIPLE_OF,
        min_batch=MULTIPLE_OF,
    ).batches.tolist()
    assert start != best  # the estimate and the simulated speeds disagree: there is something to correct
    assert len({r["line"] for r in results}) == 1
    assert "switches=0 " not in results[0]["line"]
    for r in results:
        assert all(abs(a - b) <= MULTIPLE_OF for a, b in zip(r["batches_last"], best, strict=True))
    # rank 0 wrote the plan back with the measured section; the others wrote nothing
    updated = json.loads((out_dir / "plan.json").read_text())
    assert [r["batch"] for r in updated["ranks"]] == results[0]["batches_last"]
    assert updated["probing"]["backend"] == "autobatch_ddp"
    assert updated["measured"]["batches_first"] == start
