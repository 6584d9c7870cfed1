"""Train with the batches of a plan: each rank takes its own batch, weights its loss, and DDP's gradient is
exactly that of one big batch.

    batchplan plan ... -o plan.json
    torchrun --nproc-per-node 3 examples/train_ddp.py --plan plan.json --steps 5

On a multi-node plan, run each node's line from ``plan.json`` (``nodes[].torchrun``). Uses NCCL and
``cuda:LOCAL_RANK`` where CUDA is available, gloo on CPU otherwise. The model and data are synthetic (a
small MLP on a regression task) so the script runs anywhere; replace ``make_dataset`` and ``make_model``
with yours and keep the four marked lines.

``--rebalance`` lets the job correct its plan (``planner.runtime.Rebalancer``, the lines marked R): each rank
times its own compute all run long, the split is re-solved in bounded, verified steps, and at the end rank 0
writes the plan file back with the batches that ran and a ``measured`` section (``--write-plan``; default
the ``--plan`` file itself) and, for a run that was not simulated, the measured profiles to the profile
cache, then prints one ``rebalance: ...`` line. ``--simulate-speed 1,2,4`` declares a simulation of slower
devices on CPU: rank i's compute is stretched to K_i times a per-sample time shared by all ranks
(``--simulate-sample-ms``, or measured after warm-up and agreed); ``--simulate-speed-change 30:4,2,1``
changes the speeds from step 30 on (``planner.runtime.simulate``). A simulated run writes no profile. If a
rank dies or hangs, every other rank stops within ``--collective-timeout`` seconds (plus a few to name it)
with one line ``error: rebalance: rank N stopped answering ...`` and exit code 1. The synthetic MLP's times
are fed back under the plan's job name: with your own model, train the model the plan was made for.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, TensorDataset

from planner.errors import RebalanceError, UserError
from planner.runtime import PlannedBatchSampler, RankPlan, is_collective_failure, load_rank_plan


def make_dataset(num_samples: int, seed: int) -> TensorDataset:
    """Synthetic regression data, the same on every rank (the sampler splits it, not the generator)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, 16, generator=generator)
    y = torch.sin(x[:, :4].sum(dim=1, keepdim=True)) + 0.1 * torch.randn(num_samples, 1, generator=generator)
    return TensorDataset(x, y)


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    # with BatchNorm layers, convert them with torch.nn.SyncBatchNorm.convert_sync_batchnorm: plain
    # BatchNorm would normalise each rank's (unequal) batch on its own
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))


