"""Regenerate the step-time model's constants from the measured data and print the fit's residuals.

    python bench/calibrate_time.py [--refresh-tables] [--out PATH]

1. reads ``torchkit/estimate/calibration/measured_throughput.csv`` (public measured training throughput, a
   source, a software stack and a kind — single GPU or per GPU of N — per row) and the cached kernel table of
   every row's configuration (``kernel_tables.json``; ``--refresh-tables`` recomputes them with one fake pass
   each, a few minutes);
2. fits the roofline's efficiencies by least squares on log throughput to the rows *not* held out
   (``held_out_ids``: a third of each (architecture, precision, stack) group, by a hash of the row ids), with
   an architecture-level deviation per architecture (tensor-core efficiency bounded by its measured
   achievable matmul share), a throughput and memory-traffic term per software stack other than eager
   PyTorch, priors and shrinkage as ``torchkit/estimate/calibration/fit.py`` says; in two stages
   (``fit_calibration``): the eager rows alone, then the other stacks' rows with those constants held, so
   they place Hopper, Ada and Turing relative to the eager-calibrated anchors in their stack and cannot move
   a Volta or Ampere prediction;
3. states σ per GPU type from four cross-validations of the fit rows (a refit per row, GPU type and
   architecture, about a minute: ``torchkit/estimate/calibration/uncertainty.py``), scaled for 95% coverage at
   2σ, widened for a type whose architecture is seen only in another stack or per GPU of an MLPerf run; the
   held-out rows' coverage at 2σ is printed as the check;
4. writes ``torchkit/estimate/calibration/time_model.json`` (atomically), every constant with the rows it
   came from, and prints every row's residual (held-out rows predicted by the fit that never saw them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from dataclasses import fields
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from torchkit.estimate.calibration.crossval import (  # noqa: E402
    COVERAGE_TARGET,
    cross_validate,
    log_errors,
    observations_from_rows,
    rms,
    within,
)
from torchkit.estimate.calibration.data import DATA_PATH, held_out_ids, read_measured  # noqa: E402
from torchkit.estimate.calibration.fit import (  # noqa: E402
    ARCH_PARAMS,
    GLOBAL_PARAMS,
    SM_STREAM_PARAM,
    SM_STREAM_PRIORS,
    TENSOR_CORE_CEILINGS,
    CalibrationFit,
    Observation,
    fit_calibration,
    predict,
)
from torchkit.estimate.calibration.stacks import REFERENCE_STACK, STACKS  # noqa: E402
from torchkit.estimate.calibration.tables import build_tables, load_tables, write_tables  # noqa: E402
from torchkit.estimate.calibration.uncertainty import Sigmas, stated_sigmas  # noqa: E402
from torchkit.estimate.roofline import TimeConstants  # noqa: E402
from torchkit.estimate.time_model import DEFAULT_TIME_MODEL_PATH, PRIOR_CONSTANTS  # noqa: E402
from torchkit.hardware.catalog import load_catalog  # noqa: E402

PRIOR_SOURCES = {
    "kernel_launch_s": "prior, not fitted: cudaLaunchKernel ~1-3 us on CUDA 12 drivers (approximate)",
    "eager_dispatch_s": "prior, not fitted: ~5-25 us CPU per eager op (jiahuanglin.xyz 'From PyTorch op to kernel launch')",
}


def fit_constants(observations: list[Observation], held_ids: frozenset[str]) -> CalibrationFit:
    """The shipped fit: every row not held out (``fit_calibration``: eager rows first, then the other stacks')."""
    return fit_calibration([o for o in observations if o.id not in held_ids], PRIOR_CONSTANTS)


def calibrate(
    rows: list, observations: list[Observation], held_ids: frozenset[str], progress: bool = False
) -> tuple[dict, CalibrationFit, dict[str, float]]:
    """Fit, cross-validate, and build the time-model document. Returns (document, fit result, held-out
    predictions of the shipped fit, each in its row's own stack)."""
    fit_obs = [o for o in observations if o.id not in held_ids]
    result = fit_constants(observations, held_ids)
    say = (lambda m: print(f"  {m}", file=sys.stderr, flush=True)) if progress else None
    cv = cross_validate(fit_obs, PRIOR_CONSTANTS, start=result.params, progress=say)
    sigmas = stated_sigmas(cv, fit_obs)
    rel_data = os.path.relpath(DATA_PATH, REPO)
    digest = hashlib.sha256(DATA_PATH.read_bytes()).hexdigest()[:12]
    fitted_on = f"fit on {len(fit_obs)} rows of {rel_data}"
    glob = {}
    for f in fields(TimeConstants):
        if f.name not in GLOBAL_PARAMS and f.name not in PRIOR_SOURCES:
            continue
        value = getattr(result.global_constants, f.name)
        source = f"{fitted_on} (all architectures)" if f.name in GLOBAL_PARAMS else PRIOR_SOURCES[f.name]
        glob[f.name] = {"value": value, "source": source}
    held = [o for o in observations if o.id in held_ids]
    held_pred = {
        o.id: predict(o, result.global_constants, result.arch_constants, result.stack_terms) for o in held
    }
    held_errors = log_errors(held, held_pred)
    gpu_doc = _gpu_documents(rows, fit_obs, sigmas)
    type_source = (
        f"RMS of the log errors of a GPU type left out of the fit while its architecture keeps other types' rows "
        f"({sigmas.raw['type']:.4f}, {len(cv.type)} rows) times {sigmas.coverage_factor:.3f}; added in quadrature "
        "to its architecture's sigma for a type without rows of its own"
    )
    doc = {
        "generated_by": "python bench/calibrate_time.py",
        "data": f"{rel_data} (sha256 {digest}; {len(rows)} rows, {len(fit_obs)} fitted, {len(held)} held out)",
        "fit_rows": [o.id for o in fit_obs],
        "held_out_rows": [o.id for o in held],
        "global": glob,
        "arch": _arch_documents(result, fit_obs, sigmas, fitted_on),
        "stacks": _stack_documents(result, fit_obs),
        "gpus": gpu_doc,
        "type_log_sigma": sigmas.type,
        "type_log_sigma_source": type_source,
        "unseen_gpu_log_sigma": sigmas.unseen,
        "unseen_gpu_log_sigma_source": (
            "RMS of the leave-one-architecture-out log errors of the worst-predicted architecture's fit rows, at "
            f"least the other-stack transfer sigma ({sigmas.raw['unseen']:.4f}) times {sigmas.coverage_factor:.3f} "
            f"(pooled over all architectures: {rms(list(cv.unseen.values())):.4f})"
        ),
        "calibrated_gpus": sorted(gpu_doc),
        "fit": {
            "iterations": result.iterations,
            "in_sample_rms_log_error": rms(list(result.log_residuals.values())),
            "leave_one_out_rms_log_error": rms(list(cv.loo.values())),
            "leave_one_type_out_rms_log_error": rms(list(cv.type.values())),
            "other_stack_transfer_rms_log_error": rms(list(cv.transfer.values())),
            "leave_one_architecture_out_rms_log_error": rms(list(cv.unseen.values())),
            "coverage_factor": sigmas.coverage_factor,
            "held_out_rms_log_error": rms(list(held_errors.values())),
            "held_out_within_2_sigma": within(
                [held_errors[o.id] for o in held], [_row_sigma(o, gpu_doc, sigmas) for o in held]
            ),
            "leave_one_out_within_2_sigma": within(
                [cv.loo[o.id] for o in fit_obs if o.id in cv.loo],
                [_row_sigma(o, gpu_doc, sigmas) for o in fit_obs if o.id in cv.loo],
            ),
            "params_log": result.params,
        },
    }
    return doc, result, held_pred


def _row_sigma(o: Observation, gpu_doc: dict, sigmas: Sigmas) -> float:
    """The σ the calibration states for the row's GPU type (what its profile would carry)."""
    entry = gpu_doc.get(o.gpu.name)
    return (
        entry["log_sigma"]
        if entry
        else sigmas.for_gpu(o.arch, gpu_eager_rows=False, gpu_rows=False, arch_rows=True)
    )


def _arch_documents(
    result: CalibrationFit, fit_obs: list[Observation], sigmas: Sigmas, fitted_on: str
) -> dict:
    """Per architecture: its constants with their rows, its achievable-matmul ceiling where measured, and the σ
    of a type with the rows that define it."""
    out = {}
    for arch, constants in sorted(result.arch_constants.items()):
        arch_rows = [o for o in fit_obs if o.arch == arch]
        eager = [o for o in arch_rows if o.stack == REFERENCE_STACK]
        entry = {
            "constants": {
                p: {
                    "value": getattr(constants, p),
                    "source": f"{fitted_on}: {', '.join(o.id for o in arch_rows)}",
                }
                for p in ARCH_PARAMS
            },
            "rows": len(arch_rows),
            "eager_rows": len(eager),
            "gpus": sorted({o.gpu.name for o in arch_rows}),
            "stacks": sorted({o.stack for o in arch_rows}),
            "log_sigma": sigmas.arch(arch),
            "log_sigma_source": (
                f"RMS of leave-one-row-out log errors of its eager rows ({sigmas.raw[f'arch:{arch}']:.4f}, floor: "
                f"the data noise) times {sigmas.coverage_factor:.3f}, the factor that puts {COVERAGE_TARGET:.0%} "
                "of all cross-validated errors within 2 sigma"
                if eager
                else "seen only in other stacks than eager PyTorch: the RMS of the log errors of an architecture's "
                "eager rows predicted by a fit that saw it only in other stacks, worst architecture "
                f"({sigmas.raw['transfer']:.4f}) times {sigmas.coverage_factor:.3f}"
            ),
        }
        if f"{arch}.{SM_STREAM_PARAM}" in result.params:
            prior, prior_sigma, why = SM_STREAM_PRIORS[arch]
            entry["constants"][SM_STREAM_PARAM] = {
                "value": getattr(constants, SM_STREAM_PARAM),
                "source": f"{fitted_on}: {', '.join(o.id for o in arch_rows)}; prior {prior:g} B/FLOP, log sigma "
                f"{prior_sigma:g} ({why})",
            }
        if arch in TENSOR_CORE_CEILINGS:
            value, source = TENSOR_CORE_CEILINGS[arch]
            entry["tensor_core_ceiling"] = {
                "value": value,
                "source": f"stas00/ml-engineering compute/accelerator/README.md: {source}",
            }
        out[arch] = entry
    return out


def _stack_documents(result: CalibrationFit, fit_obs: list[Observation]) -> dict:
    """Per software stack other than eager PyTorch: its two terms and the rows that determine them."""
    out = {}
    for stack, terms in sorted(result.stack_terms.items()):
        stack_rows = [o for o in fit_obs if o.stack == stack]
        out[stack] = {
            "description": STACKS[stack].description,
            "throughput_factor": terms.throughput_factor,
            "memory_traffic": terms.memory_traffic,
            "rows": len(stack_rows),
            "gpus": sorted({o.gpu.name for o in stack_rows}),
            "anchors": sorted(
                {o.arch for o in stack_rows} & {o.arch for o in fit_obs if o.stack == REFERENCE_STACK}
            ),
        }
    return out


def _gpu_documents(rows: list, fit_obs: list[Observation], sigmas: Sigmas) -> dict:
    """Per GPU type with rows in the fit: what its rows are (kind, stack) and its σ."""
    kinds: dict[str, list[str]] = {}
    fitted = {o.id for o in fit_obs}
    for r in rows:
        if r.id in fitted:
            kinds.setdefault(r.gpu, []).append(r.kind)
    arch_of = {o.gpu.name: o.arch for o in fit_obs}
    eager_gpus = {o.gpu.name for o in fit_obs if o.stack == REFERENCE_STACK}
    out = {}
    for gpu, gpu_kinds in sorted(kinds.items()):
        arch = arch_of[gpu]
        sigma = sigmas.for_gpu(arch, gpu_eager_rows=gpu in eager_gpus, gpu_rows=True, arch_rows=True)
        if gpu in eager_gpus:
            source = f"its {arch} eager rows' cross-validated error"
        elif arch in sigmas.arch_eager:
            source = (
                f"no eager rows of its own ({', '.join(sorted(set(gpu_kinds)))}): its {arch} eager rows' "
                "cross-validated error and the unseen-type term in quadrature"
            )
        else:
            source = (
                f"rows only {', '.join(sorted(set(gpu_kinds)))}: the other-stack transfer error of an "
                "architecture seen only in another stack"
            )
        out[gpu] = {
            "rows": len(gpu_kinds),
            "kinds": sorted(set(gpu_kinds)),
            "log_sigma": sigma,
            "log_sigma_source": source,
        }
    return out


def write_document(doc: dict, path: Path) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--refresh-tables", action="store_true", help="recompute the kernel tables (fake passes)"
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_TIME_MODEL_PATH, help="where to write the constants"
    )
    args = parser.parse_args()
    catalog = load_catalog()
    rows = list(read_measured(catalog=catalog))
    if args.refresh_tables:
        write_tables(build_tables(rows))
    observations = observations_from_rows(rows, load_tables(rows), catalog)
    held_ids = held_out_ids(rows, catalog)
    print("cross-validating (a refit per row, GPU type and architecture) ...", file=sys.stderr, flush=True)
    doc, result, held_pred = calibrate(rows, observations, held_ids, progress=True)
    write_document(doc, args.out)
    print(f"wrote {args.out}", file=sys.stderr)
    kind_of = {r.id: r.kind for r in rows}
    print(
        f"{'row':34s} {'gpu':16s} {'kind':32s} {'split':8s} {'measured':>9s} {'predicted':>9s} {'error':>7s}"
    )
    for o in observations:
        held = o.id in held_ids
        pred = (
            held_pred[o.id]
            if held
            else predict(o, result.global_constants, result.arch_constants, result.stack_terms)
        )
        split = "held-out" if held else "fit"
        print(
            f"{o.id:34s} {o.gpu.name:16s} {kind_of[o.id]:32s} {split:8s} {o.samples_per_s:9.1f} {pred:9.1f} "
            f"{pred / o.samples_per_s - 1:+7.1%}"
        )
    f = doc["fit"]
    for name in (
        "in_sample_rms_log_error",
        "leave_one_out_rms_log_error",
        "leave_one_type_out_rms_log_error",
        "other_stack_transfer_rms_log_error",
        "leave_one_architecture_out_rms_log_error",
        "held_out_rms_log_error",
        "held_out_within_2_sigma",
        "leave_one_out_within_2_sigma",
        "coverage_factor",
    ):
        print(f"{name}={f[name]:.4f}")
    for name, entry in doc["global"].items():
        print(f"global.{name}={entry['value']:.4g}")
    for arch, entry in doc["arch"].items():
        for p, c in entry["constants"].items():
            print(f"{arch}.{p}={c['value']:.4g}")
        print(f"{arch}.log_sigma={entry['log_sigma']:.4f}")
    for stack, entry in doc["stacks"].items():
        print(f"stack.{stack}.throughput_factor={entry['throughput_factor']:.4g}")
        print(f"stack.{stack}.memory_traffic={entry['memory_traffic']:.4g}")
    for gpu, entry in doc["gpus"].items():
        print(f"gpu.{gpu}.log_sigma={entry['log_sigma']:.4f}")
    print(f"type_log_sigma={doc['type_log_sigma']:.4f}")
    print(f"unseen_gpu_log_sigma={doc['unseen_gpu_log_sigma']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
