"""Ground truth for the estimator on CPU: run the same training step for real and read its peak from the
profiler's allocation records.

``torch.profiler`` with ``profile_memory=True`` records every CPU allocator call (size > 0 for an
allocation, < 0 for a free), including scratch that kernels allocate and free inside an operator
(oneDNN reorders, ``aten`` temporaries) that a dispatch mode never sees. Model, optimizer and batch are
built inside the profiled region, so the running sum of the records starts at zero and its maximum is
the peak memory the step needed. Peak RSS is not used: glibc keeps freed pages and the numbers drift by
tens of MiB.

Two readings are offered: ``"allocations"`` (running sum of kineto's raw ``[memory]`` records, cheap)
and ``"memory_profile"`` (the timeline of ``torch.profiler._memory_profiler.MemoryProfile`` summed over
CREATE/DESTROY, which needs ``record_shapes`` and ``with_stack`` and is several times slower). They agree
to the byte on the workloads tested; the tests hold them together on a small case.

Run ``python -m torchkit.estimate.cpu_truth --model resnet18 --batch 2 --imgsz 64`` to get one figure as
JSON; :func:`measure_cpu_peak_in_subprocess` does that in a fresh process (what the bench uses, so no
allocator state or autocast cache leaks from one measurement to the next).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Literal, get_args

Method = Literal["allocations", "memory_profile"]


@dataclass(frozen=True, kw_only=True)
class CpuTruth:
    """A real CPU training step's peak memory."""

    peak_bytes: int
    """largest running sum of allocator bytes over the run"""
    method: str
    """allocations or memory_profile"""
    wall_s: float
    """how long the profiled run took"""


def measure_cpu_peak(
    workload,  # noqa: ANN001 (torchkit.workloads.Workload; imported lazily)
    batch: int,
    *,
    amp: str = "off",
    optimizer: str = "sgd",
    method: Method = "allocations",
) -> CpuTruth:
    """Run the estimator's training step (:mod:`torchkit.step.train_step`) for real on CPU, profiled."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from torchkit.step.train_step import check_options, make_optimizer, run_training_iterations

    check_options(amp, optimizer)
    detailed = method == "memory_profile"
    torch.manual_seed(0)
    start = time.perf_counter()
    with profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=detailed, with_stack=detailed
    ) as prof:
        model = workload.build_model()
        opt = make_optimizer(optimizer, [p for p in model.parameters() if p.requires_grad])
        inputs, targets = workload.make_batch(batch)
        run_training_iterations(model, opt, inputs, targets, workload.loss_fn, amp=amp)
        del model, opt, inputs, targets
    wall_s = time.perf_counter() - start
    peak = _memory_profile_peak(prof) if detailed else _allocation_events_peak(prof)
    return CpuTruth(peak_bytes=peak, method=method, wall_s=wall_s)


def _allocation_events_peak(prof) -> int:  # noqa: ANN001
    # kineto's raw "[memory]" records: one per allocator call, nbytes < 0 for a free
    records = sorted(
        (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
    )
    live = peak = 0
    for _, delta in records:
        live += delta
        peak = max(peak, live)
    return int(peak)


def _memory_profile_peak(prof) -> int:  # noqa: ANN001
    from torch.profiler._memory_profiler import Action, MemoryProfile

    live = peak = 0
    for _, action, _, nbytes in MemoryProfile(prof.profiler.kineto_results).timeline:
        if action in (Action.CREATE, Action.PREEXISTING):
            live += nbytes
        elif action == Action.DESTROY:
            live -= nbytes
        peak = max(peak, live)
    return int(peak)


def measure_cpu_peak_in_subprocess(
    model: str,
    batch: int,
    *,
    imgsz: int | None = None,
    seq_len: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    vocab_size: int | None = None,
    input_dtype: str | None = None,
    amp: str = "off",
    optimizer: str = "sgd",
    method: Method = "allocations",
    timeout_s: float = 1800.0,
) -> CpuTruth:
    """:func:`measure_cpu_peak` in a fresh Python process (workload by name, as ``get_workload`` takes it)."""
    cmd = [sys.executable, "-m", "torchkit.estimate.cpu_truth", "--model", model, "--batch", str(batch)]
    cmd += ["--amp", amp, "--optimizer", optimizer, "--method", method]
    if imgsz is not None:
        cmd += ["--imgsz", str(imgsz)]
    if seq_len is not None:
        cmd += ["--seq-len", str(seq_len)]
    if input_shape is not None:
        cmd += ["--input-shape", ",".join(str(d) for d in input_shape)]
    if vocab_size is not None:
        cmd += ["--vocab-size", str(vocab_size)]
    if input_dtype is not None:
        cmd += ["--input-dtype", input_dtype]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=os.environ.copy())
    if done.returncode != 0:
        raise RuntimeError(f"ground-truth run failed ({' '.join(cmd)}):\n{done.stderr[-4000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]  # the profiler may log too
    return CpuTruth(**json.loads(lines[-1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Peak memory of a real CPU training step (profiler), as JSON"
    )
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--imgsz", type=int)
    parser.add_argument("--seq-len", type=int)
    parser.add_argument("--input-shape")
    parser.add_argument("--vocab-size", type=int)
    parser.add_argument("--input-dtype")
    parser.add_argument("--amp", default="off")
    parser.add_argument("--optimizer", default="sgd")
    parser.add_argument("--method", default="allocations", choices=get_args(Method))
    args = parser.parse_args(argv)
    from torchkit.workloads import get_workload

    shape = tuple(int(d) for d in args.input_shape.split(",")) if args.input_shape else None
    workload = get_workload(
        args.model,
        imgsz=args.imgsz,
        seq_len=args.seq_len,
        input_shape=shape,
        vocab_size=args.vocab_size,
        input_dtype=args.input_dtype,
    )
    truth = measure_cpu_peak(workload, args.batch, amp=args.amp, optimizer=args.optimizer, method=args.method)
    print(json.dumps(asdict(truth)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
