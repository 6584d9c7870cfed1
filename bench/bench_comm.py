"""Gradient synchronisation: the model's step (compute + exposed sync) against real DDP jobs.

Usage: ``python bench/bench_comm.py [--repeats 9] [--rounds 3] [--cases NAME,...]``. Prints one row per case,
the PyTorch published DDP benchmark setting, and the line
``comm: cases=N max_step_error=X% max_sync_error=Y% sync_share=A-B% ...`` (then ``sync_cases``, the sync error
with the noisy cases in, the probe's error against DDP's buckets alone, and ``load``: the 1-minute load average
before the run and after each world size); writes bench/results/comm.json.

What runs: for each world size (2, 3, 4), that many processes on 127.0.0.1 form a gloo process group
(``GLOO_SOCKET_IFNAME=lo``, one torch thread each). Each case is a real ``DistributedDataParallel`` model (a
stack of layers with a Linear's weight and bias, 1 MB to 200 MB of fp32 gradients, DDP's default buckets,
``gradient_as_bucket_view``). Each layer carries a fixed *device time*: a forward and a backward sleep that
stand for a GPU's kernels, so the CPU is free for gloo while "the device" computes, as it is on a GPU node; the
sleeps sit inside autograd, so the gradients become ready layer by layer through the backward pass and DDP's
bucket all-reduces overlap it for real. One repetition, every part after a barrier, interleaved so that all
see the same load:

- the probe: one all-reduce of each of 256 KiB .. 50 MiB (``PROBE_SIZES``), as the NodeProbe actors do;
- DDP's buckets alone: buffers of the model's bucket sizes all-reduced back to back (what Σ T(s_k) stands for);
- a ``no_sync()`` step: compute alone, forward and backward timed apart (the measured backward share; the
  slowest rank's of each step, gathered, since every all-reduce waits for it);
- a synchronised step (forward to the end of ``backward()``, which returns once DDP's all-reduces are done);
- the same step of a twin model whose comm hook sends nothing: DDP's own per-step cost without communication.

Gradients are zeroed in place, never freed (a freed gradient is allocated and first touched again by the
next backward, which the ``no_sync`` step would pay and the synchronised one, writing into DDP's persistent
buckets, would not). Medians over ``repeats`` after 3 warm-ups; with ``--rounds R`` every world size runs R
times one after another and each figure is the median of the rounds' (the load on a shared machine moves
between rounds). The probe's medians are fitted to ``T(s) = alpha + (2(n-1)/n)·s/busbw``
(``torchkit.estimate.ddp_sync.fit_link``). ``exposed = step - compute``.

Prediction: the measured compute plus the model's exposed sync (``exposed_sync_s``: DDP's buckets, the ring
over the probe-fitted link, overlap with the measured backward; gloo reduces on the cores, so the overlap
efficiency is the share of the backward its cores are idle). The link is one fit per world size, through each
probe size's median over all that world size's cases: a plan has one measured link per cluster, not one per
model (``max_sync_error_own_probe``: the same over the fit of each case's own interleaved probes). Errors: step ``pred/meas - 1``; sync
``(pred - meas exposed)``, relative to the measured exposed time. An exposed time within twice the standard
error of its median (1.2533·1.4826·MAD/√n; over rounds the larger of that and the rounds' spread) is noise: its
error is printed with ``*`` and left out of ``max_sync_error`` (it is in ``max_sync_error_with_noise``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.net import free_port  # noqa: E402
from torchkit.estimate.ddp_sync import (  # noqa: E402
    LinkCost,
    RingCost,
    ddp_buckets,
    exposed_sync_s,
    fit_link,
)

PROBE_SIZES = [2**18, 2**20, 2**23, 25 * 2**20, 50 * 2**20]
"""256 KiB .. 50 MiB: around DDP's bucket sizes (1 MiB first, 25 MiB cap), and below them, where alpha dominates"""
BATCH = 1
"""samples per step: the Linear layers' real CPU work stays small next to their device time"""


