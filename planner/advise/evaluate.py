"""Pricing one candidate cluster: its plan with the ``plan`` machinery, and a bound that needs no plan.

``AdviseContext`` is made once per search: one profile per GPU type of the offers (through
``planner.obtain.obtain_profile``, so the profile cache serves it as it serves ``plan``, and estimated in
this process: no GPU, no Ray) and the model's gradient layout. A candidate is then evaluated by
``planner.plan.build.build_plan`` over its rank slots with the synchronisation model of its links: the
allocator and the comm model only, milliseconds. Its plan is the one ``batchplan plan --cluster <its config>
--no-ray --method estimate`` makes (tests hold the two equal).

``bound`` is what the search prunes with: without allocating, the most throughput the candidate can reach.
Each rank's rate ``b/t(b)`` grows with ``b`` (affine ``t`` with ``t0 ≥ 0``), so it is at most ``r_i = cap_i /
t_i(cap_i)``; one micro-step's compute is at most ``T = max_i t_i(cap_i)``; the exposed synchronisation does
not grow with the compute it overlaps, so it is at least ``S = exposed(T)``. Hence (``R = Σ r_i``)::

    with a global batch B:   throughput ≤ B / (B/R + S)      (B samples need ≥ B/R of compute)
    without:                 throughput ≤ R·T / (T + S)       (Σ b_i ≤ R·t, and t/(t + S) grows with t)

and time per epoch ≥ epoch / bound, cost per epoch ≥ that time × price. Ranks excluded below the minimum
batch would break it (a smaller ring): offers whose GPU cannot hold the job are refused before (``holds_job``).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from planner.advise.candidates import Candidate
from planner.advise.offers import Offer, OfferSet
from planner.allocate.uncertainty import step_time_range_s
from planner.codec import encode
from planner.errors import InfeasiblePlanError
from planner.job import JobSpec, Method
from planner.plan.build import build_plan
from planner.plan.comm import SyncInputs, backward_share_of, ring_hops
from planner.plan.types import Plan, RankSlot
from planner.profiles.cache import ProfileCache
from planner.profiles.profile import DeviceProfile
from torchkit.estimate.ddp_sync import exposed_sync_s

ProgressSink = Callable[[str], None]

BOUND_SLACK = 1e-9
"""relative margin on the bound: the allocator's floating-point sums can land an ulp above it (seen: 2e-16)"""


@dataclass(frozen=True, kw_only=True)
class GpuFigures:
    """What the search knows of one GPU type before any plan: its profile and its best rate."""

    key: str
    """the profile's key (``planner.obtain.planned_key``), as a plan names it"""
    profile: DeviceProfile
    max_batch: int
    """the most samples per step within the job's memory budget of a free card"""
    rate_samples_per_s: float
    """``max_batch / t(max_batch)``: the most samples per second one card can do"""
    calibrated: bool
    """the step-time calibration has measured rows of this GPU type"""
    calibration_note: str
    """why the time model trusts it as far as it does (``torchkit.estimate.time_model``)"""


@dataclass(frozen=True, kw_only=True)
class Evaluated:
    """A candidate's plan and what it costs per epoch."""

    candidate: Candidate
    plan: Plan
    samples_per_s: float
    time_per_epoch_s: float
    cost_per_epoch_usd: float
    time_per_epoch_range_s: tuple[float, float]
    """at every GPU type ±1σ of its step-time model, the synchronisation from full overlap to none"""
    bound_samples_per_s: float
    """the bound the search pruned with (``bound``): never below ``samples_per_s``"""

    @property
    def cost_per_epoch_range_usd(self) -> tuple[float, float]:
        price_per_s = self.candidate.price_per_hour_usd / 3600.0
        return (self.time_per_epoch_range_s[0] * price_per_s, self.time_per_epoch_range_s[1] * price_per_s)


def advise_job(job: JobSpec) -> JobSpec:
    """The job as advise plans it: estimated profiles (an offer is not a GPU here to measure on)."""
    return dataclasses.replace(job, method=Method.ESTIMATE)


