"""Issue #7 item 2: the batch each AutoBatch rule picks on the memory curves users hit, against the truth.

Rules (``torchkit.seed_api.autobatch.choose_batch``): ours (affine fit with our guard rails), the seed's log-log rule
(ultralytics 8.3.51) and the seed's linear rule (8.4.190). Every rule gets the same probe figures, the same
available memory and the same fraction (0.60, the seed's default), so only the decision differs. Ours stops
probing at the first out-of-memory error; the seeds probe on (their later probes fail too).

Curves: the probe figures quoted in shared/reference/ultralytics-behaviour.md §5 (ultralytics #1659, #1451, #4679, yolov5 #9287), plus two
synthetic ones whose truth is known by construction. An issue reports a few probes and an outcome, never the
whole true curve, so each case states the assumption that defines its truth: the true peak memory of a
training step, ``true(b) = m0 + m1·b`` (GiB). From it: the true maximum (largest b with ``true(b) <=
available``) and the ideal pick (largest b with ``true(b) <= fraction × available``).

Figures per pick: true memory as % of the target (fraction × available) and of the available memory, and
whether it runs out of memory (``true(b) > available``).

What this bench cannot show: in #1451 and #4679 the seed's probes measured forward+backward only, so the
figures under-state training memory; ours measures a full step with the optimizer (and the loss envelope),
which gives different figures on a GPU. Fed the issue's own figures, ours can only be as right as they are.

Run: ``python bench/bench_fit.py`` (prints the table, writes ``bench/results/fit.json``).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from torchkit.hardware.catalog import load_catalog
from torchkit.seed_api.batch_choice import DEFAULT_FRACTION, choose_batch
from torchkit.step.fit import fit_memory
from torchkit.units import GIB

RESULTS = Path(__file__).resolve().parent / "results" / "fit.json"
METHODS: dict[str, str] = {
    "ours": "affine",
    "seed log-log (8.3.51)": "seed-loglog",
    "seed linear (8.4.190)": "seed-linear",
}
#: the CUDA context and other processes: driver-free memory assumed below the total where an issue gives none
CONTEXT_GIB = 0.25
PROBES = (1, 2, 4, 8, 16)


@dataclass(frozen=True, kw_only=True)
class FitCase:
    """A memory curve as AutoBatch saw it, and the truth it is judged against."""

    name: str
    """short label"""
    shape: str
    """the kind of curve: clean affine, noisy, flat, OOM at the last probe, under-measured"""
    source: str
    """where the figures come from"""
    total_gib: float
    """device total memory"""
    available_gib: float
    """driver-free + reserved by the process"""
    probe_batches: tuple[int, ...]
    """probed batches, as the seed probes them"""
    probe_gib: tuple[float | None, ...]
    """measured peak per probe (None: out of memory)"""
    true_intercept_gib: float
    """m0 of the true curve"""
    true_gib_per_sample: float
    """m1 of the true curve"""
    truth: str
    """the assumption that defines the true curve"""

    def true_gib(self, batch: int) -> float:
        return self.true_intercept_gib + self.true_gib_per_sample * batch

    def largest_within(self, budget_gib: float) -> int:
        return math.floor((budget_gib - self.true_intercept_gib) / self.true_gib_per_sample + 1e-9)


def _probe_fit(batches, mems):
    """Least-squares affine fit of probe figures (GiB), with torchkit.step.fit."""
    fit = fit_memory([(b, m * GIB) for b, m in zip(batches, mems, strict=True) if m is not None]).fit
    return fit.intercept_bytes / GIB, fit.bytes_per_sample / GIB


def _failing_at(intercept_gib: float, available_gib: float, oom_batch: int) -> float:
    """Per-sample GiB of the least steep affine curve from ``intercept_gib`` that runs out at ``oom_batch``."""
    return (available_gib - intercept_gib) / (oom_batch - 0.5)


def _clean_and_noisy_cases() -> list[FitCase]:
    """A clean affine curve, the same curve running out of memory at its last probe, a noisy synthetic one."""
    catalog = load_catalog()
    cases = []

    # ultralytics#1659: A100 80 GB, yolov8l-seg; the figures lie on a line (residuals < 2 %)
    mems_1659 = (1.726, 2.991, 5.352, 10.127, 19.623)
    m0, m1 = _probe_fit(PROBES, mems_1659)
    a100 = catalog.get("A100-SXM4-80GB").memory_bytes / GIB
    cases.append(
        FitCase(
            name="#1659 A100 yolov8l-seg",
            shape="clean affine",
            source="ultralytics#1659 (8.0.58)",
            total_gib=a100,
            available_gib=a100 - CONTEXT_GIB,
            probe_batches=PROBES,
            probe_gib=mems_1659,
            true_intercept_gib=m0,
            true_gib_per_sample=m1,
            truth="affine least squares through the five probes (clean); total from the GPU catalog",
        )
    )

    # the same model on a T4: the last probe (16) runs out of memory
    t4_total, t4_available = 14.75, 14.5
    cases.append(
        FitCase(
            name="#1659 curve on a T4",
            shape="OOM at the last probe",
            source="ultralytics#1659 figures, T4 of #4679",
            total_gib=t4_total,
            available_gib=t4_available,
            probe_batches=PROBES,
            probe_gib=tuple(m if m < t4_available else None for m in mems_1659),
            true_intercept_gib=m0,
            true_gib_per_sample=m1,
            truth="the #1659 line; 16 needs 19.6 G > 14.5 G available, so that probe fails",
        )
    )

    # synthetic noisy curve with a known truth: 1.0 G + 0.25 G per sample, probes off by up to ±6 %
    noise = (0.06, -0.05, 0.04, -0.06, 0.05)
    truth_noisy = (1.0, 0.25)
    cases.append(
        FitCase(
            name="synthetic noisy",
            shape="noisy",
            source="synthetic",
            total_gib=t4_total,
            available_gib=t4_available,
            probe_batches=PROBES,
            probe_gib=tuple(
                round((truth_noisy[0] + truth_noisy[1] * b) * (1 + e), 4)
                for b, e in zip(PROBES, noise, strict=True)
            ),
            true_intercept_gib=truth_noisy[0],
            true_gib_per_sample=truth_noisy[1],
            truth="1.0 G + 0.25 G/sample by construction; probes scaled by (1 + e), e = +6, -5, +4, -6, +5 %",
        )
    )
    return cases


def _reported_cases() -> list[FitCase]:
    """Cases from issue reports, each with the batch that ran out of memory or fitted."""
    t4_total, t4_available = 14.75, 14.5
    cases = []
    # ultralytics#1451: RTX 4090 (23.99 G), yolov8n at 480; 8.0.x picked 281 (70 %) and ran out of memory
    mems_1451 = (0.285, 0.445, 0.470, 0.719, 1.197)
    m0, _ = _probe_fit(PROBES, mems_1451)
    available = 23.99 - CONTEXT_GIB
    cases.append(
        FitCase(
            name="#1451 4090 yolov8n",
            shape="noisy, under-measured",
            source="ultralytics#1451 (8.0.x)",
            total_gib=23.99,
            available_gib=available,
            probe_batches=PROBES,
            probe_gib=mems_1451,
            true_intercept_gib=m0,
            true_gib_per_sample=_failing_at(m0, available, 281),
            truth="the probes' intercept and the least slope that runs out of memory at 281 (as reported): "
            "true max 280, an upper bound",
        )
    )

    # ultralytics#4679: T4 (14.75 G), yolov8s on VisDrone (dense); ~39 and then 36 ran out of memory
    m0, _ = _probe_fit(PROBES, T4_4679 := (0.654, 0.757, 1.223, 2.208, 4.154))
    cases.append(
        FitCase(
            name="#4679 T4 yolov8s VisDrone",
            shape="under-measured",
            source="ultralytics#4679 (8.0.x)",
            total_gib=t4_total,
            available_gib=t4_available,
            probe_batches=PROBES,
            probe_gib=T4_4679,
            true_intercept_gib=m0,
            true_gib_per_sample=_failing_at(m0, t4_available, 36),
            truth="the probes' intercept and the least slope that runs out of memory at 36 (as reported): "
            "true max 35, an upper bound",
        )
    )

    # yolov5#9287: GTX 1080 (7.92 G) with 2.53 G already reserved; flat probes; the user trained 16 fine
    _, slope_4679 = _probe_fit(PROBES, T4_4679)
    mems_9287 = (2.816, 2.852, 2.842, 2.772, 2.741)
    cases.append(
        FitCase(
            name="yolov5#9287 GTX 1080",
            shape="flat (cached memory)",
            source="yolov5#9287",
            total_gib=7.92,
            available_gib=2.53 + 5.32,
            probe_batches=PROBES,
            probe_gib=mems_9287,
            true_intercept_gib=mems_9287[0] - slope_4679,
            true_gib_per_sample=slope_4679,
            truth=f"starts at the batch-1 probe and grows {slope_4679:.3f} G/sample, the #4679 probes' slope "
            "(yolov8s at 640, similar in size to yolov5s): 16 then fits, as the user reported; driver-free 5.32 G "
            "assumed",
        )
    )
    return cases


def build_cases() -> list[FitCase]:
    return _clean_and_noisy_cases() + _reported_cases()


def evaluate(case: FitCase, fraction: float = DEFAULT_FRACTION) -> dict:
    """Each rule's pick on ``case`` and how it fares against the case's truth."""
    target = fraction * case.available_gib
    rows = []
    for label, method in METHODS.items():
        batches, mems = list(case.probe_batches), list(case.probe_gib)
        if method in ("affine", "loglog") and None in mems:  # ours stops probing at the first failure
            stop = mems.index(None) + 1
            batches, mems = batches[:stop], mems[:stop]
        choice = choose_batch(
            batches,
            [None if m is None else m * GIB for m in mems],
            total_bytes=int(case.total_gib * GIB),
            available_bytes=int(case.available_gib * GIB),
            fraction=fraction,
            fit=method,
        )
        true = case.true_gib(choice.batch)
        rows.append(
            {
                "method": label,
                "fit": method,
                "batch": choice.batch,
                "limited_by": choice.limited_by,
                "predicted_gib": round(choice.predicted_bytes / GIB, 3),
                "true_gib": round(true, 3),
                "percent_of_target": round(100 * true / target, 1),
                "percent_of_available": round(100 * true / case.available_gib, 1),
                "out_of_memory": true > case.available_gib,
                "warnings": list(choice.warnings),
            }
        )
    return {
        **asdict(case),
        "fraction": fraction,
        "target_gib": round(target, 3),
        "true_max_batch": case.largest_within(case.available_gib),
        "ideal_batch": case.largest_within(target),
        "rows": rows,
    }


def main() -> int:
    results = [evaluate(case) for case in build_cases()]
    header = f"{'case':<28} {'shape':<22} {'rule':<22} {'batch':>6} {'ideal':>6} {'max':>5} {'true G':>7} {'%target':>8} {'%avail':>7}  OOM"
    print(header)
    print("-" * len(header))
    for result in results:
        for i, row in enumerate(result["rows"]):
            case, shape = (result["name"], result["shape"]) if i == 0 else ("", "")
            print(
                f"{case:<28} {shape:<22} {row['method']:<22} {row['batch']:>6} {result['ideal_batch']:>6} "
                f"{result['true_max_batch']:>5} {row['true_gib']:>7.2f} {row['percent_of_target']:>7.0f}% "
                f"{row['percent_of_available']:>6.0f}%  {'OOM' if row['out_of_memory'] else '-'}"
            )
    print(
        f"\nfraction {DEFAULT_FRACTION}: target = fraction × available; ideal = largest batch within the target; "
        "max = largest batch that runs. Truths:"
    )
    for result in results:
        print(f"  {result['name']}: {result['truth']}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"schema": "batchplan/bench-fit@1", "cases": results}, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
