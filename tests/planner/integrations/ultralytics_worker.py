"""One process of the Ultralytics trainer tests: a DDP rank under torchrun (``ddp``), or a single process
(``reference``: Ultralytics' own DetectionTrainer; ``single``: batch=-1 on one device, Ultralytics' own path
against the planned trainer's, and the launching process of a 3-GPU job, its DDP launch captured).

What is patched to let Ultralytics' DDP run on CPU processes over gloo (Ultralytics trains DDP on GPUs only):
1. ``world_size`` is torchrun's ``WORLD_SIZE`` (Ultralytics counts 0 devices on a CPU);
2. ``_setup_ddp`` starts a gloo process group and stays on the CPU (Ultralytics' binds a CUDA device and
   prefers NCCL);
3. ``torch.nn.parallel.DistributedDataParallel`` drops ``device_ids=[None]`` (Ultralytics passes the device's
   index, which a CPU device has not, and DDP refuses device ids for a CPU module).
For the comparison, every run also: 4. keeps its BatchNorm layers in eval mode while training; 5. starts from
the same weights (``yolov8n.yaml`` built under ``torch.manual_seed(0)``); 6. records the images of every step
(``im_file``) and counts its optimizer steps; 7. skips the final validation of best.pt (``final_eval``: no
parameter changes there). Everything else (``_setup_train``, loaders, loss, optimizer step, accumulation,
weight decay) is the installed Ultralytics' code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def _patch_ddp_for_cpu() -> None:
    real = torch.nn.parallel.DistributedDataParallel

    class CpuDistributedDataParallel(real):  # patch 3
        def __init__(self, module, device_ids=None, *args, **kwargs):
            super().__init__(module, None if device_ids == [None] else device_ids, *args, **kwargs)

    torch.nn.parallel.DistributedDataParallel = CpuDistributedDataParallel


def instrumented(base: type, *, ddp: bool) -> type:
    """``base`` with the patches above (1-2 only with ``ddp``)."""

    class Instrumented(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if ddp:
                self.world_size = int(os.environ["WORLD_SIZE"])  # patch 1
            self.step_images: list[list[str]] = []
            self.optimizer_steps = 0

        def _setup_ddp(self):  # patch 2
            if not dist.is_initialized():
                dist.init_process_group("gloo")
            self.device = torch.device("cpu")

        def _model_train(self):  # patch 4
            super()._model_train()
            for module in self.model.modules():
                if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                    module.eval()

        def preprocess_batch(self, batch):  # patch 6
            self.step_images.append([Path(f).name for f in batch["im_file"]])
            return super().preprocess_batch(batch)

        def optimizer_step(self):  # patch 6
            self.optimizer_steps += 1
            super().optimizer_step()

        def final_eval(self):  # patch 7
            pass

    Instrumented.__name__ = Instrumented.__qualname__ = f"Instrumented{base.__name__}"
    return Instrumented


def _train(
    trainer_class: type, settings: dict, *, setup_only: bool = False, init: Path | None = None
) -> object:
    trainer = trainer_class(overrides=settings)
    torch.manual_seed(0)  # patch 5: every run starts from the same weights
    trainer.model = trainer.get_model(cfg="yolov8n.yaml", weights=None, verbose=False)
    if init is not None:
        torch.save(_float_state(trainer.model), init)
    if setup_only:  # what _do_train does before its first epoch
        trainer._setup_ddp()
        trainer._setup_train()
    else:
        trainer.train()
    return trainer


def _float_state(model) -> dict:
    from ultralytics.utils.torch_utils import unwrap_model

    return {
        k: v.detach().clone().float()
        for k, v in unwrap_model(model).state_dict().items()
        if v.dtype.is_floating_point
    }


def _save(trainer, out: Path, name: str) -> None:
    from planner.codec import encode

    torch.save(_float_state(trainer.model), out / f"{name}.pt")
    record = {
        "optimizer_steps": trainer.optimizer_steps,
        "step_images": trainer.step_images,
        "accumulate": trainer.accumulate,
        "batch_size": trainer.batch_size,
        "loader_batch": trainer.train_loader.batch_size,
        "steps_per_epoch": len(trainer.train_loader),
        "weight_decay": [g["weight_decay"] for g in trainer.optimizer.param_groups],
        "plans": [encode(p) for p in getattr(trainer, "batchplan_plans", [])],
    }
    plan = getattr(trainer, "batchplan_rank_plan", None)
    if plan is not None:
        record.update(rank=plan.rank, rank_batch=plan.batch, batches=list(plan.batches), gpu=plan.gpu)
    (out / f"{name}.json").write_text(json.dumps(record))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["ddp", "reference", "single"])
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--plan", default=None)
    parser.add_argument("--batch", type=float, default=10)
    parser.add_argument("--simulate-gpus", default=None)
    parser.add_argument("--variants", default="planned", help="comma-separated: planned, weighted")
    parser.add_argument(
        "--setup-only", action="store_true", help="set the trainer up (plan, loaders) and stop"
    )
    parser.add_argument("--imgsz", type=int, default=None)
    args = parser.parse_args()
    out = Path(args.out)
    # Ultralytics' settings file per process (read at import): ranks that share one would race on it
    rank_name = f"rank{os.environ['RANK']}" if "RANK" in os.environ else args.mode
    os.environ["YOLO_CONFIG_DIR"] = str(Path(os.environ.get("YOLO_CONFIG_DIR", out / "config")) / rank_name)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from ultralytics_helpers import TRAIN_SETTINGS

    settings = {**TRAIN_SETTINGS, "data": args.data, "project": str(out / "runs"), "batch": args.batch}
    if args.imgsz is not None:
        settings["imgsz"] = args.imgsz
    from ultralytics.utils import SETTINGS

    SETTINGS.update(
        {"raytune": False, "tensorboard": False}
    )  # no integration callbacks (Ray Tune imports Ray)
    if args.mode == "reference":
        from ultralytics.models.yolo.detect import DetectionTrainer

        trainer = _train(
            instrumented(DetectionTrainer, ddp=False),
            {**settings, "device": "cpu", "name": "ref"},
            init=out / "init.pt",
        )
        _save(trainer, out, "reference")
        return
    if args.mode == "single":
        _autobatch(settings, out)
        _launches(settings, out)
        return
    from planner.integrations.ultralytics import planned_trainer

    _patch_ddp_for_cpu()
    rank = int(os.environ["RANK"])
    for variant in args.variants.split(","):
        base = planned_trainer(
            "detect", plan=args.plan, simulate_gpus=args.simulate_gpus, cache_dir=str(out / "profile-cache")
        )
        if variant == "weighted":  # w_i = b_i·W/B on top of a loss that already sums over the images
            base = type(base.__name__, (base,), {"batchplan_loss_reduction": "mean"})
        trainer = _train(
            instrumented(base, ddp=True),
            {**settings, "device": "cpu", "name": variant},
            setup_only=args.setup_only,
        )
        _save(trainer, out, f"{variant}-rank{rank}")
    dist.barrier()  # every rank done before any tears gloo down
    dist.destroy_process_group()
    # skip the interpreter's teardown, where a gloo rank now and then aborts after all is done (README, "Using
    # the plan in a training script"; examples/train_ddp.py ends the same way)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _autobatch(settings: dict, out: Path) -> None:
    """batch=-1 on one CPU device: Ultralytics' DetectionTrainer and the planned one, each with
    check_train_batch_size recorded (it answers 7): the same call, the same batch and pipeline."""
    import ultralytics.engine.trainer as engine
    from ultralytics.models.yolo.detect import DetectionTrainer

    from planner.integrations.ultralytics import PlannedDetectionTrainer

    results = {}
    for name, trainer_class in (("ultralytics", DetectionTrainer), ("planned", PlannedDetectionTrainer)):
        calls = []

        def recorded(calls=calls, **kwargs):
            calls.append({k: (str(v) if k in {"model", "amp"} else v) for k, v in kwargs.items()})
            return 7

        engine.check_train_batch_size = recorded
        trainer = trainer_class(overrides={**settings, "device": "cpu", "batch": -1, "name": name})
        torch.manual_seed(0)
        trainer.model = trainer.get_model(cfg="yolov8n.yaml", weights=None, verbose=False)
        trainer._setup_train()
        calls[0].pop("model")
        results[name] = {
            "calls": calls,
            "batch": trainer.batch_size,
            "args_batch": trainer.args.batch,
            "loader_batch": trainer.train_loader.batch_size,
            "steps": len(trainer.train_loader),
            "accumulate": trainer.accumulate,
            "loader": type(trainer.train_loader).__name__,
            "weight_decay": [g["weight_decay"] for g in trainer.optimizer.param_groups],
            "planned": getattr(trainer, "batchplan_rank_plan", None) is not None,
        }
    (out / "autobatch.json").write_text(json.dumps(results))


def _launches(settings: dict, out: Path) -> None:
    """The launching process of ``device="0,1,2"`` (three GPUs simulated: ``ddp`` and ``world_size`` set as
    Ultralytics sets them for three CUDA devices) with ``batch=-1``: Ultralytics' own trainer refuses; the
    planned one starts its DDP workers (``subprocess.run`` recorded, the state it pickled for them read back),
    and refuses a plan whose world size or GPU types are not the devices'."""
    import subprocess

    from ultralytics.models.yolo.detect import DetectionTrainer
    from ultralytics.utils.patches import torch_load

    from planner.errors import ConfigError
    from planner.integrations.ultralytics import planned_trainer

    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from tests.plans import make_plan

    simulated = "A100-SXM4-80GB,T4,T4"
    plans = {
        "matching": make_plan((12, 2, 2), gpus=["A100-SXM4-80GB", "T4", "T4"]),
        "four_ranks": make_plan((2, 2, 2, 2), nodes=(("node-a", 4),)),
        "other_types": make_plan((2, 2, 2)),
    }
    launched: list = []

    def recorded_run(cmd, check=False):
        state = torch_load(Path(cmd[-1]).with_suffix(".pt"), map_location="cpu")
        launched.append(
            {
                "cmd": [str(c) for c in cmd],
                "batch": state["args"]["batch"],
                "options": repr(state["trainer"].batchplan),
                "trainer": state["trainer"].__name__,
                "mro": [c.__name__ for c in state["trainer"].__mro__],
            }
        )

    subprocess.run = recorded_run
    results: dict = {}
    cases = [
        ("ultralytics", DetectionTrainer),
        ("in_job", planned_trainer("detect", simulate_gpus=simulated)),
    ]
    from planner.cluster import catalog_for

    for name, plan in plans.items():
        for entry in plan["ranks"]:  # the memory of the planned type, as batchplan plan writes it
            entry["total_memory_bytes"] = catalog_for(None).get(entry["gpu"]).memory_bytes
        path = out / f"{name}.json"
        path.write_text(json.dumps(plan))
        cases.append((name, planned_trainer("detect", plan=str(path), simulate_gpus=simulated)))
    for name, trainer_class in cases:
        trainer = trainer_class(
            overrides={**settings, "device": "cpu", "batch": -1, "name": f"launch-{name}"}
        )
        trainer.ddp, trainer.world_size, trainer.args.device = True, 3, "0,1,2"  # as for three CUDA devices
        launched.clear()
        try:
            trainer.train()
            results[name] = {"launched": list(launched)}
        except (ValueError, ConfigError) as e:
            results[name] = {"error": f"{type(e).__name__}: {e}", "launched": list(launched)}
    (out / "launches.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
