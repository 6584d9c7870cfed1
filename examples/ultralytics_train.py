"""Ultralytics' own trainer with ``batch=-1`` on several, mixed GPUs: batchplan plans each GPU's batch.

    python examples/ultralytics_train.py --data data.yaml --device 0,1,2              # batch=-1: planned in the job
    python examples/ultralytics_train.py --data data.yaml --device 0,1,2 --batch 96   # 96 a step, split by speed
    python examples/ultralytics_train.py --data data.yaml --device 0,1,2 --plan plan.json

Ultralytics starts the DDP workers itself (one per device); ``--device -1,-1`` takes the two most idle GPUs.
The model is built from its YAML (fresh weights) unless you name your own ``.pt``; the dataset YAML must be a
local one (this script downloads nothing: plots are off unless ``--plots``, for which Ultralytics fetches a
font once). Needs ``pip install -e '.[ultralytics]'`` (README, "Ultralytics: batch=-1 on several GPUs").
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="yolov8n.yaml", help="model YAML (fresh weights) or your .pt")
    parser.add_argument("--data", required=True, help="dataset YAML on this machine")
    parser.add_argument("--device", default="0,1", help="GPUs, e.g. 0,1,2, or -1,-1 for the two most idle")
    parser.add_argument(
        "--batch",
        type=float,
        default=-1,
        help="-1: planned in the job; 0-1: that share of each GPU's memory; N: N images a step",
    )
    parser.add_argument("--plan", help="a plan.json from batchplan plan for exactly these GPUs")
    parser.add_argument(
        "--sync-bn",
        choices=("auto", "on", "off"),
        default="auto",
        help="SyncBatchNorm over the ranks (auto: on with CUDA)",
    )
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--plots", action="store_true", help="Ultralytics' plots (it downloads a font once)")
    args = parser.parse_args(argv)

    from planner.errors import UserError
    from planner.integrations.ultralytics import planned_trainer

    try:
        from planner.integrations.ultralytics import import_ultralytics

        YOLO = import_ultralytics("ultralytics").YOLO
        model = YOLO(args.model)
        trainer = planned_trainer(
            model, plan=args.plan, sync_bn={"auto": None, "on": True, "off": False}[args.sync_bn]
        )
        batch = int(args.batch) if args.batch >= 1 else args.batch  # Ultralytics takes a count as an int
        model.train(
            data=args.data,
            device=args.device,
            batch=batch,
            imgsz=args.imgsz,
            epochs=args.epochs,
            plots=args.plots,
            trainer=trainer,
        )
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
