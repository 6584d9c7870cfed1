"""Train with the batches of a plan: each rank takes its own batch, weights its loss, and DDP's gradient is
exactly that of one big batch.

    batchplan plan ... -o plan.json
    torchrun --nproc-per-node 3 examples/train_ddp.py --plan plan.json --steps 5

On a multi-node plan, run each node's line from ``plan.json`` (``nodes[].torchrun``). Uses NCCL and
``cuda:LOCAL_RANK`` where CUDA is available, gloo on CPU otherwise. The model and data are synthetic (a
small MLP on a regression task) so the script runs anywhere; replace ``make_dataset`` and ``make_model``
with yours and keep the four marked lines.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from planner.errors import UserError
from planner.runtime import PlannedBatchSampler, RankPlan, load_rank_plan


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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", required=True, help="plan.json written by batchplan plan")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps to run (default 5)")
    parser.add_argument("--dataset-size", type=int, default=None, help="samples (default: 8 optimizer steps' worth)")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seed of data, model and sampler (same on every rank)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        plan = load_rank_plan(args.plan)  # (1) this rank's batch and weight; fails before any collective
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
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    try:
        train(args, plan, device)
    finally:
        dist.destroy_process_group()
    return 0


def train(args: argparse.Namespace, plan: RankPlan, device: torch.device) -> None:
    print(
        f"rank {plan.rank}/{plan.world_size} node_rank {plan.node_rank} local_rank {plan.local_rank} "
        f"gpu {plan.gpu} device {device}: batch {plan.batch} weight {plan.loss_weight:.6f} "
        f"step_batch {plan.step_batch} global_batch {plan.global_batch} accumulate {plan.accumulate}",
        flush=True,
    )
    dataset = make_dataset(args.dataset_size or 8 * plan.global_batch, args.seed)
    sampler = PlannedBatchSampler.from_plan(plan, len(dataset), seed=args.seed)  # (2) this rank's slices
    loader = DataLoader(dataset, batch_sampler=sampler)
    model = make_model(args.seed).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr)

    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)  # (3) same permutation on every rank, new each epoch
        micro_batches = iter(loader)
        # len(sampler) is a whole number of optimizer steps, so no optimizer step straddles two epochs
        for _ in range(len(sampler) // plan.accumulate):
            optimizer.zero_grad(set_to_none=True)
            rank_loss = torch.zeros((), device=device)
            for micro in range(plan.accumulate):
                x, y = (t.to(device, non_blocking=True) for t in next(micro_batches))
                loss = torch.nn.functional.mse_loss(ddp(x), y)
                scaled = loss * plan.loss_weight / plan.accumulate  # (4) b_i·W/B, then the usual 1/accumulate
                if micro < plan.accumulate - 1:
                    with ddp.no_sync():  # all-reduce once, on the last micro-step
                        scaled.backward()
                else:
                    scaled.backward()
                rank_loss += loss.detach() / plan.accumulate
            optimizer.step()
            step += 1
            # Σ_i w_i·L_i / W is the mean loss over all samples of the step (the weights make it so)
            global_loss = rank_loss * plan.loss_weight / plan.world_size
            dist.all_reduce(global_loss)
            print(
                f"rank {plan.rank} step {step}/{args.steps}: batch {plan.batch} loss {rank_loss.item():.6f} "
                f"global_loss {global_loss.item():.6f}",
                flush=True,
            )
            if step == args.steps:
                break
        epoch += 1
    print(f"rank {plan.rank} done: {step} steps, {step * plan.batch * plan.accumulate} samples", flush=True)


def _single_process_environment() -> None:
    """A one-rank plan started as plain ``python train_ddp.py``: the env:// rendezvous of one process."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port))):
        os.environ.setdefault(name, value)


if __name__ == "__main__":
    sys.exit(main())
