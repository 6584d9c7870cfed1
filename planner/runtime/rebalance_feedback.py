"""What a re-balanced job leaves for the next plan: measured profiles in the profile cache, and the plan file
updated with the batches that ran and a ``measured`` section.

Pure (no torch): it works on the gathered ``StepMeasure`` list and the typed ``Plan`` (its ``DeviceProfile``s),
so the planner side (``--method auto`` in the driver) can read what it wrote without importing the runtime's
torch parts.

Measured profiles. For every GPU type in the job, the compute times all ranks of that type measured
(medians per batch) become the profile's time points, refitted with the plan profile's curve as prior
(``planner.runtime.rebalance_model.fit_rank_time``). The memory curve is the measured peaks' where the job
ran on GPUs at two or more batches, and otherwise the plan's (on CPU nothing is measured; the profile's
notes say which). The profile's ``method`` is ``"job"``. It is cached under :func:`measured_profile_key`:
the job's model, input, amp and optimizer and the GPU type — not the planning options (fraction, global
batch, mode), which do not change how fast a step runs. ``batchplan plan --method auto`` looks there first.

What it cannot poison. A simulated run (``--simulate-speed``) files no profile at all: its times are the
simulation's (``planner.runtime.rebalance.Rebalancer.feedback``). A real run's profile is keyed by the job
and by the torch that ran it (``planner.profiles.measured.measured_key_inputs``: ``software``), and carries
its marks in its notes and in the plan's ``measured.marks``: the model the plan names, the software and the
link (backend, nodes, ranks).

Per step, each rank's compute and synchronisation wait (``sync_wait_s``) are in ``measured.step_times``: the
wait is what a communication model can be checked against. ``measured.sync`` sets the slowest rank's wait
against the plan's model of the same ring (``planner.runtime.sync_feedback``); a real run files it for the next
plan of the same job on the same ring (``planner.profiles.measured_sync``), a simulated one files nothing.

Known limitations: the times are those of the training script that ran, under the plan's job name: a
script that trains another model than the plan names feeds back that model's times (the synthetic
examples do; their summary says so). Ranks of one GPU type are pooled, so a type that ran at different
speeds (a throttled card) gets their median.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone

from planner.job import JobSpec
from planner.plan.sections import FiledSync, MeasuredRank, MeasuredSection, PlannedFigures, StepMeasure
from planner.plan.types import Plan
from planner.profiles.measured import MEASURED_METHOD, measured_profile_key, software_version
from planner.profiles.profile import DeviceProfile
from planner.runtime.rebalance_model import RankLimits, fit_rank_time, idle_fractions, median_points
from planner.runtime.rebalance_report import RebalanceReport
from planner.runtime.weights import loss_weights
from torchkit.step.fit import fit_memory

__all__ = [
    "MEASURED_METHOD",
    "job_marks",
    "measured_fingerprint",
    "measured_profile_key",
    "measured_profiles",
    "measured_section",
    "updated_plan",
]

#: the most steps ``measured.step_times`` lists (the latest); a long job's plan file stays small
MAX_STEPS_LISTED = 500


def job_marks(link: str) -> dict[str, str]:
    """What a real run's feedback is marked with besides its key: the software and the link it ran on."""
    return {"software": software_version(), "link": link}


def _pooled_points(measures: Sequence[StepMeasure], ranks: Sequence[int]) -> list[tuple[int, float, int]]:
    by_batch: dict[int, list[float]] = {}
    for measure in measures:
        for rank in ranks:
            by_batch.setdefault(measure.batches[rank], []).append(measure.compute_s[rank])
    return [(b, statistics.median(ts), len(ts)) for b, ts in sorted(by_batch.items())]


def measured_fingerprint(job: JobSpec) -> str:
    """The workload fingerprint of a plan's ``job``, the part of a measured profile's key that names the
    model's step (``planner.obtain.job_fingerprint``)."""
    from planner.obtain import job_fingerprint

    return job_fingerprint(job)[0]