class IndexedDataset(Dataset):
    """``dataset[i]`` followed by ``i``: lets ``--rebalance`` check that every sample was taken once."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int):
        return (*self.dataset[index], index)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--plan", required=True, help="plan.json written by batchplan plan")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps to run (default 5)")
    parser.add_argument(
        "--dataset-size", type=int, default=None, help="samples (default: 8 optimizer steps' worth)"
    )
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of data, model and sampler (same on every rank)"
    )
    group = parser.add_argument_group("re-balancing (planner.runtime.Rebalancer)")
    group.add_argument(
        "--rebalance", action="store_true", help="measure each rank's compute and re-balance the split"
    )
    group.add_argument("--probe-steps", type=int, default=10, help="steps measured at the start (default 10)")
    group.add_argument(
        "--check-every",
        type=int,
        default=5,
        help="later (watching), gather the steps' times at least every this many steps (default 5)",
    )
    group.add_argument(
        "--simulate-speed",
        metavar="K0,K1,...",
        help="declared simulation: rank i computes K_i times slower per sample (needs --rebalance)",
    )
    group.add_argument(
        "--simulate-sample-ms",
        type=float,
        default=None,
        help="per-sample ms of a speed-1 rank in the simulation (default: measured after warm-up, "
        "the same for all ranks)",
    )
    group.add_argument(
        "--simulate-speed-change",
        metavar="STEP:K0,K1,...",
        help="from optimizer step STEP on, simulate these speeds instead (tests the watching)",
    )
    group.add_argument(
        "--collective-timeout",
        type=float,
        default=30.0,
        help="seconds any rank waits for another before the job stops (default 30)",
    )
    group.add_argument(
        "--write-plan", default=None, help="where rank 0 writes the updated plan (default: --plan)"
    )
    group.add_argument(
        "--cache-dir", default=None, help="profile cache for the measured profiles (default: the planner's)"
    )
    group.add_argument(
        "--no-feedback", action="store_true", help="write neither the plan nor the measured profiles"
    )
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.simulate_speed and not args.rebalance:
        parser.error(
            "--simulate-speed needs --rebalance (the simulation runs inside the re-balancer's timing)"
        )
    if args.simulate_speed_change and not args.simulate_speed:
        parser.error("--simulate-speed-change needs --simulate-speed (the speeds it changes from)")
    if args.simulate_sample_ms is not None and not 0 < args.simulate_sample_ms < float("inf"):
        parser.error("--simulate-sample-ms must be a number of milliseconds > 0")
    if not 0 < args.collective_timeout < float("inf"):
        parser.error("--collective-timeout must be a number of seconds > 0")
    if args.probe_steps < 1 or args.check_every < 1:
        parser.error("--probe-steps and --check-every must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        plan = load_rank_plan(args.plan)  # (1) this rank's batch and weight; fails before any collective
        if args.simulate_speed:
            from planner.runtime.simulate import parse_speed_change, parse_speeds

            parse_speeds(
                args.simulate_speed, plan.world_size
            )  # a bad list fails here, not inside a collective
            if args.simulate_speed_change:
                parse_speed_change(args.simulate_speed_change, plan.world_size)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code

    if torch.cuda.is_available():
        if plan.local_rank >= torch.cuda.device_count():
            print(
                f"error: rank {plan.rank} has LOCAL_RANK {plan.local_rank} but only {torch.cuda.device_count()} "
                f"CUDA devices are visible (launch with the plan's CUDA_VISIBLE_DEVICES)",
                file=sys.stderr,
            )
            return 2
        device = torch.device("cuda", plan.local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if plan.world_size == 1 and "RANK" not in os.environ:
        _single_process_environment()
    # with --rebalance every collective of the job waits at most --collective-timeout for a rank
    timeout = {"timeout": timedelta(seconds=args.collective_timeout)} if args.rebalance else {}
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None, **timeout)
    try:
        train(args, plan, device)
    except RebalanceError as exc:
        # a rank died or hung: one line, and out without tearing gloo down (a dead peer makes it abort)
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)
    # nobody tears gloo down while a peer still finishes its last collective or rank 0 still writes the
    # feedback: a peer's early teardown can abort a rank
    dist.barrier()
    dist.destroy_process_group()
    # and out without the interpreter's teardown: after all of the above, about 1 run in 40 of three gloo
    # ranks still aborted there ("terminate called without an active exception", no Python frame left: a
    # C++ thread of torch's still joinable at static destruction), which torchrun reports as a failed job
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def make_rebalancer(args: argparse.Namespace, plan: RankPlan, sampler: PlannedBatchSampler, ddp, device):
    """The re-balancer of ``--rebalance`` (R1), with the declared simulation when asked for."""
    from planner.runtime import RebalancePolicy, Rebalancer, SimulatedSpeed
    from planner.runtime.simulate import parse_speed_change, parse_speeds

    simulate = None
    if args.simulate_speed:
        sample_s = args.simulate_sample_ms / 1e3 if args.simulate_sample_ms is not None else None
        changes = (
            [parse_speed_change(args.simulate_speed_change, plan.world_size)]
            if args.simulate_speed_change
            else []
        )
        simulate = SimulatedSpeed(
            factors=parse_speeds(args.simulate_speed, plan.world_size), sample_s=sample_s, changes=changes
        )
    policy = RebalancePolicy(probe_steps=args.probe_steps, check_every_steps=args.check_every)
    return Rebalancer.from_plan(
        args.plan,
        sampler,
        ddp,
        policy=policy,
        simulate=simulate,
        device=device,
        collective_timeout_s=args.collective_timeout,
    )


def train(args: argparse.Namespace, plan: RankPlan, device: torch.device) -> None:
    print(
        f"rank {plan.rank}/{plan.world_size} node_rank {plan.node_rank} local_rank {plan.local_rank} "
        f"gpu {plan.gpu} device {device}: batch {plan.batch} weight {plan.loss_weight:.6f} "
        f"step_batch {plan.step_batch} global_batch {plan.global_batch} accumulate {plan.accumulate}",
        flush=True,
    )
    dataset = make_dataset(args.dataset_size or 8 * plan.global_batch, args.seed)
    sampler = PlannedBatchSampler.from_plan(plan, len(dataset), seed=args.seed)  # (2) this rank's slices
    loader = DataLoader(IndexedDataset(dataset), batch_sampler=sampler)
    model = make_model(args.seed).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    rebalancer = make_rebalancer(args, plan, sampler, ddp, device) if args.rebalance else None  # (R1)
    taken: list[tuple[int, int, list[int]]] = []  # (epoch, micro-step, indices): the samples-once check

    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)  # (3) same permutation on every rank, new each epoch
        micro_batches = iter(loader)
        # len(sampler) is a whole number of optimizer steps, so no optimizer step straddles two epochs
        for optimizer_step in range(len(sampler) // plan.accumulate):
            optimizer.zero_grad(set_to_none=True)
            rank_loss = torch.zeros((), device=device)
            for micro in range(plan.accumulate):
                x, y, index = next(micro_batches)
                taken.append((epoch, optimizer_step * plan.accumulate + micro, index.tolist()))
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                timed = rebalancer.compute() if rebalancer else contextlib.nullcontext()
                with timed:  # (R2) this rank's own forward+backward
                    loss = torch.nn.functional.mse_loss(ddp(x), y)
                    weight = rebalancer.loss_weight if rebalancer else plan.loss_weight
                    scaled = loss * weight / plan.accumulate  # (4) b_i·W/B, then the usual 1/accumulate
                    if micro < plan.accumulate - 1:
                        with ddp.no_sync():  # all-reduce once, on the last micro-step
                            scaled.backward()
                    else:
                        scaled.backward()
                rank_loss += loss.detach() / plan.accumulate
            optimizer.step()
            if rebalancer:
                rebalancer.step_done()  # (R3) may switch the split, at the same step boundary on every rank
            step += 1
            # Σ_i w_i·L_i / W is the mean loss over all samples of the step (the weights make it so)
            global_loss = rank_loss * weight / plan.world_size
            try:
                dist.all_reduce(global_loss)
            except RuntimeError as exc:  # a rank died or hung: name it (the re-balancer asks the others)
                # gloo's "Connection closed by peer" is a plain RuntimeError, not a DistError
                if rebalancer is None or not is_collective_failure(exc):
                    raise
                raise rebalancer.collective_failure("the loss all-reduce", exc) from exc
            print(
                f"rank {plan.rank} step {step}/{args.steps}: batch {len(index)} loss {rank_loss.item():.6f} "
                f"global_loss {global_loss.item():.6f}",
                flush=True,
            )
            if step == args.steps:
                break
        epoch += 1
    samples = sum(len(indices) for _, _, indices in taken)
    print(f"rank {plan.rank} done: {step} steps, {samples} samples", flush=True)
    if rebalancer:
        finish_rebalance(args, rebalancer, sampler, taken)


def finish_rebalance(args: argparse.Namespace, rebalancer, sampler: PlannedBatchSampler, taken: list) -> None:
    """Every rank's samples gathered and checked; rank 0 writes the feedback and prints the one line."""
    from planner.runtime import samples_once

    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, taken)
    once = samples_once(sampler, everyone)
    if rebalancer.rank == 0:
        if not args.no_feedback:
            for path in rebalancer.write_feedback(args.write_plan or args.plan, args.cache_dir):
                print(f"wrote {path}", file=sys.stderr)
        if rebalancer.simulate is not None:
            print(f"rebalance: {rebalancer.simulate.describe()} (declared simulation)", file=sys.stderr)
        print(rebalancer.report().line(samples_once=once), flush=True)


def _single_process_environment() -> None:
    """A one-rank plan started as plain ``python train_ddp.py``: the env:// rendezvous of one process."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for name, value in (
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", str(port)),
    ):
        os.environ.setdefault(name, value)


if __name__ == "__main__":
    sys.exit(main())
