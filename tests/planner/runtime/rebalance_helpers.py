"""Shared by the re-balancing tests and bench/bench_rebalance.py: a plan whose speed model is wrong by a
known factor, and a training loop over Rebalancer with simulated speeds (gloo, float64, tiny MLP)."""

from __future__ import annotations

from collections.abc import Sequence

from planner.allocate.allocation import allocate
from tests.plans import make_plan

#: simulated slowdown per rank and the declared per-sample time of a speed-1 rank: sleeps of 24-96 ms per
#: step, far above the scheduling noise of a loaded 2-core machine (a few ms)
SPEEDS = (1.0, 2.0, 4.0)
SAMPLE_S = 0.003
STEP_BATCH = 56
MULTIPLE_OF = 4


def planned_slopes(
    wrong_by: float, speeds: Sequence[float] = SPEEDS, sample_s: float = SAMPLE_S
) -> list[float]:
    """The plan's s/sample per rank: the truth, with every ratio to rank 0 divided by ``wrong_by``."""
    return [sample_s * (k if i == 0 else k / wrong_by) for i, k in enumerate(speeds)]


def optimum(
    caps: Sequence[int], speeds: Sequence[float] = SPEEDS, sample_s: float = SAMPLE_S
) -> tuple[int, ...]:
    """The solver's split for the simulated speeds themselves (what re-balancing should reach)."""
    allocation = allocate(
        list(caps),
        [0.0] * len(caps),
        [k * sample_s for k in speeds],
        global_batch=STEP_BATCH,
        multiple_of=MULTIPLE_OF,
        min_batch=MULTIPLE_OF,
        accumulate=1,
    )  # a job's one step
    return tuple(int(b) for b in allocation.batches)


def wrong_plan(
    wrong_by: float, caps: Sequence[int] = (64, 64, 64), nodes: tuple[tuple[str, int], ...] = (("node-a", 3),)
) -> dict:
    """A valid plan.json for 3 ranks (on ``nodes``) whose time model is ``wrong_by`` off, batches solved under it."""
    slopes = planned_slopes(wrong_by)
    allocation = allocate(
        list(caps), [0.0] * 3, slopes, global_batch=STEP_BATCH, multiple_of=MULTIPLE_OF, min_batch=MULTIPLE_OF
    )
    batches = tuple(int(b) for b in allocation.batches)
    plan = make_plan(batches, nodes=nodes, gpus=["T4", "V100-SXM2-16GB", "A10"])
    plan["job"] = {"model": "mlp", "multiple_of": MULTIPLE_OF, "min_batch": MULTIPLE_OF}
    plan["profiles"] = {}
    for rank, entry in enumerate(plan["ranks"]):
        key = f"p{rank}"
        entry["profile"], entry["max_batch"] = key, int(caps[rank])
        entry["memory_budget_bytes"] = 10**9
        entry["predicted_step_time_s"] = slopes[rank] * entry["batch"]  # its profile's time (plan/derived.py)
        plan["profiles"][key] = {
            "gpu": entry["gpu"],
            "method": "estimate",
            "amp": "off",
            "memory_points": [[1, 1_000_000], [8, 1_700_000]],
            "memory_fit": {"kind": "affine", "intercept_bytes": 900_000.0, "bytes_per_sample": 100_000.0},
            "time_points": [[8, 8 * slopes[rank]], [64, 64 * slopes[rank]]],
            "time_fit": {"kind": "affine", "intercept_s": 0.0, "s_per_sample": slopes[rank]},
        }
    return plan
