"""Regenerate the step-time model's constants from the measured data and print the fit's residuals.

    python bench/calibrate_time.py [--refresh-tables] [--out PATH]

1. reads ``torchkit/estimate/calibration/measured_throughput.csv`` (public measured single-GPU training
   throughput, a source per row) and the cached kernel table of every row's configuration
   (``kernel_tables.json``; ``--refresh-tables`` recomputes them with one fake pass each, ~1 min);
2. fits the roofline's efficiencies by least squares on log throughput to the rows *not* held out
   (``held_out_ids``: a third of each (architecture, precision) group, by a hash of the row ids), priors and
   shrinkage as
   ``torchkit/estimate/calibration/fit.py`` says;
3. the uncertainty per architecture, calibrated for coverage: the RMS of leave-one-row-out log errors of its
   fit rows (at least the data noise), all scaled by the one factor that makes 95% of those errors lie
   within 2σ (``coverage_scale``; RMS alone under-covers heavy-tailed errors); for architectures without
   rows: its neighbours' errors when each of them was the unseen one (leave one architecture out): the RMS
   of the worst-predicted architecture's rows (an unseen card's rows share one bias, so rows pooled over
   architectures would understate it), at least the σ that covers 95% of all those errors at 2σ; the
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
    coverage_scale,
    held_out_predictions,
    log_errors,
    observations_from_rows,
    rms,
    within,
)
from torchkit.estimate.calibration.data import DATA_PATH, held_out_ids, read_measured  # noqa: E402
from torchkit.estimate.calibration.fit import ARCH_PARAMS, DATA_LOG_SIGMA, GLOBAL_PARAMS, fit, predict  # noqa: E402
from torchkit.estimate.calibration.tables import build_tables, load_tables, write_tables  # noqa: E402
from torchkit.estimate.roofline import TimeConstants  # noqa: E402
from torchkit.estimate.time_model import DEFAULT_TIME_MODEL_PATH, PRIOR_CONSTANTS  # noqa: E402
from torchkit.hardware.catalog import load_catalog  # noqa: E402

PRIOR_SOURCES = {
    "kernel_launch_s": "prior, not fitted: cudaLaunchKernel ~1-3 us on CUDA 12 drivers (approximate)",
    "eager_dispatch_s": "prior, not fitted: ~5-25 us CPU per eager op (jiahuanglin.xyz 'From PyTorch op to kernel launch')",
}


def calibrate(rows: list, observations: list, held_ids: frozenset[str]) -> tuple[dict, object, dict]:
    """Fit, cross-validate, and build the time-model document. Returns (document, fit result, held-out
    predictions of the shipped fit)."""
    fit_obs = [o for o in observations if o.id not in held_ids]
    fit_ids = [o.id for o in fit_obs]
    result = fit(fit_obs, PRIOR_CONSTANTS)
    loo = log_errors(fit_obs, held_out_predictions(fit_obs, PRIOR_CONSTANTS, lambda o: o.id))
    by_arch_out = log_errors(fit_obs, held_out_predictions(fit_obs, PRIOR_CONSTANTS, lambda o: o.arch))
    rel_data = os.path.relpath(DATA_PATH, REPO)
    digest = hashlib.sha256(DATA_PATH.read_bytes()).hexdigest()[:12]
    fitted_on = f"fit on {len(fit_ids)} rows of {rel_data}"
    glob = {}
    for f in fields(TimeConstants):
        value = getattr(result.global_constants, f.name)
        source = f"{fitted_on} (all architectures)" if f.name in GLOBAL_PARAMS else PRIOR_SOURCES[f.name]
        glob[f.name] = {"value": value, "source": source}
    arch_doc = _arch_documents(result, fit_obs, loo, fitted_on)
    held = [o for o in observations if o.id in held_ids]
    held_pred = {o.id: predict(o, result.global_constants, result.arch_constants) for o in held}
    held_errors = log_errors(held, held_pred)
    unseen = _unseen_sigma(by_arch_out, fit_obs)
    sigma_of = {a: e["log_sigma"] for a, e in arch_doc.items()}
    held_sigmas = [sigma_of.get(o.arch, unseen) for o in held]
    doc = {
        "generated_by": "python bench/calibrate_time.py",
        "data": f"{rel_data} (sha256 {digest}; {len(rows)} rows, {len(fit_ids)} fitted, {len(held)} held out)",
        "fit_rows": fit_ids,
        "held_out_rows": [o.id for o in held],
        "global": glob,
        "arch": arch_doc,
        "unseen_gpu_log_sigma": unseen,
        "unseen_gpu_log_sigma_source": (
            "RMS of the leave-one-architecture-out log errors of the worst-predicted architecture's fit rows "
            f"(pooled over all architectures: {rms(list(by_arch_out.values())):.4f})"
        ),
        "calibrated_gpus": sorted({o.gpu.name for o in fit_obs}),
        "fit": {
            "iterations": result.iterations,
            "in_sample_rms_log_error": rms(list(result.log_residuals.values())),
            "leave_one_out_rms_log_error": rms(list(loo.values())),
            "held_out_rms_log_error": rms(list(held_errors.values())),
            "held_out_within_2_sigma": within([held_errors[o.id] for o in held], held_sigmas),
            "leave_one_out_within_2_sigma": within([loo[o.id] for o in fit_obs], [sigma_of[o.arch] for o in fit_obs]),
            "params_log": result.params,
        },
    }
    return doc, result, held_pred


def _arch_documents(result, fit_obs: list, loo: dict[str, float], fitted_on: str) -> dict:
    """Per architecture: its constants with their rows, and its σ calibrated for coverage (module docstring)."""
    base = {
        arch: max(rms([loo[o.id] for o in fit_obs if o.arch == arch]), DATA_LOG_SIGMA)
        for arch in result.arch_constants
    }
    scale = coverage_scale([loo[o.id] for o in fit_obs], [base[o.arch] for o in fit_obs])
    out = {}
    for arch, constants in sorted(result.arch_constants.items()):
        arch_rows = [o for o in fit_obs if o.arch == arch]
        out[arch] = {
            "constants": {
                p: {"value": getattr(constants, p), "source": f"{fitted_on}: {', '.join(o.id for o in arch_rows)}"}
                for p in ARCH_PARAMS
            },
            "rows": len(arch_rows),
            "gpus": sorted({o.gpu.name for o in arch_rows}),
            "log_sigma": scale * base[arch],
            "log_sigma_source": (
                f"RMS of leave-one-row-out log errors of these rows ({base[arch]:.4f}, floor: the data noise) times "
                f"{scale:.3f}, the factor that puts {COVERAGE_TARGET:.0%} of all fit rows' leave-one-out errors "
                "within 2 sigma"
            ),
        }
    return out


def _unseen_sigma(by_arch_out: dict[str, float], fit_obs: list) -> float:
    """σ of a GPU architecture without rows, from the leave-one-architecture-out errors (module docstring)."""
    errors = list(by_arch_out.values())
    pooled = max(rms(errors), DATA_LOG_SIGMA)
    worst = max(rms([by_arch_out[o.id] for o in fit_obs if o.arch == arch]) for arch in {o.arch for o in fit_obs})
    return max(worst, pooled * coverage_scale(errors, [pooled] * len(errors)))


def write_document(doc: dict, path: Path) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--refresh-tables", action="store_true", help="recompute the kernel tables (fake passes)")
    parser.add_argument("--out", type=Path, default=DEFAULT_TIME_MODEL_PATH, help="where to write the constants")
    args = parser.parse_args()
    catalog = load_catalog()
    rows = list(read_measured(catalog=catalog))
    if args.refresh_tables:
        write_tables(build_tables(rows))
    observations = observations_from_rows(rows, load_tables(rows), catalog)
    held_ids = held_out_ids(rows, catalog)
    doc, result, held_pred = calibrate(rows, observations, held_ids)
    write_document(doc, args.out)
    print(f"wrote {args.out}", file=sys.stderr)
    print(f"{'row':30s} {'gpu':16s} {'split':8s} {'measured':>9s} {'predicted':>9s} {'error':>7s}")
    for o in observations:
        held = o.id in held_ids
        pred = held_pred[o.id] if held else predict(o, result.global_constants, result.arch_constants)
        split = "held-out" if held else "fit"
        print(f"{o.id:30s} {o.gpu.name:16s} {split:8s} {o.samples_per_s:9.1f} {pred:9.1f} {pred / o.samples_per_s - 1:+7.1%}")
    f = doc["fit"]
    print(f"in_sample_rms_log_error={f['in_sample_rms_log_error']:.4f}")
    print(f"leave_one_out_rms_log_error={f['leave_one_out_rms_log_error']:.4f}")
    print(f"held_out_rms_log_error={f['held_out_rms_log_error']:.4f}")
    print(f"held_out_within_2_sigma={f['held_out_within_2_sigma']:.3f}")
    print(f"leave_one_out_within_2_sigma={f['leave_one_out_within_2_sigma']:.3f}")
    for name, entry in doc["global"].items():
        print(f"global.{name}={entry['value']:.4g}")
    for arch, entry in doc["arch"].items():
        for p, c in entry["constants"].items():
            print(f"{arch}.{p}={c['value']:.4g}")
        print(f"{arch}.log_sigma={entry['log_sigma']:.4f}")
    print(f"unseen_gpu_log_sigma={doc['unseen_gpu_log_sigma']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