@dataclass(frozen=True)
class Case:
    name: str
    world: int
    layers: int
    width: int
    forward_ms: float
    """device time of one layer's forward"""
    backward_ms: float
    """device time of one layer's backward"""

    @property
    def grad_bytes(self) -> int:
        return self.layers * (self.width * self.width + self.width) * 4


CASES = [
    Case("1MB-compute-bound", 2, 4, 256, 10.0, 20.0),
    Case("10MB", 2, 10, 512, 1.0, 2.0),
    Case("50MB", 2, 12, 1024, 2.0, 4.0),
    Case("200MB", 2, 12, 2048, 4.0, 8.0),
    Case("10MB-x3", 3, 10, 512, 1.0, 2.0),
    Case("50MB-x4", 4, 12, 1024, 2.0, 4.0),
]


def _device_time():
    import torch

    class DeviceTime(torch.autograd.Function):
        """Sleeps as a GPU kernel would keep the device busy: forward ``f`` s, backward ``b`` s."""

        @staticmethod
        def forward(ctx, x, f, b):
            ctx.b = b
            time.sleep(f)
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            time.sleep(ctx.b)
            return grad, None, None

    return DeviceTime


def _model(case: Case):
    import torch

    device_time = _device_time()

    class Layer(torch.nn.Module):
        """A width×width weight and bias (a Linear's gradient bytes) of which the forward uses one row: the
        gradient is as large as a Linear's but made at memory speed, so the host's CPU work stays small next
        to the device time and the ranks' compute is what the device time says."""

        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(case.width, case.width) * 0.01)
            self.bias = torch.nn.Parameter(torch.zeros(case.width))

        def forward(self, x):
            return device_time.apply(
                x + self.weight[0] + self.bias, case.forward_ms / 1e3, case.backward_ms / 1e3
            )

    torch.manual_seed(0)
    return torch.nn.Sequential(*[Layer() for _ in range(case.layers)])


def _timed_allreduce(buffers: list, world: int) -> list[float]:
    """One timed all-reduce of each buffer, after a barrier; as DDP treats a bucket (divided by the world
    size, all-reduced), so that the probe's link is the one DDP's buckets see."""
    import torch.distributed as dist

    times = []
    for t in buffers:
        dist.barrier()
        start = time.perf_counter()
        t.div_(world)
        dist.all_reduce(t)
        times.append(time.perf_counter() - start)
    return times


def _no_communication(state, bucket):
    """A comm hook that all-reduces nothing: the bucket comes back as it is."""
    import torch

    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def _buckets_alone(buffers: list, world: int) -> float:
    """DDP's buckets all-reduced one after another with nothing else running (after one barrier), as DDP
    calls them (divided by the world size, one call per bucket): what the model's Σ T(s_k) stands for."""
    import torch.distributed as dist

    dist.barrier()
    start = time.perf_counter()
    for t in buffers:
        t.div_(world)
        dist.all_reduce(t)
    return time.perf_counter() - start


