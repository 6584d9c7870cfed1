"""Train with the batches of a plan under Ray Train's TorchTrainer: each worker finds its plan entry, takes
its batch and slices, and weights its loss, so DDP's gradient is exactly that of one big batch.

    batchplan plan --address auto --model ... -o plan.json
    python examples/ray_train.py --plan plan.json --steps 5 [--address auto]

Ray Train numbers its workers itself, so a worker finds its plan entry by where it runs: ``--match node``
(default; real clusters) takes the entry of this host and local rank, ``--match rank`` takes the entry with
the worker's world rank (one host, or a simulated plan). Every worker checks that the entries taken form a
permutation of the plan's ranks before training. Needs ``pip install 'ray[train]'``.

``--rebalance`` (and ``--simulate-speed 1,2,4``) as in ``train_ddp.py``: the workers re-balance their split
from measured compute times (``planner.runtime.Rebalancer``); world rank 0 reports the summary line and the
feedback to the driver, which prints the line and writes the updated plan and the measured profiles on
the driver's machine (where the plan file is).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # make_dataset/make_model of train_ddp.py

from train_ddp import IndexedDataset, make_dataset, make_model  # noqa: E402

from planner.codec import encode  # noqa: E402
from planner.errors import UserError  # noqa: E402
from planner.plan.io import load_plan  # noqa: E402
from planner.plan.types import Plan  # noqa: E402


def plan_rank_for_worker(plan: Plan, *, match: str, world_rank: int, hostname: str, local_rank: int) -> int:
    """The plan rank a Ray Train worker plays: its world rank, or the entry of its host and local rank."""
    if match == "rank":
        return world_rank
    for entry in plan.ranks:
        if entry.node == hostname and entry.local_rank == local_rank:
            return entry.rank
    nodes = sorted({e.node for e in plan.ranks})
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
        plan,
        match=config["match"],
        world_rank=world_rank,
        hostname=socket.gethostname(),
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
    loader = DataLoader(IndexedDataset(dataset), batch_sampler=sampler)
    model = ray.train.torch.prepare_model(make_model(config["seed"]))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    rebalancer = (
        _rebalancer(config, plan, sampler, model, device, world_size) if config["rebalance"] else None
    )
    taken: list = []
    step, epoch = 0, 0
    while step < config["steps"]:
        sampler.set_epoch(epoch)
        for in_epoch, (x, y, index) in enumerate(loader):
            taken.append((epoch, in_epoch, index.tolist()))
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad(set_to_none=True)
            with rebalancer.compute() if rebalancer else contextlib.nullcontext():
                loss = torch.nn.functional.mse_loss(model(x), y)
                weight = rebalancer.loss_weight if rebalancer else rank_plan.loss_weight
                (loss * weight).backward()  # b_i·W/B: DDP's mean is then the global mean
            optimizer.step()
            if rebalancer:
                rebalancer.step_done()
            step += 1
            metrics = {"step": step, "plan_rank": plan_rank, "batch": len(index), "loss": loss.item()}
            if step == config["steps"] and rebalancer:
                results = _rebalance_results(rebalancer, sampler, taken, world_size)
                _report_with_results(metrics, results if world_rank == 0 else None)
            else:
                ray.train.report(metrics)
            if step == config["steps"]:
                break
        epoch += 1


def _rebalancer(config: dict, plan: Plan, sampler, model, device, world_size: int):
    from planner.runtime import Rebalancer, SimulatedSpeed
    from planner.runtime.simulate import parse_speeds

    simulate = None
    if config["simulate_speed"]:
        sample_ms = config["simulate_sample_ms"]
        simulate = SimulatedSpeed(
            factors=parse_speeds(config["simulate_speed"], world_size),
            sample_s=sample_ms / 1e3 if sample_ms is not None else None,
        )
    return Rebalancer.from_plan(plan, sampler, model, simulate=simulate, device=device)


def _rebalance_results(rebalancer, sampler, taken: list, world_size: int) -> dict:
    """The summary line and the feedback (JSON text), for world rank 0 to report to the driver."""
    import torch.distributed as dist

    from planner.runtime import samples_once

    everyone: list = [None] * world_size
    dist.all_gather_object(everyone, taken)
    once = samples_once(sampler, everyone)
    updated, profiles = rebalancer.feedback()
    return {
        "rebalance_line": rebalancer.report().line(samples_once=once),
        "rebalance_feedback": json.dumps({"plan": encode(updated), "profiles": encode(profiles)}),
    }


def _report_with_results(metrics: dict, results: dict | None) -> None:
    """The last report; world rank 0 attaches the re-balancing results as a checkpoint, the channel Ray
    Train hands back to the driver (``Result.checkpoint``; its ``metrics`` come with checkpoints)."""
    import tempfile

    import ray.train

    if results is None:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "rebalance.json").write_text(json.dumps(results))
        ray.train.report(
            {**metrics, "rebalance_line": results["rebalance_line"]},
            checkpoint=ray.train.Checkpoint.from_directory(folder),
        )


def read_results(result) -> dict:
    """The re-balancing results world rank 0 reported (empty when it reported none)."""
    if result.checkpoint is None:
        return {}
    with result.checkpoint.as_directory() as folder:
        path = Path(folder, "rebalance.json")
        return json.loads(path.read_text()) if path.exists() else {}


def write_feedback(feedback_json: str, plan_path: str, cache_dir: str | None) -> list[Path]:
    """On the driver: the updated plan to ``plan_path``, the measured profiles and synchronisation to the cache."""
    from planner.codec import convert
    from planner.plan.io import validate_plan, write_plan
    from planner.profiles.cache import ProfileCache
    from planner.profiles.measured import measured_key_inputs
    from planner.profiles.profile import DeviceProfile
    from planner.runtime.rebalance_feedback import measured_fingerprint
    from planner.runtime.sync_feedback import file_job_sync

    feedback = json.loads(feedback_json)
    plan = validate_plan(feedback["plan"], where="the workers' re-balanced plan")
    profiles = convert(dict[str, DeviceProfile], feedback["profiles"], where="the workers' measured profiles")
    cache = ProfileCache(cache_dir)
    written = [write_plan(plan, plan_path)]
    fingerprint = measured_fingerprint(plan.job) if profiles else ""
    for key, profile in profiles.items():
        # the cache records what the key is made of, so that it can check the entry when it is read
        written.append(
            cache.put(
                key,
                profile,
                inputs=measured_key_inputs(plan.job, profile.gpu, profile.amp, fingerprint=fingerprint),
            )
        )
    synced = file_job_sync(plan, cache_dir)  # the measured synchronisation, for the next plan
    return written + ([synced] if synced is not None else [])


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--plan", required=True, help="plan.json written by batchplan plan")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument(
        "--match", choices=("node", "rank"), default="node", help="how a worker finds its entry"
    )
    parser.add_argument("--address", help="Ray cluster to run on (default: start a local one on 127.0.0.1)")
    parser.add_argument("--dataset-size", type=int, default=None)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rebalance", action="store_true", help="re-balance the split from measured compute times"
    )
    parser.add_argument(
        "--simulate-speed", metavar="K0,K1,...", help="declared simulation of slower ranks (--rebalance)"
    )
    parser.add_argument(
        "--simulate-sample-ms", type=float, default=None, help="per-sample ms of a speed-1 rank"
    )
    parser.add_argument("--write-plan", default=None, help="where the updated plan goes (default: --plan)")
    parser.add_argument("--cache-dir", default=None, help="profile cache for the measured profiles")
    parser.add_argument("--no-feedback", action="store_true", help="write neither the plan nor the profiles")
    args = parser.parse_args(argv)
    if args.simulate_speed and not args.rebalance:
        parser.error("--simulate-speed needs --rebalance")
    return args


def _start_ray(address: str | None, num_cpus: int) -> None:
    """Join the Ray cluster at ``address``, or start a Ray of this job's own on 127.0.0.1 with ``num_cpus``."""
    import os

    import ray

    if address:
        ray.init(address=address)
        return
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keep a local Ray on 127.0.0.1
    # a Ray of this job's own, on loopback: left to itself a new local ray.init (Ray 2.59+) turns token auth on
    # and writes ~/.ray/auth_token into the user's home, after which every Ray started on this machine finds
    # it, turns token mode on and says so; a RAY_AUTH_MODE of the user's is kept
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # its workers are this job: at its priority, not Ray's default niceness 15, which on a machine with other
    # work leaves them a few per cent of a core (and a re-balancer measuring them sees the starvation)
    os.environ.setdefault("RAY_worker_niceness", "0")
    # address="local": a fresh Ray of our own, even when another one runs on this machine
    ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=num_cpus)


