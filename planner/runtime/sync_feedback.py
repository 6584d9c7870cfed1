"""What a real run's measured synchronisation tells the next plan: the exposed synchronisation per optimizer
step the re-balancer timed, set against the plan's model of that same ring at the compute that ran, as a ring
slowdown filed for the next plan of the same job on the same ring (``planner.profiles.measured_sync``, whose
docstring says why a slowdown and what the key holds).

Measured exposed synchronisation. The re-balancer times each rank's compute (to its last gradient bucket
being ready) and its wait after that (to the end of its backward, where DDP waits for the all-reduces). The
ranks leave the step together, so the wait of the step's slowest rank is what its all-reduces add after
the backward the model overlaps them with: the plan's "exposed" figure (``max_i compute_i + exposed``). The
medians over the steps at the split that ran last (all usable steps where fewer than ``MIN_STEPS`` ran it)
of that wait and of the slowest rank's compute per micro-step are the measurement; the plan's
``comm`` section gives the ring, its buckets and the backward share the model used
(``planner.plan.comm.section_ring``), and ``fit_slowdown`` the k that reproduces it.

Nothing is filed for a simulated run (its waits are the simulation's sleeps), a one-rank job, a plan
without a ``comm`` section (written before the model, or whose model's gradients could not be laid out),
or steps without a wait (no all-reduce hook fired). Pure: no torch.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from planner.plan.comm import section_ring
from planner.plan.sections import CommSection, FiledSync, StepMeasure
from planner.plan.types import Plan
from planner.profiles.measured_sync import JobSync
from torchkit.estimate.ddp_sync import exposed_sync_s, fit_slowdown

MIN_STEPS = 3
"""steps at the last split needed to measure there alone"""


def measured_exposed(
    measures: Sequence[StepMeasure], split: Sequence[int], accumulate: int
) -> tuple[float, float, int] | None:
    """(median exposed synchronisation per optimizer step, median compute of the slowest rank per
    micro-step, steps) of the steps at ``split`` (all steps where fewer than ``MIN_STEPS`` ran it); None
    when no step recorded a wait."""
    timed = [m for m in measures if m.sync_wait_s is not None]
    at = [m for m in timed if m.batches == tuple(split)]
    steps = at if len(at) >= MIN_STEPS else timed
    if not steps:
        return None
    exposed, compute = [], []
    for m in steps:
        slowest = max(range(len(m.compute_s)), key=lambda r: m.compute_s[r])
        exposed.append(m.sync_wait_s[slowest])  # type: ignore[index]
        compute.append(m.compute_s[slowest] / accumulate)
    return statistics.median(exposed), statistics.median(compute), len(steps)


def job_sync_of(
    comm: CommSection | None,
    measures: Sequence[StepMeasure],
    split: Sequence[int],
    accumulate: int,
    link: str,
) -> tuple[str, JobSync] | tuple[None, str]:
    """(ring shape, what the run measured) for the plan's ``comm`` section, or (None, why nothing)."""
    if comm is None:
        return (
            None,
            "the plan has no synchronisation model (no comm section) to check the measured waits against",
        )
    if comm.num_ranks <= 1:
        return None, "one rank: nothing synchronised"
    measured = measured_exposed(measures, split, accumulate)
    if measured is None:
        return None, "no step recorded a synchronisation wait"
    exposed_s, compute_s, steps = measured
    try:
        ring, buckets = section_ring(comm)
        predicted = exposed_sync_s(buckets, ring, compute_s=compute_s, backward_share=comm.backward_share)
        slowdown = fit_slowdown(
            buckets, ring, compute_s=compute_s, backward_share=comm.backward_share, exposed_s=exposed_s
        )
        sync = JobSync(
            slowdown=slowdown,
            measured_exposed_s=exposed_s,
            predicted_exposed_s=predicted,
            compute_s=compute_s,
            steps=steps,
            link=link,
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )
    except ValueError as exc:
        return None, f"the plan's comm section cannot be priced ({type(exc).__name__}: {exc})"
    return comm.ring_shape, sync


def sync_entry(
    comm: CommSection | None,
    measures: Sequence[StepMeasure],
    split: Sequence[int],
    accumulate: int,
    link: str,
    simulated: str | None,
) -> FiledSync:
    """The ``measured.sync`` of the written plan: the ring shape and what the run measured, or why nothing
    is filed (``ring_shape`` None)."""
    if simulated:
        return FiledSync(ring_shape=None, why=f"not filed: {simulated} (the waits are the simulation's)")
    shape, found = job_sync_of(comm, measures, split, accumulate, link)
    if shape is None:
        return FiledSync(ring_shape=None, why=f"not filed: {found}")
    return FiledSync(ring_shape=shape, filed=found)  # type: ignore[arg-type]


def file_job_sync(plan: Plan, cache_dir: str | os.PathLike | None) -> Path | None:
    """File the ``measured.sync`` of a re-balanced plan (``sync_entry``) in the profile cache (``cache_dir``,
    default the planner's) for the next plan of its job; None where there is nothing to file.

    Raises WorkloadError where the plan's model cannot be rebuilt here to name it (as for the measured
    profiles), ConfigError where the cache cannot be written."""
    from planner.profiles.measured_sync import store_job_sync, sync_key_inputs
    from planner.runtime.rebalance_feedback import measured_fingerprint
    from planner.store import CacheStore

    measured, comm = plan.measured, plan.comm
    if measured is None or measured.simulated or measured.sync is None or comm is None:
        return None
    shape, filed = measured.sync.ring_shape, measured.sync.filed
    if shape is None or filed is None:
        return None
    inputs = sync_key_inputs(
        plan.job,
        fingerprint=measured_fingerprint(plan.job),
        gradient_bytes=comm.gradient_bytes,
        bucket_cap_mb=comm.bucket_cap_mb,
    )
    return store_job_sync(CacheStore(cache_dir), inputs, shape, filed)