class AdviseContext:
    """Profiles and gradient layout of one job, made once and reused for every candidate."""

    def __init__(
        self,
        job: JobSpec,
        offers: OfferSet,
        *,
        epoch_samples: int,
        cache: ProfileCache | None,
        on_progress: ProgressSink = lambda _line: None,
    ) -> None:
        from planner.obtain import job_fingerprint
        from planner.obtain.gradients import gradient_layout

        self.job = advise_job(job)
        self.offers = offers
        self.epoch_samples = epoch_samples
        identity = job_fingerprint(self.job)
        self.gpus = self._profiles(identity, cache, on_progress)
        grad_bytes, source = gradient_layout(self.job, identity, cache)
        self._sync = SyncInputs(
            grad_bytes=grad_bytes, gradients_source=source, bucket_cap_mb=self.job.bucket_cap_mb
        )
        self._buckets = self._sync.buckets()

    def _profiles(
        self, identity: tuple[str, str], cache: ProfileCache | None, on_progress: ProgressSink
    ) -> dict[str, GpuFigures]:
        from planner.obtain import ProfileRequest, make_profile, obtain_profile
        from torchkit.estimate.time_model import load_time_model

        fake_passes: dict = {}  # shared by the GPU types: fake passes do not depend on the type (planner.driver)
        time_model = load_time_model()
        figures: dict[str, GpuFigures] = {}
        for gpu in dict.fromkeys(offer.gpu for offer in self.offers.offers):
            request = ProfileRequest(job=self.job, gpu=gpu, method=Method.ESTIMATE)
            got = obtain_profile(
                request,
                lambda r: make_profile(r.job, r.gpu, method=r.method, estimates_cache=fake_passes),
                cache=cache,
                identity=identity,
            )
            assert got is not None  # make_profile raises rather than giving none
            on_progress(
                f"profile of {gpu.name}: {'from the cache' if got.origin.value == 'cached' else 'estimated'}"
            )
            profile = got.profile
            cap = profile.max_batch(self.job.memory_budget_bytes(gpu.memory_bytes), self.job.multiple_of)
            rate = cap / profile.time_fit.predict_s(cap) if cap > 0 else 0.0
            uncertainty = time_model.uncertainty_for(gpu)
            figures[gpu.name] = GpuFigures(
                key=got.key,
                profile=profile,
                max_batch=cap,
                rate_samples_per_s=rate,
                calibrated=uncertainty.calibrated_gpu,
                calibration_note=uncertainty.reason or uncertainty.basis,
            )
        return figures

    def with_offers(self, offers: OfferSet) -> AdviseContext:
        """The same job and profiles over other offers (of GPU types profiled here): a search over many offer
        sets profiles once."""
        missing = sorted({o.gpu.name for o in offers.offers} - set(self.gpus))
        if missing:
            raise ValueError(f"no profile here for {', '.join(missing)}")
        other = copy.copy(self)
        other.offers = offers
        return other

    def holds_job(self, offer: Offer) -> str | None:
        """Why no candidate with this offer can hold the job, or None when its GPU can."""
        figures = self.gpus[offer.gpu.name]
        if figures.max_batch < self.job.min_batch:
            return (
                f"{offer.gpu.name} holds at most {figures.max_batch} samples per step within "
                f"{self.job.fraction:g} of its memory, below the minimum batch {self.job.min_batch} (raise "
                "--fraction, lower --min-batch or --imgsz, or drop the offer)"
            )
        fit = figures.profile.time_fit
        if fit.intercept_s < 0 or fit.s_per_sample <= 0:  # the bound's premise (module docstring)
            return f"{offer.gpu.name}: its step-time curve is not increasing in the batch ({encode(fit)})"
        return None

    def slots(self, candidate: Candidate) -> list[RankSlot]:
        """One rank slot per GPU of the candidate, as the driver makes them for a simulated idle node."""
        slots = []
        for node, offer in candidate.node_names():
            figures = self.gpus[offer.gpu.name]
            for index in range(offer.gpus_per_node):
                slots.append(
                    RankSlot(
                        node=node,
                        device_index=index,
                        gpu=offer.gpu.name,
                        profile=figures.key,
                        memory_budget_bytes=self.job.memory_budget_bytes(offer.gpu.memory_bytes),
                        total_memory_bytes=offer.gpu.memory_bytes,
                        visible_id=str(index),
                    )
                )
        return slots

    def sync_inputs(self, candidate: Candidate) -> SyncInputs:
        """The synchronisation inputs of the candidate's plan, as the driver makes them for its cluster config:
        its links, and the backward share of its GPU types' profiles (``backward_share_of``), which sets how
        much of the all-reduce the backward pass hides."""
        share, source = backward_share_of(
            [self.gpus[gpu].profile for gpu in dict.fromkeys(offer.gpu.name for offer, _ in candidate.parts)]
        )
        return dataclasses.replace(
            self._sync,
            interconnect=candidate.interconnect(self.offers),
            backward_share=share,
            backward_share_source=source,
        )

    def bound_samples_per_s(self, candidate: Candidate) -> float:
        """The most throughput the candidate can reach (module docstring), without allocating."""
        total_rate = sum(
            self.gpus[o.gpu.name].rate_samples_per_s * o.gpus_per_node * n for o, n in candidate.parts
        )
        compute_s = max(
            self.gpus[o.gpu.name].profile.time_fit.predict_s(self.gpus[o.gpu.name].max_batch)
            for o, _ in candidate.parts
        )
        sync_s = 0.0
        if candidate.num_gpus > 1:
            sync = self.sync_inputs(candidate)
            ring, _ = ring_hops(self.slots(candidate), sync)
            sync_s = exposed_sync_s(
                self._buckets, ring, compute_s=compute_s, backward_share=sync.backward_share
            )
        batch = self.job.global_batch
        bound = (
            batch / (batch / total_rate + sync_s)
            if batch is not None
            else total_rate * compute_s / (compute_s + sync_s)
        )
        return bound * (1.0 + BOUND_SLACK)

    def evaluate(self, candidate: Candidate) -> Evaluated | str:
        """The candidate's plan and figures, or why it has none (one line)."""
        slots = self.slots(candidate)
        profiles = {f.key: f.profile for f in self.gpus.values()}
        try:
            plan = build_plan(
                self.job,
                slots,
                profiles,
                sync=self.sync_inputs(candidate),
                cluster=f"advise-{candidate.slug}",
            )
        except InfeasiblePlanError as exc:
            return str(exc)
        rate = plan.throughput_samples_per_s
        time_s = self.epoch_samples / rate
        return Evaluated(
            candidate=candidate,
            plan=plan,
            samples_per_s=rate,
            time_per_epoch_s=time_s,
            cost_per_epoch_usd=time_s * candidate.price_per_hour_usd / 3600.0,
            time_per_epoch_range_s=self._time_range(plan),
            bound_samples_per_s=self.bound_samples_per_s(candidate),
        )

    def _time_range(self, plan: Plan) -> tuple[float, float]:
        """Time per epoch at every GPU type ±1σ of its step-time model (``planner.allocate.uncertainty``)."""
        sync_range = plan.comm.exposed_range_s if plan.comm is not None else (0.0, 0.0)
        low_s, high_s = step_time_range_s(
            [r.predicted_step_time_s for r in plan.ranks],
            [plan.profiles[r.profile].time_log_sigma for r in plan.ranks],
            accumulate=plan.accumulate,
            sync_range_s=sync_range,
        )
        per_step = plan.global_batch
        return (self.epoch_samples / per_step * low_s, self.epoch_samples / per_step * high_s)

    def uncalibrated(self, candidate: Candidate) -> list[str]:
        """One line per GPU type of the candidate without measured rows in the step-time calibration."""
        lines = []
        for gpu in dict.fromkeys(o.gpu.name for o, _ in candidate.parts):
            figures = self.gpus[gpu]
            if not figures.calibrated:
                sigma = math.exp(figures.profile.time_log_sigma) - 1
                lines.append(
                    f"{gpu}: no calibration rows of this GPU type; step time ±{sigma:.0%} (one sigma; "
                    f"{figures.calibration_note})"
                )
        return lines
