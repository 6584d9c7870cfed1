"""Ultralytics' own trainer with batchplan's per-rank batches: ``batch=-1`` on several, mixed GPUs.

Ultralytics refuses AutoBatch on several GPUs ("AutoBatch with batch<1 not supported for Multi-GPU training")
and splits a given batch evenly, so a 24 GB card beside an 80 GB one trains at the small card's batch. A
planned trainer starts the DDP workers instead, plans each GPU's batch inside the job from Ultralytics' own
AutoBatch probes (or takes them from a ``plan.json``), and keeps every rule that depends on the global batch
the same on every rank::

    from ultralytics import YOLO
    from planner.integrations.ultralytics import planned_trainer

    model = YOLO("yolov8n.yaml")
    model.train(data="data.yaml", device="0,1,2", batch=-1, trainer=planned_trainer(model))

``planned_trainer(model, plan="plan.json", sync_bn=False)`` takes a plan made by ``batchplan plan`` and
chooses BatchNorm; ``PlannedDetectionTrainer`` (and ``PlannedSegmentationTrainer``, ``PlannedPoseTrainer``,
``PlannedOBBTrainer``, ``PlannedClassificationTrainer``) are the trainers with the default options, to pass as
``trainer=`` directly. What happens inside: ``planner.integrations.ultralytics_trainer``.

Importing this module imports neither Ultralytics nor torch: the trainers are made on first use, and a missing
or broken Ultralytics is then one ``UltralyticsUnavailableError`` line naming the pip command. Nothing here
downloads anything (no weights, fonts or datasets).
"""

from __future__ import annotations

from typing import Any

from planner.errors import ConfigError
from planner.integrations.ultralytics_trainer import (
    TASK_LOSS_REDUCTION,
    TESTED_ULTRALYTICS,
    PlannedTrainerMixin,
    PlanOptions,
    UltralyticsUnavailableError,
)

#: task -> (module of Ultralytics' trainer, its class, the planned class's name)
TASK_TRAINERS: dict[str, tuple[str, str, str]] = {
    "detect": ("ultralytics.models.yolo.detect", "DetectionTrainer", "PlannedDetectionTrainer"),
    "segment": ("ultralytics.models.yolo.segment", "SegmentationTrainer", "PlannedSegmentationTrainer"),
    "pose": ("ultralytics.models.yolo.pose", "PoseTrainer", "PlannedPoseTrainer"),
    "obb": ("ultralytics.models.yolo.obb", "OBBTrainer", "PlannedOBBTrainer"),
    "classify": ("ultralytics.models.yolo.classify", "ClassificationTrainer", "PlannedClassificationTrainer"),
}
assert set(TASK_TRAINERS) == set(TASK_LOSS_REDUCTION), "every planned task has its loss reduction"

# the planned trainers are made on first use (module __getattr__ below)
__all__ = [
    "TESTED_ULTRALYTICS",
    "PlanOptions",
    "UltralyticsUnavailableError",
    "planned_trainer",
    "trainer_class",
    *(name for _, _, name in TASK_TRAINERS.values()),
]


#: the extra that installs what the planned trainers need (pyproject.toml)
EXTRA = "ultralytics"
#: the BaseTrainer methods the planned trainer builds on (ultralytics 8.4.190)
_BUILDS_ON = ("_setup_train", "_build_train_pipeline", "setup_model", "get_dataloader", "auto_batch")


