"""The exposed gradient synchronisation a running job measured, filed where the next plan of the same job on
the same ring finds it.

Why a slowdown, not the measured seconds. The next plan prices other splits, another global batch, other
compute times; a measured "38 ms exposed" answers only the split that ran. What carries over is how much
slower the all-reduces inside a DDP step run than the link model says (copies into and out of buckets, one
collective call per bucket, contention with the compute and the data loader, a link the config over-states):
the ring slowdown k (``torchkit.estimate.ddp_sync.fit_slowdown``), the one figure with which the model's
exposed time at the measured compute is the measured one. The next plan multiplies every all-reduce of that
ring by k and says the exposed figure is "measured in the job". (Refitting the link's alpha and beta apart
would need the all-reduce times of single buckets, which a step's one wait does not give.)

The key: only the same job on the same ring. The entry's file is keyed (:func:`sync_key_inputs`) by the job's
workload fingerprint and step fields (as a measured profile, ``planner.profiles.measured``), its gradient
bytes and ``bucket_cap_mb`` (what is all-reduced) and the torch that ran; inside it, one correction per ring
shape (``planner.plan.comm.ring_shape``: the nodes, the ranks on each, and each hop's link with its figures),
so a plan that drops a node, adds a rank or is given another network is not answered by it. A simulated run
(``--simulate-speed``) files nothing: its waits are the simulation's.

Entries: the ``sync`` namespace of the cache directory's one store (``planner.store``): an entry whose key does
not recompute from the inputs it records, or whose figures are not finite and in range, is ignored (with a
problem line for the plan). Pure: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from planner.codec import convert
from planner.errors import ConfigError
from planner.job import JobSpec
from planner.profiles import measured
from planner.profiles.key import key_of_inputs
from planner.store import CacheStore, Namespace

__all__ = ["SYNC_SCHEME", "JobSync", "find_job_sync", "store_job_sync", "sync_key_inputs"]

SYNC_SCHEME = "measured-sync-in-job"
"""the first part of a measured-synchronisation key, which tells it from a profile's"""
_MAX_SHAPES = 64
"""ring shapes kept per job (the latest): a job planned on many clusters keeps a bounded file"""


@dataclass(frozen=True, kw_only=True)
class JobSync:
    """What one real run measured of its gradient synchronisation, as the next plan uses it."""

    slowdown: float
    """ring slowdown k relative to the plan's links (``fit_slowdown``)"""
    measured_exposed_s: float
    """median exposed synchronisation per optimizer step: the slowest rank's wait after its backward"""
    predicted_exposed_s: float
    """what the plan's model (slowdown 1) predicts at the measured compute"""
    compute_s: float
    """median compute of the slowest rank per micro-step"""
    steps: int
    """optimizer steps the medians are over"""
    link: str
    """how the ranks were connected (backend, nodes, ranks) and the software: the run's marks"""
    created: str
    """ISO 8601 UTC time of the run's feedback"""

    def __post_init__(self) -> None:
        for name in ("slowdown", "measured_exposed_s", "predicted_exposed_s", "compute_s"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise ValueError(f"JobSync.{name} must be a finite number >= 0, got {value!r}")
        if not self.slowdown > 0:
            raise ValueError(f"JobSync.slowdown must be > 0, got {self.slowdown!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"JobSync.steps must be an integer >= 1, got {self.steps!r}")

    @property
    def source(self) -> str:
        """How a plan names the figure's origin."""
        return (
            f"measured in the job ({self.link}; {self.steps} steps: {self.measured_exposed_s * 1e3:.2f} ms "
            f"exposed at {self.compute_s * 1e3:.1f} ms compute, the links' model said "
            f"{self.predicted_exposed_s * 1e3:.2f} ms: all-reduces {self.slowdown:.3g}× the links' time)"
        )


def sync_key_inputs(
    job: JobSpec, *, fingerprint: str, gradient_bytes: int, bucket_cap_mb: float | None
) -> dict[str, str]:
    """The named parts of a job's measured-synchronisation key (``fingerprint``:
    ``planner.obtain.job_fingerprint(job)[0]``), in the order they are hashed."""
    values = [
        SYNC_SCHEME,
        fingerprint,
        *measured.step_fields(job),
        int(gradient_bytes),
        bucket_cap_mb,
        measured.software_version(),
    ]
    names = ["scheme", "fingerprint", *measured.STEP_FIELDS, "gradient_bytes", "bucket_cap_mb", "software"]
    return {name: str(value) for name, value in zip(names, values, strict=True)}


def _legacy(document: object, where: str) -> tuple[dict[str, JobSync], Mapping[str, str]]:
    """An entry of the release before the store: ``{"inputs": ..., "shapes": ...}``."""
    if not isinstance(document, dict):
        raise ConfigError(f"{where} is not a JSON object")
    return (
        convert(dict[str, JobSync], document.get("shapes"), where=f"{where}: shapes"),
        convert(dict[str, str], document.get("inputs"), where=f"{where}: inputs"),
    )


SYNC: Namespace[dict[str, JobSync]] = Namespace(
    what="measured synchronisation entry",
    folder="sync",
    schema="batchplan/sync-cache@1",
    payload="shapes",
    value_type=dict[str, JobSync],
    key_of=lambda inputs: key_of_inputs(dict(inputs)),
    redo="pricing the links alone",
    legacy=_legacy,
)


def find_job_sync(store: CacheStore | None, inputs: Mapping[str, str]) -> dict[str, JobSync]:
    """The corrections a real run of this job (``sync_key_inputs``) filed, by ring shape (an entry refused is
    said in the store's ``problems``)."""
    return (store.read(SYNC, key_of_inputs(dict(inputs))) if store is not None else None) or {}


def store_job_sync(store: CacheStore, inputs: Mapping[str, str], shape: str, sync: JobSync) -> Path:
    """File ``sync`` for the ring ``shape`` of this job, beside the corrections of its other shapes (the
    latest ``_MAX_SHAPES``). Raises ConfigError where the cache cannot be written."""
    shapes = {s: j for s, j in find_job_sync(store, inputs).items() if s != shape}
    shapes[shape] = sync
    return store.write(SYNC, inputs, dict(list(shapes.items())[-_MAX_SHAPES:]))
