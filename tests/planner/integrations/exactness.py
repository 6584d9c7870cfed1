"""What every trainer integration must reach, in one place: three gloo ranks with planned batches 2, 5, 9 and
accumulation 2 train 4 optimizer steps (one epoch of 128 samples), and their parameters must equal one process
training on the same global batches (fp32, SGD, 1e-5 relative); the other loss rule must miss by > 1e-3.

The reference is plain torch on the model's own loss: each optimizer step takes the epoch's next 32 samples
of the planned sampler's order (the order every rank's slice comes from) as two micro-batches of 16, each
loss (a mean over its micro-batch) divided by 2. It runs here, in the test process.
"""

from __future__ import annotations

import importlib
import os
import pickle
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from planner.runtime.sampler import PlannedBatchSampler
from tests.net import free_port
from tests.plans import make_plan

BATCHES = (2, 5, 9)
WORLD_SIZE = len(BATCHES)
ACCUMULATE = 2
STEP_BATCH = sum(BATCHES)
OPTIMIZER_STEPS = 4
DATASET_SIZE = OPTIMIZER_STEPS * STEP_BATCH * ACCUMULATE  # one epoch: every sample once
SEED = 5
EXACT = 1e-5
WRONG = 1e-3
#: the re-balancing runs: speeds 1, 2, 4 declared (rank 2 four times slower per sample than rank 0), a
#: per-sample time whose sleeps (up to 4 × 9 × 4 ms a micro-step) dwarf a loaded machine's noise
SPEEDS = (1.0, 2.0, 4.0)
SAMPLE_S = 0.004
REBALANCE_STEPS = (
    32  # 8 epochs: room for the three bounded switches from (2, 5, 9) to the speed order, and a roll-back
)


def requires_integration(module: str) -> pytest.MarkDecorator:
    """A skip mark for the tests of an integration whose library cannot be imported here (not installed;
    transformers beside a torchvision built for another torch), with the integration's own one-line error.
    A mark on each test, not a skip of the module: a run that selects another marker (CI's ``-m ultralytics``
    stage) deselects these tests instead of counting them skipped."""
    from planner.integrations.optional import MissingLibraryError

    try:
        importlib.import_module(module)
    except MissingLibraryError as exc:
        return pytest.mark.skipif(True, reason=str(exc))
    return pytest.mark.skipif(False, reason=f"{module} imports")


def plan_document() -> dict:
    """A valid plan.json for the three ranks (batches 2, 5, 9; accumulate 2)."""
    return make_plan(BATCHES, nodes=(("node-a", WORLD_SIZE),), accumulate=ACCUMULATE)


def epoch_order(
    epoch: int, seed: int = SEED, batches: Sequence[int] = BATCHES, accumulate: int = ACCUMULATE
) -> list[int]:
    """The global order of an epoch: global micro-step s is ``order[s·B:(s+1)·B]`` (``B = Σ batches``)."""
    sampler = PlannedBatchSampler(DATASET_SIZE, batches, 0, seed=seed, accumulate=accumulate)
    sampler.set_epoch(epoch)
    return sampler.epoch_order()


def reference_parameters(
    model: torch.nn.Module,
    micro_loss: Callable[[torch.nn.Module, list[int]], torch.Tensor],
    lr: float,
    steps: int = OPTIMIZER_STEPS,
    seed: int = SEED,
    batches: Sequence[int] = BATCHES,
    accumulate: int = ACCUMULATE,
) -> torch.Tensor:
    """One process, plain SGD over the same global batches: ``micro_loss(model, indices)`` is the model's loss
    (a mean over the micro-batch); each optimizer step sums ``accumulate`` of them, each divided by it."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    step_batch = sum(batches)
    steps_per_epoch = DATASET_SIZE // (step_batch * accumulate)
    for step in range(steps):
        epoch, in_epoch = divmod(step, steps_per_epoch)
        order = epoch_order(epoch, seed, batches, accumulate)
        optimizer.zero_grad()
        for micro in range(accumulate):
            start = (in_epoch * accumulate + micro) * step_batch
            (micro_loss(model, order[start : start + step_batch]) / accumulate).backward()
        optimizer.step()
    return flat(model)


def flat(model: torch.nn.Module) -> torch.Tensor:
    """Every parameter, flattened, in the model's order (a copy)."""
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def relative_difference(params: torch.Tensor, reference: torch.Tensor) -> float:
    """‖params − reference‖ / ‖reference‖."""
    return float((params - reference).norm() / reference.norm())


def samples_of_epoch_once(taken: Sequence[Sequence[Sequence[int]]], epochs: int = 1) -> bool:
    """Whether the ranks' micro-batches (per rank, in the order trained) are the planned slices of each epoch's
    global order, every sample of every epoch exactly once."""
    per_epoch = DATASET_SIZE // STEP_BATCH
    if any(len(steps) != per_epoch * epochs for steps in taken):
        return False
    for epoch in range(epochs):
        order = epoch_order(epoch)
        joined = [
            i
            for step in range(per_epoch)
            for rank in range(WORLD_SIZE)
            for i in taken[rank][epoch * per_epoch + step]
        ]
        if joined != order or sorted(joined) != list(range(DATASET_SIZE)):
            return False
    return True


def ordered_by_speed(batches: Sequence[int]) -> bool:
    """Speeds 1, 2, 4: rank 0 is the fastest, so the batches must fall strictly with the rank."""
    return all(a > b for a, b in zip(batches, batches[1:], strict=False))