def import_ultralytics(module: str) -> Any:
    """``import module`` (an Ultralytics module), or one ``UltralyticsUnavailableError`` line with the fix."""
    from torchkit.errors import WorkloadError
    from torchkit.workloads.extras import extra_hint, import_library

    try:
        imported = import_library(
            module, model=module, subject="planner.integrations.ultralytics", extra=EXTRA
        )
        # Ultralytics imports torchvision's operators only when it first runs them (NMS in validation): a
        # torchvision that cannot load beside this torch would fail the job at its first validation
        import_library(
            "torchvision.ops",
            model="torchvision",
            extra=EXTRA,
            subject="planner.integrations.ultralytics (Ultralytics' trainer runs torchvision's NMS)",
        )
    except WorkloadError as e:
        raise UltralyticsUnavailableError(str(e)) from e
    base = import_library("ultralytics.engine.trainer", model=module).BaseTrainer
    missing = [name for name in _BUILDS_ON if not hasattr(base, name)]
    if missing:
        import ultralytics

        raise UltralyticsUnavailableError(
            f"ultralytics {ultralytics.__version__} has no BaseTrainer.{missing[0]}, which the planned trainer builds "
            f"on (built against ultralytics {TESTED_ULTRALYTICS}: {extra_hint(EXTRA)})"
        )
    return imported


def trainer_class(task: str = "detect") -> type:
    """The planned trainer of an Ultralytics task (``detect``, ``segment``, ``pose``, ``obb``, ``classify``)
    with the default options: Ultralytics' task trainer with ``PlannedTrainerMixin``. Made once, on first use,
    and importable by its name from this module (Ultralytics' DDP workers rebuild it from a pickle)."""
    if task not in TASK_TRAINERS:
        raise ConfigError(
            f"no planned trainer for Ultralytics task {task!r} (planned tasks: {', '.join(TASK_TRAINERS)})"
        )
    module_name, base_name, name = TASK_TRAINERS[task]
    made = globals().get(name)
    if made is None:
        base = getattr(import_ultralytics(module_name), base_name)
        made = type(
            name,
            (PlannedTrainerMixin, base),
            {
                "__module__": __name__,
                "__qualname__": name,
                "__doc__": f"Ultralytics' {base_name} with batchplan's per-rank batches "
                "(planner.integrations.ultralytics).",
                "batchplan_task": task,
                "batchplan_loss_reduction": TASK_LOSS_REDUCTION[task],
            },
        )
        globals()[name] = made
    return made


def planned_trainer(
    model_or_task: Any = "detect",
    *,
    plan: str | None = None,
    sync_bn: bool | None = None,
    simulate_gpus: str | tuple[str, ...] | None = None,
    cache_dir: str | None = None,
) -> type:
    """The trainer to pass as ``model.train(..., trainer=...)``.

    Args:
        model_or_task: an Ultralytics model (its ``task`` picks the trainer) or a task name.
        plan: a ``plan.json`` from ``batchplan plan`` for exactly this job's ranks and GPU types (refused, in
            one line naming what differs, when they are not); None: the ranks plan in the job.
        sync_bn: SyncBatchNorm over the ranks; None: on where the ranks run on CUDA.
        simulate_gpus: one catalog GPU type per rank (``"A100-SXM4-80GB,T4,T4"``) for ranks without GPUs.
        cache_dir: profile cache of estimated profiles (simulated GPU types).

    Raises:
        ConfigError: an unknown task or option value.
        UltralyticsUnavailableError: Ultralytics is not installed or cannot import.
    """
    task = model_or_task if isinstance(model_or_task, str) else getattr(model_or_task, "task", None)
    if not isinstance(task, str):
        raise ConfigError(f"planned_trainer needs an Ultralytics model or a task name, got {model_or_task!r}")
    base = trainer_class(task)
    options = PlanOptions(plan=plan, sync_bn=sync_bn, simulate_gpus=simulate_gpus, cache_dir=cache_dir)
    if options == base.batchplan:
        return base
    # a class of its own holding the options: Ultralytics' DDP state pickles the class (cloudpickle, by value for
    # a class made here), so that the workers rebuild the trainer with them
    return type(
        base.__name__, (base,), {"__module__": __name__, "__doc__": base.__doc__, "batchplan": options}
    )


def __getattr__(name: str) -> Any:
    """``PlannedDetectionTrainer`` and the other planned trainers, made on first use (``trainer_class``)."""
    for task, (_, _, class_name) in TASK_TRAINERS.items():
        if name == class_name:
            return trainer_class(task)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