def _run_case(case: Case, repeats: int, world: int) -> dict:
    """Probe, compute-only step and synchronised step, interleaved ``3 + repeats`` times (the first three
    warm up: DDP builds and rebuilds its buckets); medians of each."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    # gradient_as_bucket_view: the gradients live in the buckets, as on a GPU where DDP's copies into and out of
    # them cost microseconds; on a CPU they are two passes over every byte that no GPU job pays
    ddp = DistributedDataParallel(_model(case), gradient_as_bucket_view=True)
    # the same step without communication: DDP's own per-step cost (autograd hooks, bucket views, finalize)
    silent = DistributedDataParallel(_model(case), gradient_as_bucket_view=True)
    silent.register_comm_hook(None, _no_communication)
    x = torch.randn(BATCH, case.width)
    buffers = [torch.ones(size // 4) for size in PROBE_SIZES]
    bucket_buffers = [torch.ones(b.size_bytes // 4) for b in ddp_buckets(_grad_sizes(case))]
    fwd, bwd, compute, step, probes, cpu, alone, silent_steps = [], [], [], [], [], [], [], []
    for i in range(3 + repeats):
        probe = _timed_allreduce(buffers, world)
        buckets_alone = _buckets_alone(bucket_buffers, world)
        dist.barrier()
        with ddp.no_sync():
            start = time.perf_counter()
            loss = ddp(x).sum()
            mid = time.perf_counter()
            cpu_start = time.process_time()
            loss.backward()
            end = time.perf_counter()
            cpu.append(time.process_time() - cpu_start)
        # zeroed in place, never freed: a freed gradient is allocated and first touched again by the next
        # backward (page faults over every byte: 170 ms for 200 MB at load 4), which the no_sync step would pay
        # and the synchronised one, writing into DDP's persistent buckets, would not
        ddp.zero_grad(set_to_none=False)
        dist.barrier()
        start_sync = time.perf_counter()
        ddp(x).sum().backward()
        end_sync = time.perf_counter()
        ddp.zero_grad(set_to_none=False)
        dist.barrier()
        start_silent = time.perf_counter()
        silent(x).sum().backward()
        silent_s = time.perf_counter() - start_silent
        silent.zero_grad(set_to_none=False)
        # the slowest rank's compute of this step: the one every all-reduce waits for (the model's premise)
        mine = torch.tensor([mid - start, end - mid, cpu[-1]], dtype=torch.float64)
        every = [torch.zeros(3, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(every, mine)
        slowest = max(every, key=lambda t: float(t[0] + t[1])).tolist()
        cpu[-1] = slowest[2]
        if i >= 3:
            fwd.append(slowest[0])
            bwd.append(slowest[1])
            compute.append(slowest[0] + slowest[1])
            step.append(end_sync - start_sync)
            probes.append(probe)
            alone.append(buckets_alone)
            silent_steps.append(silent_s)
    med = statistics.median
    cpu = cpu[3:]
    return {
        "forward_s": med(fwd),
        "backward_s": med(bwd),
        "compute_s": med(compute),
        "step_s": med(step),
        "backward_cpu_s": med(cpu),
        "buckets_alone_s": med(alone),
        "silent_step_s": med(silent_steps),
        "exposed_noise_s": _median_noise_s([s - c for s, c in zip(step, compute, strict=True)]),
        "probe_s": [med(p[j] for p in probes) for j in range(len(PROBE_SIZES))],
    }


def _worker(rank: int, world: int, port: int, cases: list[Case], repeats: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=300))
    try:
        results = {c.name: _run_case(c, repeats, world) for c in cases}
        if rank == 0:
            Path(out).write_text(json.dumps({"cases": results}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _measure(world: int, cases: list[Case], repeats: int) -> dict:
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        mp.start_processes(
            _worker, args=(world, free_port(), cases, repeats, out), nprocs=world, start_method="spawn"
        )
        return json.loads(Path(out).read_text())


def _grad_sizes(case: Case) -> list[int]:
    return [(case.width * case.width) * 4, case.width * 4] * case.layers  # weight, bias per layer


def _median_noise_s(values: list[float]) -> float:
    """The standard error of a median of ``values``: 1.2533·σ/√n, σ estimated robustly as 1.4826·MAD
    (normal-theory factors)."""
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    return 1.2533 * 1.4826 * mad / len(values) ** 0.5


def _predict(case: Case, link: LinkCost, measured: dict) -> float:
    """The model's exposed sync of one optimizer step, at the measured compute and backward share."""
    grads = _grad_sizes(case)
    ring = RingCost(num_ranks=case.world, num_nodes=1, intra=link, network=None, base_latency_s=0.0)
    share = measured["backward_s"] / measured["compute_s"]
    # gloo reduces on the host's cores: it gets what the backward pass leaves idle
    idle = max(0.0, 1.0 - measured["backward_cpu_s"] / measured["backward_s"])
    return exposed_sync_s(
        ddp_buckets(grads),
        ring,
        compute_s=measured["compute_s"],
        backward_share=share,
        overlap_efficiency=idle,
    )


