"""In-job re-balancing, run after run: does it reach the best split, never pass through a slow one, and
leave a balanced or noisy job alone?

Usage: ``python bench/bench_rebalance.py [--runs 5] [--sample-ms 2] [--cases NAME,...]``.

Three gloo ranks on 127.0.0.1 (one spawn for the whole bench) train a tiny MLP with
``planner.runtime.Rebalancer``; every case is run ``--runs`` times, each run with a fresh model, sampler and
re-balancer, at whatever load the machine has. The simulated cases declare ``--sample-ms`` per sample of a
speed-1 rank (``planner.runtime.simulate``), so the true step time of any split is known:
``max_i k_i · sample · b_i``; the real compute of the MLP (about a millisecond) is noise on top.

Cases (step batch 56, multiple of 4, caps 64; plans built by ``planner.plan.build_plan``):

- ``s124_uniform`` / ``s124_wrong2x`` / ``s124_wrong4x``: speeds 1,2,4 from a plan that thinks all ranks
  equal, or whose speed ratios to rank 0 are 2× / 4× too small; ``s421_*`` the same with speeds 4,2,1;
- ``noise``: speeds 1,1,1 (identical ranks): nothing to correct;
- ``change``: speeds 1,2,4, changed to 4,2,1 at step ``CHANGE_STEP``;
- ``real``: no simulation, three equal CPU ranks training a small CNN (their real compute is all there is).

One line per case on stdout: ``rebalance: case=NAME runs=5 worst_final_vs_best=X worst_transient_vs_start=Y
switches_max=N``, then ``steps_to_balance_max`` (the step the final split took effect; for ``change``, steps
after the change), for ``real`` ``worst_final_vs_start``, and ``watch_overhead_max`` (the largest share of
the watching steps' time spent gathering, as the re-balancer measured it; n/a: no run got to watch). ``final_vs_best`` is the final split's step
time over the best split's (simulated: the true times; real: medians of the measured steps, best = the
fastest split it ran); ``transient_vs_start`` the slowest split it ran over the starting one (under the
speeds in force at each step; for ``change``, after the change, over the split in force at the change). Targets (issue 21): simulated cases final ≤ 1.10, transient ≤ 1.25, balanced
within 10 steps; noise ≤ 1 switch and final ≤ 1.03; change re-balanced within 20 steps of it; real never
more than 3% slower than it started. Writes bench/results/rebalance.json. Takes a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from planner.codec import encode  # noqa: E402
from planner.job import JobSpec  # noqa: E402  (the repository on the path first, for a plain `python bench/...`)
from planner.plan.build import build_plan  # noqa: E402
from planner.plan.types import RankSlot  # noqa: E402
from planner.profiles.profile import DeviceProfile  # noqa: E402

WORLD_SIZE = 3
GPUS = ("T4", "V100-SXM2-16GB", "A10")  # labels only: the speeds are simulated
STEP_BATCH = 56
MULTIPLE_OF = 4
CAP = 64
#: per sample and fixed memory of the synthetic profile, chosen so that the budget gives every rank cap 64
BYTES_PER_SAMPLE = 100_000
FIXED_BYTES = 900_000
STEPS = 30
CHANGE_STEP = 25
CHANGE_STEPS = 60
#: name -> (speeds, plan wrong by (None: uniform), speeds from CHANGE_STEP on or None, simulated)
CASES: dict[str, tuple[tuple[float, ...], float | None, tuple[float, ...] | None, bool]] = {
    "s124_uniform": ((1, 2, 4), None, None, True),
    "s124_wrong2x": ((1, 2, 4), 2.0, None, True),
    "s124_wrong4x": ((1, 2, 4), 4.0, None, True),
    "s421_uniform": ((4, 2, 1), None, None, True),
    "s421_wrong2x": ((4, 2, 1), 2.0, None, True),
    "s421_wrong4x": ((4, 2, 1), 4.0, None, True),
    "noise": ((1, 1, 1), None, None, True),
    "change": ((1, 2, 4), None, (4, 2, 1), True),
    "real": ((1, 1, 1), None, None, False),
}


def plan_for(speeds: tuple[float, ...], wrong_by: float | None, sample_s: float) -> dict:
    """A plan of 3 ranks whose time model is off by ``wrong_by`` (None: all ranks equal), via build_plan."""
    if wrong_by is None:
        planned = [sample_s] * len(speeds)
    else:
        planned = [sample_s * (k if i == 0 else k / wrong_by) for i, k in enumerate(speeds)]
    job = JobSpec(
        model="mlp", global_batch=STEP_BATCH, multiple_of=MULTIPLE_OF, min_batch=MULTIPLE_OF, amp="off"
    )
    profiles, slots = {}, []
    for rank, slope in enumerate(planned):
        key = f"sim{rank}"
        profiles[key] = DeviceProfile.from_points(
            gpu=GPUS[rank],
            method="estimate",
            amp="off",
            memory_points=[
                (8, FIXED_BYTES + 8 * BYTES_PER_SAMPLE),
                (64, FIXED_BYTES + 64 * BYTES_PER_SAMPLE),
            ],
            time_points=[(8, 8 * slope), (64, 64 * slope)],
        )
        slots.append(
            RankSlot(
                node="bench",
                device_index=rank,
                gpu=GPUS[rank],
                profile=key,
                memory_budget_bytes=FIXED_BYTES + CAP * BYTES_PER_SAMPLE,
                total_memory_bytes=10**9,
            )
        )
    return encode(build_plan(job, slots, profiles))


def _model(real: bool):
    import torch

    torch.manual_seed(0)
    if real:  # a small CNN on 3×16×16 images: the real compute is the whole step
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(16, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(4),
            torch.nn.Flatten(),
            torch.nn.Linear(256, 1),
        )
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def run_once(rank: int, name: str, sample_s: float) -> dict:
    """One run of one case on this rank; the gathered record (the same on every rank)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from planner.runtime.rebalance import Rebalancer
    from planner.runtime.sampler import PlannedBatchSampler
    from planner.runtime.simulate import SimulatedSpeed

    speeds, wrong_by, changed, simulated = CASES[name]
    steps = CHANGE_STEPS if changed else STEPS
    plan = plan_for(speeds, wrong_by, sample_s)
    shape = (3, 16, 16) if not simulated else (16,)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(10 * STEP_BATCH, *shape, generator=generator)
    y = torch.randn(10 * STEP_BATCH, 1, generator=generator)
    sampler = PlannedBatchSampler(len(x), [r["batch"] for r in plan["ranks"]], rank, seed=0)
    model = DistributedDataParallel(_model(not simulated))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    simulate = None
    if simulated:
        simulate = SimulatedSpeed(
            factors=speeds, sample_s=sample_s, changes=[(CHANGE_STEP, changed)] if changed else []
        )
    rebalancer = Rebalancer.from_plan(plan, sampler, model, simulate=simulate)
    step, epoch = 0, 0
    while step < steps:
        sampler.set_epoch(epoch)
        for indices in sampler:
            optimizer.zero_grad(set_to_none=True)
            with rebalancer.compute():
                loss = torch.nn.functional.mse_loss(model(x[indices]), y[indices]) * rebalancer.loss_weight
                loss.backward()
            optimizer.step()
            rebalancer.step_done()
            step += 1
            if step == steps:
                break
        epoch += 1
    report = rebalancer.report()
    return {
        "case": name,
        "splits": [list(s) for s in rebalancer.splits],
        "switches": [
            {"step": s.decided_at_step, "batches": list(s.batches), "kind": s.kind}
            for s in rebalancer.switches
        ],
        "measures": [
            {"step": m.step, "batches": list(m.batches), "compute_s": list(m.compute_s)}
            for m in rebalancer.measures
        ],
        "steps_to_balance": report.steps_to_balance,
        "watch_overhead": report.watch_overhead,
        "line": report.line(samples_once=True),
    }