def _report_rebalance(result, args: argparse.Namespace) -> int:
    """Print world rank 0's re-balancing line and write its feedback (unless --no-feedback); the exit code."""
    results = read_results(result)
    if not results:
        print("error: world rank 0 reported no re-balancing results", file=sys.stderr)
        return 1
    if not args.no_feedback:
        for path in write_feedback(
            results["rebalance_feedback"], args.write_plan or args.plan, args.cache_dir
        ):
            print(f"wrote {path}", file=sys.stderr)
    print(results["rebalance_line"])
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        plan = load_plan(args.plan)
        if args.simulate_speed:
            from planner.runtime.simulate import parse_speeds

            parse_speeds(args.simulate_speed, plan.world_size)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code

    import ray
    import torch
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    _start_ray(args.address, num_cpus=max(plan.world_size, 2))
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "plan": plan,
            "match": args.match,
            "steps": args.steps,
            "dataset_size": args.dataset_size,
            "lr": args.lr,
            "seed": args.seed,
            "rebalance": args.rebalance,
            "simulate_speed": args.simulate_speed,
            "simulate_sample_ms": args.simulate_sample_ms,
        },
        scaling_config=ScalingConfig(num_workers=plan.world_size, use_gpu=torch.cuda.is_available()),
        run_config=RunConfig(storage_path=str(Path(args.plan).resolve().parent / "ray_results")),
    )
    result = trainer.fit()
    ray.shutdown()
    if result.error is not None:
        print(f"error: training failed: {result.error}", file=sys.stderr)
        return 1
    print(
        f"done: {args.steps} steps on {plan.world_size} workers with batches {[r.batch for r in plan.ranks]}"
    )
    if args.rebalance:
        return _report_rebalance(result, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
