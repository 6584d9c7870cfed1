"""Measuring a training step's memory and time on a real CUDA GPU: the ``measure`` profiling method.

The step is the estimator's (``torchkit.step.train_step``: forward under autocast, backward, optimizer step,
the same optimizer settings), so measured and estimated curves describe the same work. Per probe batch:
peak *reserved* memory of the caching allocator (what the device must hold) plus the CUDA context the
allocator does not see, the median of synchronised step times after a warm-up step, and the median backward
share of those steps (``PhaseTimer``: the backward pass's share of forward + backward, which DDP's all-reduces
overlap; ``planner.plan.comm``). Probing doubles the
batch and stops at the first out-of-memory error (it becomes the profile's ``oom_batch``), or once a step
needs more than ``stop_fraction`` of the device.

Known limitations: the CUDA context is the overhead model's constant (``CudaOverhead.context_bytes``), not
read from the driver, so that measured and estimated device bytes stay comparable; other processes on the
same GPU change the free memory but not these figures.
"""

from __future__ import annotations

import gc
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torchkit.step.clock import DeviceClock
from torchkit.step.train_step import StepHooks

log = logging.getLogger(__name__)

#: first probe batches; doubling continues from the last one
DEFAULT_START_BATCHES = (1, 2, 4, 8)
#: stop probing once a step reserves this share of the device (the next doubling would likely not fit)
DEFAULT_STOP_FRACTION = 0.45
MAX_PROBE_BATCH = 8192


@dataclass(frozen=True, kw_only=True)
class MeasuredCurve:
    memory_points: tuple[tuple[int, int], ...]
    """(batch, device bytes): peak reserved + CUDA context"""
    time_points: tuple[tuple[int, float], ...]
    """(batch, median seconds of one step)"""
    oom_batch: int | None
    """first batch that ran out of memory; None if probing stopped before"""
    allocated_points: tuple[tuple[int, int], ...] = ()
    """(batch, peak allocated bytes): for calibrating the estimator's fragmentation factor"""
    backward_shares: tuple[tuple[int, float], ...] = ()
    """(batch, median backward share of the timed steps): ``PhaseTimer.backward_shares``"""


class PhaseTimer(StepHooks):
    """Marks each training step's forward start, backward start and backward end (``train_step``'s hooks) on
    ``device``'s clock (``torchkit.step.clock.DeviceClock``: CUDA events on a CUDA device, else ``clock``).
    ``backward_shares()`` gives each step's backward / (forward + backward), the loss in the forward; the
    optimizer step and zeroing the gradients are outside both."""

    def __init__(self, device: Any = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = DeviceClock(device, clock)
        self._steps: list[list] = []

    def forward(self) -> None:
        self._steps.append([self._clock.mark()])

    def backward(self) -> None:
        self._steps[-1].append(self._clock.mark())

    def after_backward(self, params: list) -> None:
        self._steps[-1].append(self._clock.mark())

    def backward_shares(self) -> list[float]:
        """backward / (forward + backward) of every step marked to its backward's end."""
        shares = []
        for start, mid, end in (marks for marks in self._steps if len(marks) == 3):
            forward_s, backward_s = self._clock.elapsed_s(start, mid), self._clock.elapsed_s(mid, end)
            if forward_s > 0 and backward_s > 0:
                shares.append(backward_s / (forward_s + backward_s))
        return shares


def _probe_batches(start: Sequence[int]) -> list[int]:
    batches = list(start)
    while batches[-1] * 2 <= MAX_PROBE_BATCH:
        batches.append(batches[-1] * 2)
    return batches


def measure_curve(
    workload,
    device,
    *,
    amp: str = "off",
    optimizer: str = "sgd",
    start_batches: Sequence[int] = DEFAULT_START_BATCHES,
    stop_fraction: float = DEFAULT_STOP_FRACTION,
    repeats: int = 3,
    context_bytes: int,
) -> MeasuredCurve:
    """Probe ``workload`` on a CUDA ``device`` at growing batches.

    ``context_bytes`` (the CUDA context, outside PyTorch's allocator) is added to every reserved peak; pass
    the estimator's ``torchkit.estimate.overhead.DEFAULT_CUDA_OVERHEAD.context_bytes`` so that measured and
    estimated profiles count the same memory.

    Raises:
        RuntimeError: ``device`` is not a usable CUDA device, or not even the first batch ran.
    """
    import torch

    from torchkit.step.oom import is_out_of_memory_error
    from torchkit.step.train_step import make_optimizer, to_device

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError(f"measuring needs a CUDA device, got {device}")
    total = torch.cuda.get_device_properties(device).total_memory
    model = workload.build_model().to(device)
    opt = make_optimizer(optimizer, list(model.parameters()))
    memory: list[tuple[int, int]] = []
    allocated: list[tuple[int, int]] = []
    times: list[tuple[int, float]] = []
    shares: list[tuple[int, float]] = []
    oom_batch = None
    try:
        for batch in _probe_batches(start_batches):
            inputs, targets = workload.make_batch(batch)
            inputs = to_device(inputs, device)
            targets = to_device(targets, device)
            try:
                peak_reserved, peak_allocated, samples, batch_shares = _measure_batch(
                    model, opt, inputs, targets, workload.loss_fn, amp=amp, device=device, repeats=repeats
                )
            except Exception as exc:
                if not is_out_of_memory_error(exc):
                    raise
                oom_batch = batch
                log.info("batch %d ran out of memory on %s: stopping the probes", batch, device)
                break
            finally:
                del inputs, targets
                opt.zero_grad(set_to_none=True)
                gc.collect()
                torch.cuda.empty_cache()
            memory.append((batch, int(peak_reserved) + context_bytes))
            allocated.append((batch, int(peak_allocated)))
            times.append((batch, statistics.median(samples)))
            if batch_shares:
                shares.append((batch, statistics.median(batch_shares)))
            if peak_reserved > stop_fraction * total:
                break
    finally:
        del model, opt
        gc.collect()
        torch.cuda.empty_cache()
    if not memory:
        raise RuntimeError(
            f"not even batch {start_batches[0]} fits on {device}: free memory or use a smaller input"
        )
    return MeasuredCurve(
        memory_points=tuple(memory),
        time_points=tuple(times),
        oom_batch=oom_batch,
        allocated_points=tuple(allocated),
        backward_shares=tuple(shares),
    )


def _measure_batch(
    model, opt, inputs, targets, loss_fn, *, amp: str, device, repeats: int
) -> tuple[int, int, list[float], list[float]]:
    """Peak reserved and allocated bytes of two training iterations, then ``repeats`` timed iterations: their
    seconds and backward shares (``PhaseTimer``; its events cost microseconds of a step's milliseconds)."""
    import torch

    from torchkit.step.train_step import run_training_iterations

    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    # two iterations: the second one has the optimizer state of a real training loop
    run_training_iterations(
        model, opt, inputs, targets, loss_fn, amp=amp, num_iterations=2, device_type="cuda"
    )
    torch.cuda.synchronize(device)
    peak_reserved = torch.cuda.max_memory_reserved(device)
    peak_allocated = torch.cuda.max_memory_allocated(device)
    samples = []
    phases = PhaseTimer(device)
    for _ in range(repeats):
        start = time.perf_counter()
        run_training_iterations(
            model, opt, inputs, targets, loss_fn, amp=amp, hooks=phases, num_iterations=1, device_type="cuda"
        )
        torch.cuda.synchronize(device)
        samples.append(time.perf_counter() - start)
    return peak_reserved, peak_allocated, samples, phases.backward_shares()