def _pytorch_ddp_benchmark() -> dict:
    """ResNet-50, batch 32, 16 V100 (2 DGX-1 nodes × 8), 4×100 Gb IB per node: pytorch/pytorch
    benchmarks/distributed/ddp/README.md measures 0.097 s/iteration without DDP and 0.104 s on 16 GPUs."""
    import torch

    from planner.interconnect import Interconnect
    from torchkit.estimate.ddp_sync import gradient_bytes_of
    from torchkit.hardware.links import NCCL_NET_STEP_S
    from torchkit.workloads import get_workload

    with torch.device("meta"):
        grads = gradient_bytes_of(get_workload("resnet50").build_model())
    intra = Interconnect().intra_link("dgx1", "V100-SXM2-16GB")
    net = LinkCost(
        name="network", bus_bytes_per_s=4 * 100e9 / 8, step_latency_s=NCCL_NET_STEP_S, source="4x100 Gb IB"
    )
    ring = RingCost(num_ranks=16, num_nodes=2, intra=intra, network=net)
    compute_s = 0.097
    exposed = exposed_sync_s(ddp_buckets(grads), ring, compute_s=compute_s, backward_share=2 / 3)
    no_overlap = exposed_sync_s(
        ddp_buckets(grads), ring, compute_s=compute_s, backward_share=2 / 3, overlap_efficiency=0.0
    )
    return {
        "gradient_bytes": sum(grads),
        "compute_s": compute_s,
        "predicted_exposed_s": exposed,
        "predicted_exposed_no_overlap_s": no_overlap,
        "allreduce_s": sum(ring.allreduce_s(b.size_bytes) for b in ddp_buckets(grads)),
        "measured_overhead_s": 0.104 - 0.097,
        "measured_overhead_at_1gpu_s": 0.100 - 0.097,
    }


def _median_of_rounds(measured: list[dict]) -> dict:
    """Each figure's median over the rounds (element-wise for the probe's list); the noise of the exposed
    median over rounds is the larger of its rounds' standard error and the spread of the rounds' values."""
    out: dict = {}
    for key, first in measured[0].items():
        if isinstance(first, list):
            out[key] = [statistics.median(m[key][j] for m in measured) for j in range(len(first))]
        else:
            out[key] = statistics.median(m[key] for m in measured)
    if len(measured) > 1:
        exposed = [m["step_s"] - m["compute_s"] for m in measured]
        out["exposed_noise_s"] = max(out["exposed_noise_s"], _median_noise_s(exposed))
    out["rounds"] = len(measured)
    return out


def _link(name: str, world: int, probe_s: list[float]) -> LinkCost:
    """The loopback link fitted to probe medians at ``PROBE_SIZES`` (logged to stderr)."""
    fit = fit_link(PROBE_SIZES, probe_s, world)
    print(
        f"  {name}: probe fit alpha {fit.alpha_s * 1e6:.0f} us, busbw {fit.bus_bytes_per_s / 1e9:.2f} "
        f"GB/s, rms error {fit.rms_relative_error:.1%}; medians "
        + ", ".join(f"{s / 2**20:g} MiB {t * 1e3:.2f} ms" for s, t in zip(PROBE_SIZES, probe_s, strict=True)),
        file=sys.stderr,
    )
    return LinkCost(
        name="loopback",
        bus_bytes_per_s=fit.bus_bytes_per_s,
        step_latency_s=fit.alpha_s / (2 * (world - 1)),
        source="measured (gloo probe)",
    )


def _pooled_probe_s(measured: list[dict]) -> list[float]:
    """Each probe size's median over every case of one world size: the one link figure a plan has (the
    NodeProbe actors measure a cluster once, not once per model)."""
    return [statistics.median(m["probe_s"][j] for m in measured) for j in range(len(PROBE_SIZES))]