def measured_profiles(
    plan: Plan,
    measures: Sequence[StepMeasure],
    *,
    prior_weight: float = 1.0,
    marks: Mapping[str, str] | None = None,
) -> dict[str, DeviceProfile]:
    """One measured profile per GPU type of the plan, keyed by :func:`measured_profile_key`."""
    job = plan.job
    fingerprint = measured_fingerprint(job)
    types: dict[str, list[int]] = {}
    for entry in plan.ranks:
        types.setdefault(entry.gpu, []).append(entry.rank)
    out: dict[str, DeviceProfile] = {}
    for gpu, ranks in types.items():
        base = plan.profiles[plan.ranks[ranks[0]].profile]
        points = _pooled_points(measures, ranks)
        time_fit = fit_rank_time(points, base.time_fit, prior_weight)
        marked = "".join(f", {name} {value}" for name, value in (marks or {}).items())
        notes = [
            f"{gpu}: step time measured in a running job of {job.model} ({len(measures)} steps on "
            f"{len(ranks)} rank(s){marked})"
        ]
        peaks: dict[int, int] = {}
        for measure in measures:
            if measure.peak_bytes is not None:
                for rank in ranks:
                    b = measure.batches[rank]
                    peaks[b] = max(peaks.get(b, 0), measure.peak_bytes[rank])
        memory = {}
        if len(peaks) >= 2:
            fitted = fit_memory(sorted(peaks.items()))
            memory = {
                "memory_points": tuple(sorted(peaks.items())),
                "memory_fit": fitted.fit,
                "oom_batch": None,
            }
            notes.append(
                f"{gpu}: memory from the job's measured peak reserved bytes at batches {sorted(peaks)}"
            )
        else:
            notes.append(
                f"{gpu}: memory curve from the plan's {base.method} profile (no peaks measured at two batches)"
            )
        out[measured_profile_key(job, gpu, base.amp, fingerprint=fingerprint)] = dataclasses.replace(
            base,
            method=MEASURED_METHOD,
            time_points=tuple((b, t) for b, t, _ in points),
            time_fit=time_fit,
            notes=tuple(notes),
            **memory,
        )
    return out


def measured_section(
    plan: Plan,
    measures: Sequence[StepMeasure],
    report: RebalanceReport,
    limits: Sequence[RankLimits],
    *,
    prior_weight: float = 1.0,
    simulated: str | None = None,
    marks: Mapping[str, str] | None = None,
    sync: FiledSync | None = None,
) -> MeasuredSection:
    """The plan's ``measured`` section: what ran, what each rank measured (per step: compute and
    synchronisation wait), the refitted curves, and ``sync``: the exposed synchronisation set against the
    plan's model (``planner.runtime.sync_feedback.sync_entry``)."""

    ranks = []
    for entry in plan.ranks:
        rank = entry.rank
        points = median_points(measures, rank)
        fit = fit_rank_time(points, limits[rank].prior, prior_weight)
        peaks = sorted({(m.batches[rank], m.peak_bytes[rank]) for m in measures if m.peak_bytes is not None})
        ranks.append(
            MeasuredRank(
                rank=rank,
                gpu=entry.gpu,
                time_points=tuple((b, t) for b, t, _ in points),
                time_fit=fit,
                peak_reserved_points=tuple(peaks),
            )
        )

    def step_s(split: Sequence[int]) -> float | None:
        at = [m for m in measures if m.batches == tuple(split)]
        if not at:
            return None
        return max(median_points(at, r)[0][1] for r in range(len(split)))

    return MeasuredSection(
        source="planner.runtime.rebalance",
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        steps=report.steps,
        measured_steps=len(measures),
        switches=report.switches,
        steps_to_balance=report.steps_to_balance,
        batches_first=report.batches_first,
        batches_last=report.batches_last,
        max_idle_first=report.max_idle_first,
        max_idle_last=report.max_idle_last,
        step_time_first_s=step_s(report.batches_first),
        step_time_last_s=step_s(report.batches_last),
        rollbacks=report.rollbacks,
        watch_overhead=report.watch_overhead,
        compute_s_last=report.compute_s_last,
        sync_wait_s_last=report.sync_wait_s_last,
        simulated=simulated,
        sync=sync,
        marks={"model": str(plan.job.model), **(marks or {})},
        ranks=tuple(ranks),
        step_times=tuple(measures[-MAX_STEPS_LISTED:]),
    )


