"""A re-balancing DDP job (three gloo ranks on 127.0.0.1) one of whose ranks hangs, is stopped (SIGSTOP) or
dies at a step boundary: every other rank ends within the re-balancer's own timeout plus the few seconds it
takes to name the rank, far under the process group's default (30 min) and the issue's 60 s, each with one
line naming the rank.

The model has BatchNorm, so DDP broadcasts its buffers from rank 0 on the *default* process group before
every forward: a rank 0 that hangs keeps the others waiting in that broadcast, outside the re-balancer's
own group (``planner.runtime.default_group_timeout`` lowers the default group's timeout inside
``Rebalancer.compute()``). A rank stopped with SIGSTOP answers nothing, its store client included.

Timing: the assertion is a bound (timeout + 10 s, against a 30-minute default), not a measurement.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from tests.gloo import GlooRanks
from tests.planner.runtime.rebalance_helpers import SAMPLE_S, SPEEDS, STEP_BATCH, wrong_plan

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(300)]

WORLD_SIZE = 3
TIMEOUT_S = 10  # the re-balancer's collective timeout; the process group keeps its default (30 min)
FAULT_STEP = 3  # the victim stops after this optimizer step's step_done (not a gathering step)
STEPS = 8


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(), torch.nn.Linear(8, 1)
    ).double()


def _fault(kind: str, out_dir: str) -> None:
    Path(out_dir, "fault_at").write_text(str(time.time()))
    if kind == "die":
        os._exit(3)
    if kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(30 * TIMEOUT_S)  # hang (and after a SIGCONT): the parent kills this process


def _worker(rank: int, out_dir: str, kind: str, victim: int) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from planner.errors import RebalanceError
    from planner.runtime.rebalance import Rebalancer
    from planner.runtime.rebalance_model import RebalancePolicy
    from planner.runtime.sampler import PlannedBatchSampler
    from planner.runtime.simulate import SimulatedSpeed

    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)  # the default timeout: 30 min
    plan = wrong_plan(2.0)
    sampler = PlannedBatchSampler(20 * STEP_BATCH, [r["batch"] for r in plan["ranks"]], rank, seed=5)
    model = DistributedDataParallel(_model())  # broadcast_buffers=True: BatchNorm's statistics from rank 0
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    rebalancer = Rebalancer.from_plan(
        plan,
        sampler,
        model,
        policy=RebalancePolicy(),
        collective_timeout_s=TIMEOUT_S,
        simulate=SimulatedSpeed(factors=SPEEDS, sample_s=SAMPLE_S),
    )
    generator = torch.Generator().manual_seed(rank)
    result = {"error": None, "error_at": None, "steps": 0}
    try:
        for step, _ in zip(range(STEPS), sampler, strict=False):
            optimizer.zero_grad(set_to_none=True)
            with rebalancer.compute():
                x = torch.randn(rebalancer.batch, 4, generator=generator, dtype=torch.float64)
                (model(x).square().mean() * rebalancer.loss_weight).backward()
            optimizer.step()
            rebalancer.step_done()
            result["steps"] = step + 1
            if rank == victim and step + 1 == FAULT_STEP:
                _fault(kind, out_dir)
    except RebalanceError as exc:
        result.update(error=str(exc), error_at=time.time())
    except Exception as exc:  # anything else is recorded so that the test shows it
        result.update(error=f"unexpected {type(exc).__name__}: {exc}", error_at=time.time())
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    os._exit(0)  # a process group with a dead peer can hang in its own teardown


@pytest.mark.parametrize("kind, victim", [("hang", 0), ("stop", 1), ("die", 2)])
def test_every_other_rank_ends_within_the_rebalancers_timeout_naming_the_rank(tmp_path, kind, victim) -> None:
    survivors = [r for r in range(WORLD_SIZE) if r != victim]
    with GlooRanks(
        _worker, str(tmp_path), kind, victim, world_size=WORLD_SIZE, log_dir=tmp_path / "logs"
    ) as ranks:
        ranks.wait(200, ranks=survivors)
        ranks.kill(victim)  # SIGKILL ends a stopped process too
    assert all(code is not None for code in ranks.exitcodes), ranks.describe()
    fault_at = float((tmp_path / "fault_at").read_text())
    for rank in survivors:
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        error = result["error"]
        assert error is not None, f"rank {rank} did not fail: {result}"
        assert "\n" not in error and error.startswith(
            f"rebalance: rank {victim} stopped answering after optimizer step {FAULT_STEP}"
        ), error
        assert f"rank {rank} stops too" in error
        assert result["error_at"] - fault_at < TIMEOUT_S + 10, (rank, result["error_at"] - fault_at, error)