def _row(case: Case, world: int, m: dict, link: LinkCost) -> dict:
    """One case's measured and predicted figures and errors, over ``link`` (the world size's pooled probe fit);
    ``sync_error_own_probe`` is the sync error over the fit of this case's own interleaved probes."""
    ring = RingCost(num_ranks=world, num_nodes=1, intra=link, network=None, base_latency_s=0.0)
    alone_pred = sum(ring.allreduce_s(b.size_bytes) for b in ddp_buckets(_grad_sizes(case)))
    exposed_meas = max(0.0, m["step_s"] - m["compute_s"])
    exposed_pred = _predict(case, link, m)
    own_pred = _predict(case, _link(f"{case.name} (own probes)", world, m["probe_s"]), m)
    step_pred = m["compute_s"] + exposed_pred
    # an exposed time within twice the standard error of its median is noise: its relative error says nothing
    above_noise = exposed_meas > 2 * m["exposed_noise_s"]
    return {
        "case": case.name,
        "world": world,
        "grad_mb": case.grad_bytes / 1e6,
        **m,
        "alpha_s": link.step_latency_s * 2 * (world - 1),
        "busbw_gb_s": link.bus_bytes_per_s / 1e9,
        "buckets_alone_predicted_s": alone_pred,
        "buckets_alone_error": alone_pred / m["buckets_alone_s"] - 1,
        "exposed_measured_s": exposed_meas,
        "exposed_predicted_s": exposed_pred,
        "step_predicted_s": step_pred,
        "step_error": step_pred / m["step_s"] - 1,
        "sync_error": (exposed_pred - exposed_meas) / exposed_meas if exposed_meas > 0 else None,
        "exposed_predicted_own_probe_s": own_pred,
        "sync_error_own_probe": (own_pred - exposed_meas) / exposed_meas if exposed_meas > 0 else None,
        "sync_above_noise": above_noise,
        "sync_share": exposed_meas / m["step_s"],
    }


def _print_rows(rows: list[dict]) -> None:
    print(
        f"{'case':<20} {'n':>2} {'grad MB':>8} {'compute ms':>10} {'step ms':>8} {'pred ms':>8} {'err':>6} "
        f"{'sync ms':>8} {'±':>5} {'pred':>7} {'err':>7} {'share':>6} {'alone ms':>9} {'pred':>7} {'err':>6} "
        f"{'ddp ms':>7}"
    )
    for r in rows:
        err = (
            "n/a"
            if r["sync_error"] is None
            else format(r["sync_error"], "+.1%") + ("" if r["sync_above_noise"] else "*")
        )
        print(
            f"{r['case']:<20} {r['world']:>2} {r['grad_mb']:>8.1f} {r['compute_s'] * 1e3:>10.1f} "
            f"{r['step_s'] * 1e3:>8.1f} {r['step_predicted_s'] * 1e3:>8.1f} {r['step_error']:>+6.1%} "
            f"{r['exposed_measured_s'] * 1e3:>8.1f} {r['exposed_noise_s'] * 1e3:>5.1f} "
            f"{r['exposed_predicted_s'] * 1e3:>7.1f} {err:>7} {r['sync_share']:>6.0%} "
            f"{r['buckets_alone_s'] * 1e3:>9.1f} {r['buckets_alone_predicted_s'] * 1e3:>7.1f} "
            f"{r['buckets_alone_error']:>+6.1%} {(r['silent_step_s'] - r['compute_s']) * 1e3:>7.1f}"
        )
    print(
        "(± the standard error of the measured exposed median; * within twice it: noise, left out of "
        "max_sync_error; alone: DDP's buckets all-reduced back to back with nothing else running, against "
        "the probe fit's Σ T(s_k); ddp: the synchronised step with a comm hook that sends nothing, less the compute)"
    )


