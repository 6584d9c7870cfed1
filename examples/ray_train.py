"""Train with the batches of a plan under Ray Train's TorchTrainer: each worker finds its plan entry, takes
its batch and slices, and weights its loss, so DDP's gradient is exactly that of one big batch.

    batchplan plan --address auto --model ... -o plan.json
    python examples/ray_train.py --plan plan.json --steps 5 [--address auto]

Ray Train numbers its workers itself, so a worker finds its plan entry by where it runs: ``--match node``
(default; real clusters) takes the entry of this host and local rank, ``--match rank`` takes the entry with
the worker's world rank (one host, or a simulated plan). Every worker checks that the entries taken form a
permutation of the plan's ranks before training. Needs ``pip install 'ray[train]'``.
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # make_dataset/make_model of train_ddp.py

from train_ddp import make_dataset, make_model  # noqa: E402

from planner.errors import UserError  # noqa: E402
from planner.plan.io import read_plan  # noqa: E402


def plan_rank_for_worker(plan: dict, *, match: str, world_rank: int, hostname: str, local_rank: int) -> int:
    """The plan rank a Ray Train worker plays: its world rank, or the entry of its host and local rank."""
    if match == "rank":
        return world_rank
    for entry in plan["ranks"]:
        if entry["node"] == hostname and entry["local_rank"] == local_rank:
            return entry["rank"]
    nodes = sorted({e["node"] for e in plan["ranks"]})
    raise UserError(
        f"no plan entry for host {hostname!r} local rank {local_rank} (plan nodes: {', '.join(nodes)}); "
        "plan this cluster with --address, or use --match rank on one host"
    )


def train_loop_per_worker(config: dict) -> None:
    import ray.train
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from planner.runtime import PlannedBatchSampler, load_rank_plan

    plan = config["plan"]
    context = ray.train.get_context()
    world_rank, world_size = context.get_world_rank(), context.get_world_size()
    plan_rank = plan_rank_for_worker(
        plan, match=config["match"], world_rank=world_rank, hostname=socket.gethostname(),
        local_rank=context.get_local_rank(),
    )
    rank_plan = load_rank_plan(plan, rank=plan_rank, env={"WORLD_SIZE": str(world_size)})
    taken: list = [None] * world_size
    dist.all_gather_object(taken, plan_rank)
    if sorted(taken) != list(range(world_size)):
        raise RuntimeError(f"workers took plan ranks {taken}: not one each (check --match)")

    device = ray.train.torch.get_device()
    dataset = make_dataset(config["dataset_size"] or 8 * rank_plan.global_batch, config["seed"])
    sampler = PlannedBatchSampler.from_plan(rank_plan, len(dataset), seed=config["seed"])
    # a plain DataLoader: ray.train.torch.prepare_data_loader would replace the planned sampler
    loader = DataLoader(dataset, batch_sampler=sampler)
    model = ray.train.torch.prepare_model(make_model(config["seed"]))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    step, epoch = 0, 0
    while step < config["steps"]:
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            (loss * rank_plan.loss_weight).backward()  # b_i·W/B: DDP's mean is then the global mean
            optimizer.step()
            step += 1
            ray.train.report({"step": step, "plan_rank": plan_rank, "batch": rank_plan.batch,
                              "loss": loss.item()})
            if step == config["steps"]:
                break
        epoch += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", required=True, help="plan.json written by batchplan plan")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--match", choices=("node", "rank"), default="node", help="how a worker finds its entry")
    parser.add_argument("--address", help="Ray cluster to run on (default: start a local one on 127.0.0.1)")
    parser.add_argument("--dataset-size", type=int, default=None)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        plan = read_plan(args.plan)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code

    import os

    import ray
    import torch
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    if args.address:
        ray.init(address=args.address)
    else:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keep a local Ray on 127.0.0.1
        # address="local": a fresh Ray of our own, even when another one runs on this machine
        ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False,
                 num_cpus=max(plan["world_size"], 2))
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"plan": plan, "match": args.match, "steps": args.steps,
                           "dataset_size": args.dataset_size, "lr": args.lr, "seed": args.seed},
        scaling_config=ScalingConfig(num_workers=plan["world_size"], use_gpu=torch.cuda.is_available()),
        run_config=RunConfig(storage_path=str(Path(args.plan).resolve().parent / "ray_results")),
    )
    result = trainer.fit()
    ray.shutdown()
    if result.error is not None:
        print(f"error: training failed: {result.error}", file=sys.stderr)
        return 1
    print(f"done: {args.steps} steps on {plan['world_size']} workers with batches "
          f"{[r['batch'] for r in plan['ranks']]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
