"""The identity of an estimate: what cached estimated profiles are named with (pure Python, no torch, so a
warm plan can name its profiles without importing torch)."""

from __future__ import annotations

from torchkit.estimate.time_model import time_model_id

ESTIMATE_REVISION = "2026-12-02"
"""Changes whenever a change to the estimator alters what it returns for the same model, batch and GPU (the
operator costs, the probes, the overhead model): cached estimated profiles are named with it
(:func:`estimate_identity`), so an upgrade never reads an estimate the old code made. 2026-12-01: grouped
convolution backward FLOPs, the range probe of launch-bound models. 2026-12-02: attention priced as CUDA's
fused kernels run it on a CUDA target (torchkit/estimate/attention.py)."""


def estimate_identity() -> str:
    """What an estimate is made and priced with: the estimator's revision and the step-time calibration's
    identity (a new calibration is a new estimate too)."""
    return f"{time_model_id()}+estimator-{ESTIMATE_REVISION}"
