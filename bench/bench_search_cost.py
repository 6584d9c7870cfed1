"""Issue #7 item 5: how many passes each batch finder needs before it can choose a batch.

Each search is simulated against a device on which every batch up to ``true_max`` runs and every larger one
runs out of memory, for true maxima from 7 to 3000. Counted: trials (distinct batch sizes run on the GPU),
GPU training steps, trials that ran out of memory, and passes that touch no GPU.

Methods, each from its algorithm (reference peers.md §1; the Lightning code read is
``src/lightning/pytorch/tuner/batch_size_scaling.py``):
- ours, ``estimate``: fake-tensor passes, one per probe batch of ``torchkit.estimate`` (no GPU, no OOM);
- ours, ``measure``: the seed's probe list on a card of 16 GiB or more, one measured step per probe plus one
  warm-up step (``torchkit.seed_api.autobatch``), stopping at the first out-of-memory error;
- the seed (ultralytics 8.4.190): probes 1..64 (n=1 step each), never stopping early;
- Lightning ``power``: start at ``init_val=2``, double after each success, halve and stop at the first OOM
  (if anything succeeded), at most ``max_trials=25`` trials, each ``steps_per_trial=3`` training steps (and as
  many validation batches); ``max_val=8192`` caps the doubling (PR #21163);
- Lightning ``binsearch``: double until the first OOM, then bisect between the last success and the failure
  until they are 1 apart; then ``margin=0.05`` (binsearch only, PR #21163): ``max(1, int(n·0.95))``.
  ``max_trials`` counts successes only;
- Accelerate ``find_executable_batch_size``: start at 128, on OOM ``int(b·0.9)`` (PR #3684), until a size runs.
  The wrapped function is the whole training loop; a trial lasts until its first OOM.
DeepSpeed's autotuner launches one job per experiment (13 experiments, 27 minutes in its own example; peers.md
§1.3) and is left out.

The fit-based methods (ours, the seed) choose their batch from a curve at a memory fraction, so their pick
depends on the curve's shape, not on the search: see ``bench_fit.py``. The searches return the largest size
they saw run; their pick is shown as a share of the true maximum.

Run: ``python bench/bench_search_cost.py`` (prints the table, writes ``bench/results/search_cost.json``).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from torchkit.seed_api.batch_choice import PROBES_LARGE_GPU

RESULTS = Path(__file__).resolve().parent / "results" / "search_cost.json"
TRUE_MAXIMA = (7, 39, 100, 281, 1000, 3000)

# Lightning BatchSizeFinder defaults (peers.md §1.1)
LIGHTNING_INIT_VAL = 2
LIGHTNING_MAX_TRIALS = 25
LIGHTNING_STEPS_PER_TRIAL = 3
LIGHTNING_MAX_VAL = 8192
LIGHTNING_MARGIN = 0.05
# Accelerate find_executable_batch_size defaults (peers.md §1.2)
ACCELERATE_START = 128
ACCELERATE_BACKOFF = 0.9


def estimator_passes() -> int:
    """Fake passes ours needs for one curve: one per probe batch of the estimator."""
    from torchkit.estimate.estimator import DEFAULT_PROBE_BATCHES

    return len(DEFAULT_PROBE_BATCHES)


@dataclass(frozen=True, kw_only=True)
class SearchCost:
    """What one batch finder spent against one device."""

    method: str
    """which finder"""
    true_max: int
    """largest batch that runs on the simulated device"""
    trials: int
    """distinct batch sizes run on the GPU"""
    gpu_steps: int
    """training steps run on the GPU (a trial may run several)"""
    ooms: int
    """trials that ran out of memory"""
    fake_passes: int = 0
    """passes that touch no GPU (fake tensors)"""
    batch: int | None = None
    """the batch it returns; None for the fit-based methods (it depends on the curve, see bench_fit)"""


def ours_estimate(true_max: int) -> SearchCost:
    return SearchCost(
        method="ours (estimate)",
        true_max=true_max,
        trials=0,
        gpu_steps=0,
        ooms=0,
        fake_passes=estimator_passes(),
    )


def ours_measure(true_max: int) -> SearchCost:
    tried = []
    for batch in PROBES_LARGE_GPU:
        tried.append(batch)
        if batch > true_max:  # stop at the first out-of-memory error
            break
    ooms = sum(b > true_max for b in tried)
    warmup = 1 if tried[0] <= true_max else 0  # the first probe runs twice (optimizer state, workspaces)
    return SearchCost(
        method="ours (measure)",
        true_max=true_max,
        trials=len(tried),
        gpu_steps=len(tried) + warmup,
        ooms=ooms,
    )


def seed_probes(true_max: int) -> SearchCost:
    ooms = sum(b > true_max for b in PROBES_LARGE_GPU)
    return SearchCost(
        method="seed 8.4.190",
        true_max=true_max,
        trials=len(PROBES_LARGE_GPU),
        gpu_steps=len(PROBES_LARGE_GPU),
        ooms=ooms,
    )


def lightning_power(true_max: int) -> SearchCost:
    size, any_success, trials, ooms = LIGHTNING_INIT_VAL, False, 0, 0
    for _ in range(LIGHTNING_MAX_TRIALS):
        trials += 1
        if size <= true_max:
            new_size = min(int(size * 2.0), LIGHTNING_MAX_VAL)
            if new_size == size:
                break
            size, any_success = new_size, True
        else:
            ooms += 1
            size = int(size * 0.5)
            if any_success:
                break
    return SearchCost(
        method="Lightning power",
        true_max=true_max,
        trials=trials,
        gpu_steps=trials * LIGHTNING_STEPS_PER_TRIAL,
        ooms=ooms,
        batch=size,
    )


def lightning_binsearch(true_max: int) -> SearchCost:
    size, low, high, successes, trials, ooms = LIGHTNING_INIT_VAL, 1, None, 0, 0, 0
    while True:
        trials += 1
        if size <= true_max:
            successes += 1
            if successes > LIGHTNING_MAX_TRIALS:
                break
            low = size
            if high:
                if high - low <= 1:
                    break
                new_size = (high + low) // 2
            else:
                new_size = min(int(size * 2.0), LIGHTNING_MAX_VAL)
            if new_size == size:
                break
            size = new_size
        else:
            ooms += 1
            high = size
            size = (high + low) // 2
            if high - low <= 1:
                break
    batch = max(1, int(size * (1 - LIGHTNING_MARGIN)))
    return SearchCost(
        method="Lightning binsearch",
        true_max=true_max,
        trials=trials,
        gpu_steps=trials * LIGHTNING_STEPS_PER_TRIAL,
        ooms=ooms,
        batch=batch,
    )


def accelerate_backoff(true_max: int) -> SearchCost:
    size, trials, ooms = ACCELERATE_START, 0, 0
    while True:
        if size == 0:
            raise RuntimeError("No executable batch size found, reached zero.")
        trials += 1
        if size <= true_max:
            break
        ooms += 1
        size = int(size * ACCELERATE_BACKOFF)
    # a failed trial lasts until its first OOM (one step); the last one goes on as the real training
    return SearchCost(
        method="Accelerate 0.9 back-off",
        true_max=true_max,
        trials=trials,
        gpu_steps=trials,
        ooms=ooms,
        batch=size,
    )


METHODS = (ours_estimate, ours_measure, seed_probes, lightning_power, lightning_binsearch, accelerate_backoff)


def run(true_maxima=TRUE_MAXIMA) -> list[SearchCost]:
    return [method(true_max) for true_max in true_maxima for method in METHODS]


def main() -> int:
    costs = run()
    header = f"{'method':<26}" + "".join(f"{'max ' + str(m):>20}" for m in TRUE_MAXIMA)
    print("trials on the GPU (of which OOM) / GPU steps -> batch returned (share of the true maximum)\n")
    print(header)
    print("-" * len(header))
    for method in METHODS:
        cells = []
        for cost in (c for c in costs if c.method == method(1).method):
            if cost.fake_passes:
                cells.append(f"{cost.fake_passes} fake, 0 GPU")
            else:
                text = f"{cost.trials}({cost.ooms})/{cost.gpu_steps}"
                if cost.batch is not None:
                    text += f"->{cost.batch} {100 * cost.batch / cost.true_max:.0f}%"
                cells.append(text)
        print(f"{method(1).method:<26}" + "".join(f"{cell:>20}" for cell in cells))
    print(
        "\nours (estimate) and the seed choose from a fitted curve at a memory fraction: their batch depends on "
        "the curve (bench_fit.py), not on the search. The seed's list assumes a card of 16 GiB or more."
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "schema": "batchplan/bench-search-cost@1",
        "true_maxima": list(TRUE_MAXIMA),
        "costs": [asdict(c) for c in costs],
    }
    RESULTS.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