def assert_rebalanced_exactly(runs: Sequence[dict], reference: torch.Tensor) -> None:
    """The re-balancing runs (speeds 1, 2, 4 declared) switched, ended on one split ordered by speed, and
    trained exactly what one process does on the same global batches, every sample of each epoch once."""
    batches_last = runs[0]["batches_last"]
    assert all(run["switches"] >= 1 for run in runs)
    assert all(run["batches_last"] == batches_last for run in runs)
    assert ordered_by_speed(batches_last) and sum(batches_last) == STEP_BATCH, batches_last
    for run in runs:
        assert run["global_step"] == REBALANCE_STEPS
        assert relative_difference(run["params"], reference) < EXACT, relative_difference(
            run["params"], reference
        )
    assert samples_of_epoch_once([run["taken"] for run in runs], epochs=REBALANCE_STEPS // OPTIMIZER_STEPS)


def assert_planned_job_trained_exactly(
    runs: Sequence[dict], reference: Callable[[Sequence[int]], torch.Tensor]
) -> None:
    """The runs of ``planned_job()``: every rank holds the same planned split of 32 samples, takes its own batch
    in every step, and ends where ``reference(batches)`` (one process on that plan's global batches) does."""
    batches = runs[0]["batches"]
    assert (
        all(run["batches"] == batches for run in runs) and sum(batches) == 32 and len(batches) == WORLD_SIZE
    )
    for rank, run in enumerate(runs):
        assert run["accumulate"] == 1 and run["global_step"] == OPTIMIZER_STEPS
        assert [len(b) for b in run["taken"]] == [batches[rank]] * OPTIMIZER_STEPS
    expected = reference(batches)
    assert all(relative_difference(run["params"], expected) < EXACT for run in runs)


def dist_environment(rank: int, port: int) -> None:
    """What torchrun would set for ``rank`` of the three (frameworks initialise the group from it)."""
    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(WORLD_SIZE),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(WORLD_SIZE),
        GROUP_RANK="0",
        NODE_RANK="0",
        GLOO_SOCKET_IFNAME="lo",
        CUDA_VISIBLE_DEVICES="",
    )


def init_gloo(rank: int, port: int) -> None:
    """The gloo group for ``rank``, with a timeout that ends a stuck test instead of hanging it."""
    import torch.distributed as dist

    dist_environment(rank, port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=120))


def save(out_dir: str, rank: int, result: Any) -> None:
    with open(Path(out_dir) / f"rank{rank}.pkl", "wb") as handle:
        pickle.dump(result, handle)


def _rank_entry(rank: int, worker: Callable[..., None], *args: Any) -> None:
    """Run one rank's ``worker``, then leave without the interpreter's teardown, where a gloo rank now and then
    aborts after everything has run (README, "Using the plan in a training script"); an exception still reaches
    the parent as a failure."""
    worker(rank, *args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(worker: Callable[..., None], out_dir: Path, *args: Any) -> list[Any]:
    """Run ``worker(rank, port, out_dir, *args)`` on three spawned ranks; every rank's saved result, in order. A
    port another process took between choosing and binding it (a shared machine) is tried once more."""
    import torch.multiprocessing as mp

    for attempt in range(2):
        try:
            mp.start_processes(
                _rank_entry,
                args=(worker, free_port(), str(out_dir), *args),
                nprocs=WORLD_SIZE,
                start_method="spawn",
            )
            break
        except mp.ProcessRaisedException as exc:
            if attempt or "address already in use" not in str(exc).lower():
                raise
    results = []
    for rank in range(WORLD_SIZE):
        with open(out_dir / f"rank{rank}.pkl", "rb") as handle:
            results.append(pickle.load(handle))
    return results


# ------------------------------------------------------------------- a regression MLP (Accelerate, Lightning)


def regression_data() -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets whose scale grows with the index, so a rank's mean loss differs clearly from the
    global mean (a wrong weighting shows)."""
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(DATASET_SIZE, 4, generator=generator)
    y = torch.sin(x.sum(dim=1, keepdim=True)) * (1 + torch.arange(DATASET_SIZE).unsqueeze(1) / 20)
    return x, y


def make_mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


class IndexedRegression(torch.utils.data.Dataset):
    """``(x, y, index)``: the index lets a rank record which samples it trained on."""

    def __init__(self) -> None:
        self.x, self.y = regression_data()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        return self.x[index], self.y[index], index


def mlp_reference(
    lr: float, steps: int = OPTIMIZER_STEPS, batches: Sequence[int] = BATCHES, accumulate: int = ACCUMULATE
) -> torch.Tensor:
    """The one-process reference of the MLP with the mean squared error."""
    x, y = regression_data()

    def micro_loss(model: torch.nn.Module, indices: list[int]) -> torch.Tensor:
        return torch.nn.functional.mse_loss(model(x[indices]), y[indices])

    return reference_parameters(
        make_mlp(), micro_loss, lr, steps=steps, batches=batches, accumulate=accumulate
    )


#: the job planned inside the run (a JobSpec instead of a plan file): a small convnet estimated for three
#: simulated GPU types, one per rank, 32 samples per optimizer step
PLANNED_GPUS = ("T4", "A10", "A100-SXM4-80GB")


def shared_profile_cache(tmp_path_factory) -> Path:
    """One profile cache for every run of ``planned_job()`` in a test session: the first spawn estimates the
    three GPU types, the next reads them (as a node's cache serves its next job)."""
    return tmp_path_factory.getbasetemp() / "planned-job-profiles"


def planned_job():
    from planner.job import JobSpec

    return JobSpec(model="tests.planner.tiny_models:convnet", input_shape=(3, 32, 32), global_batch=32)