def _worker(rank: int, port: int, out_dir: str, cases: list[str], runs: int, sample_s: float) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=120))
    try:
        for name in cases:
            records = []
            for run in range(runs):
                began = time.monotonic()
                records.append(run_once(rank, name, sample_s))
                if rank == 0:
                    print(
                        f"bench_rebalance: {name} run {run + 1}/{runs}: {time.monotonic() - began:.1f} s, "
                        f"{records[-1]['line']}",
                        file=sys.stderr,
                        flush=True,
                    )
            if rank == 0:
                Path(out_dir, f"{name}.json").write_text(json.dumps(records))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _splits(total: int = STEP_BATCH) -> list[tuple[int, ...]]:
    units = range(MULTIPLE_OF, CAP + 1, MULTIPLE_OF)
    return [s for s in itertools.product(units, repeat=WORLD_SIZE) if sum(s) == total]


def _true_s(split, speeds, sample_s: float) -> float:
    return max(k * sample_s * b for k, b in zip(speeds, split, strict=True))


def simulated_metrics(name: str, record: dict, sample_s: float) -> dict:
    speeds, _, changed, _ = CASES[name]
    splits = [tuple(s) for s in record["splits"]]

    def speeds_at(step: int):  # step from 1
        return changed if changed and step >= CHANGE_STEP else speeds

    start, final = splits[0], splits[-1]
    end_speeds = speeds_at(len(splits))
    best_s = min(_true_s(s, end_speeds, sample_s) for s in _splits())
    # against the split in force when the current speeds began (the start, or the split at the change)
    regime_start = [
        start if not changed or i + 1 < CHANGE_STEP else splits[CHANGE_STEP - 1] for i in range(len(splits))
    ]
    transient = max(
        _true_s(s, speeds_at(i + 1), sample_s) / _true_s(regime_start[i], speeds_at(i + 1), sample_s)
        for i, s in enumerate(splits)
    )
    balance = record["steps_to_balance"] - (CHANGE_STEP - 1 if changed else 0)
    return {
        "final_vs_best": _true_s(final, end_speeds, sample_s) / best_s,
        "transient_vs_start": transient,
        "switches": len(record["switches"]),
        "steps_to_balance": max(balance, 0),
    }