def _measure_rounds(
    cases: list[Case], num_rounds: int, repeats: int
) -> tuple[list[float], dict[str, list[dict]]]:
    """Every world size's cases measured ``num_rounds`` times, one world size after another; the 1-minute load
    average before and after each world size."""
    loads = [os.getloadavg()[0]]
    rounds: dict[str, list[dict]] = {c.name: [] for c in cases}
    for index in range(num_rounds):
        for world in sorted({c.world for c in cases}):
            mine = [c for c in cases if c.world == world]
            print(
                f"round {index + 1}/{num_rounds}, world {world}: probing and running {len(mine)} case(s) ...",
                file=sys.stderr,
                flush=True,
            )
            measured = _measure(world, mine, repeats)
            loads.append(os.getloadavg()[0])
            for case in mine:
                rounds[case.name].append(measured["cases"][case.name])
    return loads, rounds


def main() -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every world size this many times, one after another; each figure is the "
        "median of the rounds' medians (the load moves between rounds)",
    )
    parser.add_argument(
        "--replay",
        type=Path,
        metavar="RAW_JSON",
        help="measure nothing: analyse the per-round figures an earlier run wrote to "
        "bench/results/comm_raw.json",
    )
    args = parser.parse_args()
    cases = [c for c in CASES if not args.cases or c.name in args.cases.split(",")]
    raw_path = REPO / "bench" / "results" / "comm_raw.json"
    if args.replay:
        raw = json.loads(args.replay.read_text())
        loads, rounds = raw["load_average_1min"], {c.name: raw["rounds"][c.name] for c in cases}
    else:
        loads, rounds = _measure_rounds(cases, args.rounds, args.repeats)
        raw_path.write_text(json.dumps({"load_average_1min": loads, "rounds": rounds}))
    medians = {case.name: _median_of_rounds(rounds[case.name]) for case in cases}
    links = {
        world: _link(
            f"world {world} (pooled over its cases)",
            world,
            _pooled_probe_s([medians[c.name] for c in cases if c.world == world]),
        )
        for world in sorted({c.world for c in cases})
    }
    rows = [_row(case, case.world, medians[case.name], links[case.world]) for case in cases]
    _print_rows(rows)
    published = _pytorch_ddp_benchmark()
    print(
        f"pytorch DDP benchmark (ResNet-50 bs 32, 16x V100, 4x100 Gb IB): {published['gradient_bytes'] / 1e6:.1f} MB "
        f"of gradients; all-reduce {published['allreduce_s'] * 1e3:.1f} ms, predicted exposed sync "
        f"{published['predicted_exposed_s'] * 1e3:.1f} ms (without overlap "
        f"{published['predicted_exposed_no_overlap_s'] * 1e3:.1f} ms) vs measured DDP overhead ~"
        f"{published['measured_overhead_s'] * 1e3:.0f} ms ({published['measured_overhead_at_1gpu_s'] * 1e3:.0f} ms of "
        "it already at 1 GPU: hooks, not communication)"
    )
    shares = [r["sync_share"] for r in rows]
    counted = [abs(r["sync_error"]) for r in rows if r["sync_error"] is not None and r["sync_above_noise"]]
    every = [abs(r["sync_error"]) for r in rows if r["sync_error"] is not None]
    own = [
        abs(r["sync_error_own_probe"])
        for r in rows
        if r["sync_error_own_probe"] is not None and r["sync_above_noise"]
    ]
    print(
        f"comm: cases={len(rows)} max_step_error={max(abs(r['step_error']) for r in rows):.1%} "
        f"max_sync_error={max(counted, default=0.0):.1%} sync_share={min(shares):.0%}-{max(shares):.0%} "
        f"sync_cases={len(counted)} max_sync_error_with_noise={max(every, default=0.0):.1%} "
        f"max_alone_error={max(abs(r['buckets_alone_error']) for r in rows):.1%} "
        f"max_sync_error_own_probe={max(own, default=0.0):.1%} "
        f"load={min(loads):.1f}-{max(loads):.1f}"
    )
    out = REPO / "bench" / "results" / "comm.json"
    out.write_text(
        json.dumps({"cases": rows, "pytorch_ddp_benchmark": published, "load_average_1min": loads}, indent=1)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
