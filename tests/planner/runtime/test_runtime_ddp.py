"""Uneven batches under real DDP: three gloo processes on 127.0.0.1 with batches 5/3/8.

With the planned sampler and the loss weights b_i·W/B, the gradient DDP leaves on every rank must equal
the gradient a single process computes for the mean loss over the same 16 samples (float64, 1e-6); without
the weights it must not. One spawn runs every scenario (starting processes is the slow part); each test
then checks one claim against a single-process reference computed here.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import torch

from planner.runtime.sampler import PlannedBatchSampler
from planner.runtime.weights import loss_weight, sum_loss_scale
from tests.gloo import run_ranks

BATCHES = (5, 3, 8)
WORLD_SIZE = len(BATCHES)
STEP_BATCH = sum(BATCHES)
DATASET_SIZE = 80  # 5 global steps per epoch
TRAIN_STEPS = 3
LEARNING_RATE = 0.1
SEED = 1234
TOLERANCE = 1e-6

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(180)]


def make_data() -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic regression data, identical in every process."""
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(DATASET_SIZE, 4, generator=generator, dtype=torch.float64)
    # targets whose scale grows with the index, so the ranks' mean losses differ clearly from the global mean
    y = torch.sin(x.sum(dim=1, keepdim=True)) * (
        1 + torch.arange(DATASET_SIZE, dtype=torch.float64).unsqueeze(1) / 10
    )
    return x, y


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()


def flat_grad(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.detach().reshape(-1).clone() for p in model.parameters()])


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def _worker(rank: int, out_dir: str) -> None:
    """One rank: every scenario on the same process group; results saved for the parent to compare."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=60))
    try:
        x, y = make_data()
        weight = loss_weight(BATCHES[rank], WORLD_SIZE, STEP_BATCH)
        result: dict[str, object] = {"weight": weight}

        def train(scale_loss: bool) -> tuple[list[list[int]], list[torch.Tensor], torch.Tensor]:
            model = DistributedDataParallel(make_model())
            optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
            sampler = PlannedBatchSampler(DATASET_SIZE, BATCHES, rank, seed=SEED)
            sampler.set_epoch(1)
            indices, grads = [], []
            for step, batch in enumerate(sampler):
                if step == TRAIN_STEPS:
                    break
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x[batch]), y[batch])
                (loss * weight if scale_loss else loss).backward()
                indices.append(batch)
                grads.append(flat_grad(model))
                optimizer.step()
            return indices, grads, flat_params(model)

        result["indices"], result["weighted_grads"], result["weighted_params"] = train(scale_loss=True)
        _, result["unweighted_grads"], _ = train(scale_loss=False)

        # token-style reduction: sum of per-sample losses times W / (global count)
        model = DistributedDataParallel(make_model())
        batch = next(iter(PlannedBatchSampler(DATASET_SIZE, BATCHES, rank, seed=SEED)))
        per_sample = ((model(x[batch]) - y[batch]) ** 2).sum(dim=1)
        (per_sample.sum() * sum_loss_scale(WORLD_SIZE, STEP_BATCH)).backward()
        result["sum_scaled_grad"] = flat_grad(model)
        result["sum_scaled_indices"] = batch

        # gradient accumulation: 2 micro-steps, the first under no_sync, each loss · w / 2
        model = DistributedDataParallel(make_model())
        sampler = PlannedBatchSampler(DATASET_SIZE, BATCHES, rank, seed=SEED, accumulate=2)
        micro = list(sampler)[:2]
        with model.no_sync():
            (torch.nn.functional.mse_loss(model(x[micro[0]]), y[micro[0]]) * weight / 2).backward()
        (torch.nn.functional.mse_loss(model(x[micro[1]]), y[micro[1]]) * weight / 2).backward()
        result["accumulated_grad"] = flat_grad(model)
        result["accumulated_indices"] = micro

        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """Run the three ranks once; every rank's saved results, in rank order."""
    out_dir = tmp_path_factory.mktemp("ddp")
    run_ranks(_worker, str(out_dir), world_size=WORLD_SIZE, log_dir=out_dir / "logs")
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(WORLD_SIZE)]


def reference_step_grad(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, indices: list[int]
) -> torch.Tensor:
    """Single process: gradient of the mean loss over ``indices``."""
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x[indices]), y[indices]).backward()
    return flat_grad(model)


def global_step_indices(step: int, epoch: int, accumulate: int = 1) -> list[int]:
    """The samples of one global step as a single process would take them: the ranks' slices in order."""
    samplers = [
        PlannedBatchSampler(DATASET_SIZE, BATCHES, r, seed=SEED, accumulate=accumulate)
        for r in range(WORLD_SIZE)
    ]
    for sampler in samplers:
        sampler.set_epoch(epoch)
    return [i for sampler in samplers for i in list(sampler)[step]]


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def test_ranks_used_the_slices_the_sampler_plans_without_communicating(ranks):
    for step in range(TRAIN_STEPS):
        joined = [i for r in ranks for i in r["indices"][step]]
        assert joined == global_step_indices(step, epoch=1)
        assert [len(r["indices"][step]) for r in ranks] == list(BATCHES)
    assert [r["weight"] for r in ranks] == pytest.approx([15 / 16, 9 / 16, 24 / 16])


def test_weighted_ddp_gradient_equals_single_process_gradient_of_the_16_sample_mean(ranks):
    x, y = make_data()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    for step in range(TRAIN_STEPS):
        expected = reference_step_grad(model, x, y, global_step_indices(step, epoch=1))
        for r in ranks:
            assert max_abs_diff(r["weighted_grads"][step], expected) < TOLERANCE, f"step {step}"
        optimizer.step()
    # and so the whole trajectory is the single-process one
    for r in ranks:
        assert max_abs_diff(r["weighted_params"], flat_params(model)) < TOLERANCE


def test_unweighted_ddp_gradient_is_measurably_wrong(ranks):
    x, y = make_data()
    expected = reference_step_grad(make_model(), x, y, global_step_indices(0, epoch=1))
    error = max_abs_diff(ranks[0]["unweighted_grads"][0], expected)
    scale = float(expected.abs().max())
    # plain DDP averages rank means, over-weighting the 3-sample rank: off by far more than the tolerance
    assert error > 1e-2 * scale
    assert error > 1000 * TOLERANCE


def test_sum_reduced_loss_scaled_by_world_size_over_global_count_gives_the_same_gradient(ranks):
    x, y = make_data()
    expected = reference_step_grad(make_model(), x, y, global_step_indices(0, epoch=0))
    assert [i for r in ranks for i in r["sum_scaled_indices"]] == global_step_indices(0, epoch=0)
    for r in ranks:
        assert max_abs_diff(r["sum_scaled_grad"], expected) < TOLERANCE


def test_accumulating_two_weighted_micro_steps_gives_the_gradient_of_the_32_sample_mean(ranks):
    x, y = make_data()
    micro = [global_step_indices(step, epoch=0, accumulate=2) for step in (0, 1)]
    assert [[i for r in ranks for i in r["accumulated_indices"][m]] for m in (0, 1)] == micro
    expected = reference_step_grad(make_model(), x, y, micro[0] + micro[1])
    for r in ranks:
        assert max_abs_diff(r["accumulated_grad"], expected) < TOLERANCE