def real_metrics(record: dict) -> dict:
    by_split: dict[tuple[int, ...], list[float]] = {}
    for m in record["measures"]:
        if m["step"] > 2:  # the warm-up the re-balancer leaves out too
            by_split.setdefault(tuple(m["batches"]), []).append(max(m["compute_s"]))
    step_s = {s: statistics.median(ts) for s, ts in by_split.items()}
    splits = [tuple(s) for s in record["splits"]]
    start, final = splits[0], splits[-1]
    return {
        "final_vs_best": step_s[final] / min(step_s.values()),
        "transient_vs_start": max(step_s[s] for s in set(splits) if s in step_s) / step_s[start],
        "final_vs_start": step_s[final] / step_s[start],
        "switches": len(record["switches"]),
        "steps_to_balance": record["steps_to_balance"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sample-ms", type=float, default=2.0)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "rebalance.json"))
    args = parser.parse_args()
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown or args.runs < 1 or not args.sample_ms > 0:
        parser.error(f"unknown cases {unknown} (known: {', '.join(CASES)}); --runs >= 1; --sample-ms > 0")
    import torch.multiprocessing as mp

    sys.path.insert(0, str(REPO))
    from tests.net import free_port

    sample_s = args.sample_ms / 1e3
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-rebalance-") as tmp:
        mp.start_processes(
            _worker,
            args=(free_port(), tmp, cases, args.runs, sample_s),
            nprocs=WORLD_SIZE,
            start_method="spawn",
        )
        for name in cases:
            records = json.loads(Path(tmp, f"{name}.json").read_text())
            metrics = [
                real_metrics(r) if not CASES[name][3] else simulated_metrics(name, r, sample_s)
                for r in records
            ]
            # every run's splits, switches and gathered steps too: a slow run can be read back afterwards
            results[name] = {"runs": metrics, "lines": [r["line"] for r in records], "records": records}
            line = (
                f"rebalance: case={name} runs={len(metrics)} "
                f"worst_final_vs_best={max(m['final_vs_best'] for m in metrics):.3f} "
                f"worst_transient_vs_start={max(m['transient_vs_start'] for m in metrics):.3f} "
                f"switches_max={max(m['switches'] for m in metrics)} "
                f"steps_to_balance_max={max(m['steps_to_balance'] for m in metrics)}"
            )
            if not CASES[name][3]:
                line += f" worst_final_vs_start={max(m['final_vs_start'] for m in metrics):.3f}"
            watched = [r["watch_overhead"] for r in records if r["watch_overhead"] is not None]
            line += f" watch_overhead_max={max(watched):.2%}" if watched else " watch_overhead_max=n/a"
            print(line, flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"bench": "rebalance", "sample_ms": args.sample_ms, "runs": args.runs, "results": results},
            indent=2,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