def updated_plan(plan: Plan, section: MeasuredSection) -> Plan:
    """The plan with the batches that ran last, their loss weights and measured step times, and ``measured``.

    Its step time is, as in every plan, the slowest rank's compute plus the exposed synchronisation per
    optimizer step shared over its micro-steps (``planner.allocate.allocation``): the exposed time the run
    measured (``measured.sync``) where it measured one, else the plan's own ``predicted_comm_time_s``;
    ``predicted_comm_time_s`` becomes that figure. Every figure of the batches is theirs: each rank's predicted
    memory at its new batch (its profile's curve), the balance efficiency against the bound of the measured
    curves (every GPU alone at its cap, ``planner.allocate.allocation``). What the plan said of its own batches
    (the options it compared, its notes and warnings) is not re-judged at the measured speeds: it moves to
    ``measured.planned``, and one note says so (plan again to compare at the measured speeds)."""
    batches = list(section.batches_last)
    weights = loss_weights(batches)
    fits = [r.time_fit for r in section.ranks]
    times = [fit.predict_s(b) for fit, b in zip(fits, batches, strict=True)]
    idle = idle_fractions(times)
    ranks = tuple(
        dataclasses.replace(
            entry,
            batch=batches[i],
            loss_weight=weights[i],
            predicted_step_time_s=times[i],
            idle_fraction=idle[i],
            predicted_memory_bytes=plan.profiles[entry.profile].memory_bytes(batches[i]),
        )
        for i, entry in enumerate(plan.ranks)
    )
    sync_s, sync_from = _exposed_sync_s(plan, section)
    step_time = max(times) + sync_s / plan.accumulate
    if section.switches:
        what = f"re-balanced in the running job: batches {list(section.batches_first)} -> {batches}"
    else:
        what = f"the running job kept the planned batches {batches}"
    idle = section.max_idle_last
    what += f" from measured compute times (max idle {'n/a' if idle is None else format(idle, '.1%')}; see 'measured')"
    if sync_from:
        what += f"; exposed synchronisation {sync_s * 1e3:.1f} ms per optimizer step, {sync_from}"
    if section.simulated:
        what += f"; {section.simulated}"
    throughput = sum(batches) / step_time if step_time > 0 else 0.0
    bound = sum(
        e.max_batch / fit.predict_s(e.max_batch)
        for e, fit in zip(plan.ranks, fits, strict=True)
        if fit.predict_s(e.max_batch) > 0
    )
    planned = PlannedFigures(
        batches=tuple(e.batch for e in plan.ranks),
        balance_efficiency=plan.balance_efficiency,
        alternatives=plan.alternatives,
        notes=plan.notes,
        warnings=plan.warnings,
    )
    moved = (
        f"what the plan said of its batches {list(planned.batches)} (throughput by mode, GPUs to drop, its "
        "notes and warnings) is in measured.planned, not re-judged at the measured speeds (plan again to "
        "compare options at them: batchplan plan --method auto reads what a real run measured)"
    )
    return plan.replace(
        ranks=ranks,
        step_batch=sum(batches),
        global_batch=sum(batches) * plan.accumulate,
        predicted_step_time_s=step_time,
        throughput_samples_per_s=throughput,
        balance_efficiency=min(1.0, throughput / bound) if bound > 0 else 0.0,
        balance_efficiency_range=None,
        alternatives=None,
        notes=(moved,),
        warnings=(what,),
        advice=(),
        measured=dataclasses.replace(section, planned=planned),
        predicted_comm_time_s=sync_s if plan.predicted_comm_time_s is not None else None,
    )


def _exposed_sync_s(plan: Plan, section: MeasuredSection) -> tuple[float, str]:
    """(exposed synchronisation per optimizer step, where it comes from; "" for none: a plan without a
    synchronisation model, which predicts none)."""
    filed = section.sync.filed if section.sync is not None else None
    if filed is not None:
        return filed.measured_exposed_s, "as the run measured it"
    if plan.predicted_comm_time_s:
        return plan.predicted_comm_time_s, "the plan's prediction (the run measured none)"
    return 0.0, ""
