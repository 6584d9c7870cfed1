"""What the planned Ultralytics trainer adds to each task's own trainer (``PlannedTrainerMixin``): DDP with
``batch=-1`` on several GPUs, per-rank batches from a plan, and the Ultralytics rules that must follow the
global batch on every rank.

The launching process (``device="0,1,2"`` or ``"-1,-1"``, ``LOCAL_RANK`` unset) starts Ultralytics' own DDP
workers (``generate_ddp_command``: a temporary script that rebuilds this trainer's class from a cloudpickled
state) where Ultralytics refuses ``batch < 1`` for several GPUs (``BaseTrainer.train``, since 8.3.204). In each
worker, where Ultralytics would give every rank ``batch // world_size`` (``_build_train_pipeline``), the ranks
instead agree on one plan:

- from a ``plan.json`` (``planned_trainer(plan=...)``): each rank reads its entry (``load_rank_plan``), which
  refuses a launch or a GPU that does not match; the launching process refuses a plan whose world size or GPU
  types differ from the devices before starting anything;
- else in the job: rank 0 records Ultralytics' own AutoBatch request (``ultralytics_autobatch``), the first
  rank of each GPU type profiles its GPU with Ultralytics' own probes, the profiles are gathered and every
  rank computes the same plan (``planner.runtime.autobatch_ddp``): ``batch=-1`` (or a fraction) maximises
  throughput, an integer ``batch`` is the global batch, split by speed and memory.

Then, on every rank: its train loader takes its planned slice of every global step (``ultralytics_loader``),
its validation loader 2× its planned batch (Ultralytics' 2× of the even share); ``self.batch_size`` is the
global batch, so ``accumulate = round(nbs / batch)`` and the weight-decay scaling are the same everywhere (×
the plan's own micro-steps when it has them); BatchNorm is synchronised where CUDA allows
(``ultralytics_batchnorm``); and one line per rank says its GPU, batch and share (stderr, ``batchplan:``).

The per-rank loss rule is ``planner.runtime.weights``': Ultralytics' detect, segment, pose and obb losses are
``loss × batch_size`` of the rank (a per-image mean times the rank's images) and the trainer multiplies them by
the world size, so DDP's mean is already the step's images each counted once: no weight. Classification's
loss is a plain mean (``F.cross_entropy(..., reduction="mean")``): each rank's loss takes ``loss_weight``
``b_i · W / B``. Checked against the installed library by tests/planner/integrations.

Built against ultralytics 8.4.190. Known limitations: the detection losses normalise each rank's loss by that
rank's own target-score sum, so a DDP step equals the single-GPU step over the same images only when the
ranks' target scores are in proportion to their batches (as with Ultralytics' own even split); plain
BatchNorm (``sync_bn`` off, or a CPU run) normalises over each rank's own, unequal batch.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Literal

from planner.errors import ConfigError, InfeasiblePlanError, UserError
from planner.plan.types import Plan

#: the Ultralytics release this trainer was built and tested against
TESTED_ULTRALYTICS = "8.4.190"
#: what Ultralytics' DDP launch pickles the trainer with (``generate_ddp_file``: it pip-installs it when missing)
CLOUDPICKLE_REQUIREMENT = "cloudpickle>=3.1.1"

LossReduction = Literal["sum", "mean"]
#: how each task's loss reduces over a rank's images (ultralytics 8.4.190 ``utils/loss.py``): ``sum`` is
#: ``loss × batch_size`` (v8DetectionLoss and its segment, pose and OBB subclasses), ``mean`` a plain mean
#: (v8ClassificationLoss); the per-rank rule for each is ``planner.runtime.weights``'
TASK_LOSS_REDUCTION: dict[str, LossReduction] = {
    "detect": "sum",
    "segment": "sum",
    "pose": "sum",
    "obb": "sum",
    "classify": "mean",
}


class UltralyticsUnavailableError(UserError, ImportError):
    """Ultralytics, or what its multi-GPU launch needs, is not installed or cannot import; the message names the
    pip command."""


@dataclass(frozen=True, kw_only=True)
class PlanOptions:
    """How a planned trainer chooses the per-rank batches (``planned_trainer``'s keywords)."""

    plan: str | None = None
    """path of a ``plan.json`` made by ``batchplan plan`` for this job's ranks and GPU types; None: plan in the
    job (``batch=-1``: maximal throughput; an integer ``batch``: that global batch)"""
    sync_bn: bool | None = None
    """SyncBatchNorm over the ranks (the statistics of the whole step, unequal batches included); None: on
    where the ranks run on CUDA (SyncBatchNorm needs it), off elsewhere"""
    simulate_gpus: tuple[str, ...] | None = None
    """catalog GPU types, one per rank, for ranks without GPUs (CPU processes over gloo: tests, dry runs): the
    in-job plan is estimated for them and a plan's GPU types are checked against them"""
    cache_dir: str | None = None
    """profile cache of estimated profiles (simulated GPU types); None: batchplan's (``$BATCHPLAN_CACHE_DIR``,
    else ``~/.cache/batchplan/profiles``)"""

    def __post_init__(self) -> None:
        if self.plan is not None and not isinstance(self.plan, str | os.PathLike):
            raise ConfigError(f"plan must be the path of a plan.json, got {self.plan!r}")
        if self.plan is not None:
            object.__setattr__(self, "plan", os.fspath(self.plan))
        if self.sync_bn is not None and not isinstance(self.sync_bn, bool):
            raise ConfigError(f"sync_bn must be True, False or None (on with CUDA), got {self.sync_bn!r}")
        gpus = self.simulate_gpus
        if isinstance(gpus, str):
            gpus = tuple(g.strip() for g in gpus.split(","))
        if gpus is not None:
            gpus = tuple(gpus)
            if not gpus or not all(isinstance(g, str) and g for g in gpus):
                raise ConfigError(
                    f"simulate_gpus must name one catalog GPU type per rank, got {self.simulate_gpus!r}"
                )
            from planner.cluster import catalog_for

            catalog = catalog_for(None)
            gpus = tuple(catalog.get(g).name for g in gpus)  # ConfigError naming the known types
        object.__setattr__(self, "simulate_gpus", gpus)


def say(message: str) -> None:
    """One line of the trainer's own report, on stderr (``batchplan: ...``), whatever Ultralytics' log level of
    the rank (its non-zero ranks log errors only)."""
    print(f"batchplan: {message}", file=sys.stderr, flush=True)


def require_cloudpickle() -> None:
    """Refuse a multi-GPU launch without cloudpickle rather than let Ultralytics pip-install it mid-launch."""
    try:
        version = importlib.metadata.version("cloudpickle")
    except importlib.metadata.PackageNotFoundError:
        version = None
    parts = tuple(int(p) for p in (version or "0").split(".")[:3] if p.isdigit())
    if version is None or parts < (3, 1, 1):
        found = f"cloudpickle {version} is installed" if version else "cloudpickle is not installed"
        raise UltralyticsUnavailableError(
            f"Ultralytics' multi-GPU launch pickles the trainer with {CLOUDPICKLE_REQUIREMENT}, and {found} "
            f"(pip install '{CLOUDPICKLE_REQUIREMENT}'; Ultralytics would try to install it itself at launch)"
        )


def _gpu_summary(names: list[str]) -> str:
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{n}× {name}" for name, n in counts.items())


def plan_mismatch(plan: Any, gpus: list[Any], *, where: str, device: str) -> str | None:
    """Why ``plan`` (a typed plan) does not fit a launch on ``gpus`` (``GpuStats`` per device in rank order, or
    None where a device cannot be read), in one line naming what differs; None when it fits."""
    from planner.runtime.rank_gpu import same_gpu
    from torchkit.units import GIB

    if plan.world_size != len(gpus):
        return (
            f"{where} is for {plan.world_size} ranks ({_gpu_summary([r.gpu for r in plan.ranks])}) but "
            f"device={device!r} starts {len(gpus)}: re-plan for these devices (batchplan plan), or pass "
            f"{plan.world_size} devices"
        )
    devices = device.split(":", 1)[-1].split(",")
    for entry, gpu, index in zip(plan.ranks, gpus, devices, strict=True):
        if gpu is not None and not same_gpu(entry, gpu):
            return (
                f"{where} plans rank {entry.rank} for a {entry.gpu} ({entry.total_memory_bytes / GIB:.1f} GiB) but "
                f"device {index} is a {gpu.name} ({gpu.memory_total_bytes / GIB:.1f} GiB): re-plan for these "
                "GPUs (batchplan plan), or list the devices in the plan's rank order"
            )
    return None


class RankWeightedCriterion:
    """A loss criterion whose loss (its first output) is multiplied by the rank's ``loss_weight``; the detached
    items Ultralytics logs are left as they are. Everything else is the wrapped criterion's."""

    def __init__(self, criterion: Any, weight: float) -> None:
        self.criterion = criterion
        self.weight = float(weight)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        loss, items = self.criterion(*args, **kwargs)
        return loss * self.weight, items

    def __getattr__(self, name: str) -> Any:
        if name == "criterion":  # not yet set (unpickling): no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self.criterion, name)


class PlannedTrainerMixin:
    """Mixed into each task's Ultralytics trainer by ``planner.integrations.ultralytics``; see the module
    docstring. Single-device runs without a plan are Ultralytics' own, AutoBatch included."""

    batchplan: ClassVar[PlanOptions] = PlanOptions()
    """the options (``planned_trainer`` makes a subclass with its own)"""
    batchplan_task: ClassVar[str] = "detect"
    batchplan_loss_reduction: ClassVar[LossReduction] = "sum"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from ultralytics.utils import LOCAL_RANK, WORLD_SIZE

        self.batchplan_rank_plan: Any = None
        """this rank's ``planner.runtime.RankPlan`` once planned (None: Ultralytics' own batches)"""
        self.batchplan_plans: list[Plan] = []
        """the plans made in the job, in order (a second one when the first exceeded the dataset)"""
        self._batchplan_source = ""
        self._batchplan_global: int | None = None
        self._batchplan_cap: int | None = None  # this rank's largest batch in the plan (its memory cap)
        self._batchplan_sync_bn = 0  # SyncBatchNorm layers made
        self._batchplan_reported = False
        if LOCAL_RANK != -1 and self.device.type not in {"cpu", "mps"} and self.world_size < WORLD_SIZE:
            # started by an outside torchrun over several nodes (a plan's node lines): the job's ranks are
            # WORLD_SIZE, where Ultralytics counts the devices of this node
            local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            if local_ranks > self.world_size:
                raise ConfigError(
                    f"torchrun starts {local_ranks} ranks on this node but device="
                    f"{self.args.device!r} names {self.world_size}: give one device per rank"
                )
            self.world_size = WORLD_SIZE
        if self.batchplan.simulate_gpus is not None and self.device.type not in {"cpu", "mps"}:
            raise ConfigError(
                f"simulate_gpus is for ranks without GPUs (CPU runs); on device={self.args.device!r} "
                "each rank's GPU is read from the device itself: drop simulate_gpus"
            )

    # ------------------------------------------------------------------------------ the launching process

    def train(self) -> Any:
        from ultralytics.utils import RANK

        if not self.ddp:
            if RANK == -1 and self.batchplan.plan is not None:
                self._take_one_rank_plan()
            return super().train()
        self._check_plan_before_launch()
        require_cloudpickle()
        return self._launch_ddp()

    def _launch_ddp(self) -> None:
        """Ultralytics' DDP launch (``BaseTrainer.train``, 8.4.190), without its refusal of ``batch < 1``: the
        workers plan the batches."""
        from ultralytics.utils import LOGGER, colorstr
        from ultralytics.utils.dist import ddp_cleanup, generate_ddp_command
        from ultralytics.utils.torch_utils import unset_deterministic

        try:
            if self.args.rect:
                LOGGER.warning("'rect=True' is incompatible with Multi-GPU training, setting 'rect=False'")
                self.args.rect = False
            file = None
            try:
                cmd, file = generate_ddp_command(self)
                LOGGER.info(f"{colorstr('DDP:')} debug command {' '.join(cmd)}")
                subprocess.run(cmd, check=True)
            finally:
                if file is not None:
                    ddp_cleanup(self, str(file))
        finally:
            unset_deterministic()

    def _device_gpus(self) -> list[Any]:
        """``GpuStats`` of each device of ``args.device``, in rank order (simulated types, or CUDA's)."""
        devices = str(self.args.device).split(":", 1)[-1].split(",")
        if self.batchplan.simulate_gpus is not None:
            return [self._simulated_gpu(i) for i in range(len(devices))]
        return [_cuda_gpu(int(index)) for index in devices]

    def _simulated_gpu(self, rank: int) -> Any:
        from planner.cluster import catalog_for
        from torchkit.hardware.nvml import GpuStats

        simulated = self.batchplan.simulate_gpus
        assert simulated is not None
        if rank >= len(simulated):
            raise ConfigError(
                f"simulate_gpus names {len(simulated)} GPU types but the job has a rank {rank}: name "
                "one type per rank"
            )
        spec = catalog_for(None).get(simulated[rank])
        return GpuStats(
            index=rank,
            name=spec.name,
            memory_total_bytes=spec.memory_bytes,
            memory_used_bytes=0,
            memory_free_bytes=spec.memory_bytes,
        )

    def _take_one_rank_plan(self) -> None:
        """One process takes only a one-rank plan (refused before anything is built or profiled), and its
        batch, instead of Ultralytics' AutoBatch."""
        from planner.plan.io import load_plan

        plan = load_plan(self.batchplan.plan)
        if plan.world_size != 1:
            raise ConfigError(
                f"{self.batchplan.plan} is for {plan.world_size} ranks but this run is one process "
                f"(device={self.args.device!r}): pass the plan's {plan.world_size} devices"
            )
        self._say_batch_replaced(plan.global_batch)
        self.args.batch = self.batch_size = plan.global_batch

    def _check_plan_before_launch(self) -> None:
        """Refuse, before any worker starts, a plan whose world size or GPU types are not this launch's."""
        if self.batchplan.plan is None:
            return
        from planner.plan.io import load_plan

        problem = plan_mismatch(
            load_plan(self.batchplan.plan),
            self._device_gpus(),
            where=self.batchplan.plan,
            device=str(self.args.device),
        )
        if problem:
            raise ConfigError(problem)

    # ------------------------------------------------------------------------------------- in the ranks

    def _is_ddp_rank(self) -> bool:
        from ultralytics.utils import RANK

        return RANK != -1 and self.world_size > 1

    def setup_model(self) -> Any:
        ckpt = super().setup_model()
        if self._is_ddp_rank() and self._wants_sync_bn():
            from planner.integrations.ultralytics_batchnorm import to_sync_batchnorm

            self.model, self._batchplan_sync_bn = to_sync_batchnorm(self.model)
        return ckpt

    def _wants_sync_bn(self) -> bool:
        cuda = self.device.type == "cuda"
        if self.batchplan.sync_bn is None:
            return cuda
        if self.batchplan.sync_bn and not cuda:
            from ultralytics.utils import RANK

            if RANK == 0:
                say(
                    f"sync_bn=True needs CUDA (SyncBatchNorm), and the ranks run on {self.device.type}: each rank "
                    "keeps its own BatchNorm statistics"
                )
            return False
        return self.batchplan.sync_bn

    def _setup_train(self) -> None:
        super()._setup_train()
        if self._batchplan_sync_bn and self.ema is not None:
            from planner.integrations.ultralytics_batchnorm import to_plain_batchnorm

            to_plain_batchnorm(
                self.ema.ema
            )  # checkpoints are saved from the EMA: plain BatchNorm, loadable anywhere

    def _build_train_pipeline(self) -> None:
        if self.batchplan.plan is not None or self._is_ddp_rank():
            if self.batchplan_rank_plan is None:
                self._make_plan()
            elif (
                self.batch_size != self._batchplan_global
            ):  # Ultralytics' single-GPU OOM retry halved the batch
                say(
                    f"the plan's batch {self._batchplan_global} ran out of memory: Ultralytics' retry at batch "
                    f"{self.batch_size} takes over"
                )
                self.batchplan_rank_plan = None
            if self.batchplan_rank_plan is not None:
                # the GLOBAL batch: Ultralytics' accumulate = round(nbs / batch) and weight-decay scaling then
                # agree on every rank (its even split gives each rank batch // world_size of it)
                self.args.batch = self.batch_size = self._batchplan_global
        super()._build_train_pipeline()
        plan = self.batchplan_rank_plan
        if plan is None:
            return
        if plan.accumulate > 1:  # the plan's micro-steps, on top of what nbs asks of its global batch
            self.accumulate *= plan.accumulate
            if not self.args.time:
                self.accumulate = min(self.accumulate, len(self.train_loader) * self.epochs)
        if self.batchplan_loss_reduction == "mean" and plan.world_size > 1:
            from ultralytics.utils.torch_utils import unwrap_model

            model = unwrap_model(self.model)
            criterion = getattr(model, "criterion", None)
            if not isinstance(criterion, RankWeightedCriterion):
                model.criterion = RankWeightedCriterion(criterion or model.init_criterion(), plan.loss_weight)
        self._report()

    def get_dataloader(
        self, dataset_path: str, batch_size: int = 16, rank: int = 0, mode: str = "train"
    ) -> Any:
        plan = self.batchplan_rank_plan
        if plan is None:
            return super().get_dataloader(dataset_path, batch_size, rank, mode)
        if mode == "train":
            from planner.integrations.ultralytics_loader import planned_train_loader

            loader = super().get_dataloader(dataset_path, plan.batch, rank, mode)
            return planned_train_loader(
                loader, plan.batches, plan.rank, seed=int(self.args.seed), drop_last=bool(self.args.compile)
            )
        # validation: Ultralytics gives each rank 2× (obb 1×) its even share of the global batch; here 2× (1×)
        # its planned batch, which is what its memory was planned for
        even_share = max(self.batch_size // max(self.world_size, 1), 1)
        return super().get_dataloader(dataset_path, max(batch_size // even_share, 1) * plan.batch, rank, mode)

    def _make_plan(self) -> None:
        from ultralytics.utils import RANK

        if self.batchplan.plan is not None:
            plan = self._plan_from_file()
            self._batchplan_source = f"plan {self.batchplan.plan}"
            if RANK == 0:
                self._say_batch_replaced(plan.global_batch)
        else:
            plan = self._plan_in_job()
        self.batchplan_rank_plan = plan
        self._batchplan_global = plan.global_batch

    def _say_batch_replaced(self, global_batch: int) -> None:
        asked = self.args.batch
        if asked >= 1 and int(asked) != global_batch:
            say(f"batch={asked:g} is replaced by the plan's global batch {global_batch}")

    def _this_gpu(self) -> Any:
        """This rank's GPU as ``GpuStats`` (simulated or CUDA's), or None on a CPU without a simulated type."""
        from ultralytics.utils import RANK

        if self.batchplan.simulate_gpus is not None:
            return self._simulated_gpu(max(RANK, 0))
        return _cuda_gpu(self.device.index or 0) if self.device.type == "cuda" else None

    def _plan_from_file(self) -> Any:
        from ultralytics.utils import RANK

        from planner.plan.rank_view import read_rank_view
        from planner.runtime import load_rank_plan

        path = self.batchplan.plan
        if RANK == -1:  # one process: a one-rank plan (train() checked)
            plan = load_rank_plan(path, rank=0, env={}, gpu=self._this_gpu())
        else:  # WORLD_SIZE, the launch position and the GPU checked against the rank's entry
            plan = load_rank_plan(path, rank=RANK, gpu=self._this_gpu())
        self._batchplan_cap = read_rank_view(Path(path), lambda world_size, nodes: plan.rank).entry.max_batch
        return plan

    def _plan_in_job(self) -> Any:
        """Every rank computes the same plan from Ultralytics' AutoBatch request and the gathered profiles."""
        import torch.distributed as dist
        from ultralytics.utils import LOCAL_RANK, RANK
        from ultralytics.utils.torch_utils import unwrap_model

        from planner.integrations.ultralytics_autobatch import autobatch_request, job_for, ultralytics_profile
        from planner.runtime import autobatch_ddp

        simulated = self.batchplan.simulate_gpus
        if (
            simulated is not None and len(simulated) != self.world_size
        ):  # the same on every rank: all stop here
            raise ConfigError(
                f"simulate_gpus names {len(simulated)} GPU types for {self.world_size} ranks: name one "
                "type per rank"
            )
        box: list[Any] = [None]
        if RANK == 0:
            try:
                box = [autobatch_request(self)]
            except (
                Exception
            ) as e:  # told to every rank below, so that none waits for a request that will not come
                box = [f"{type(e).__name__}: {e}"]
        dist.broadcast_object_list(box, src=0)  # one request, so that every rank plans the same job
        request = box[0]
        if isinstance(request, str):
            raise InfeasiblePlanError(f"rank 0 could not make Ultralytics' AutoBatch request: {request}")
        asked = self.args.batch
        global_batch = int(asked) if asked >= 1 else None
        job = job_for(self, request, global_batch=global_batch, simulated=simulated is not None)
        made: dict[str, Any] = {}

        def profiler(gpu: Any, device_index: int) -> Any:  # memoised: a second plan reuses the probes
            if gpu.name not in made:
                made[gpu.name] = ultralytics_profile(unwrap_model(self.model), request, gpu, self.device)
            return made[gpu.name]

        options: dict[str, Any] = {
            "gpu": simulated[RANK] if simulated else None,
            "device_index": self.device.index if self.device.type == "cuda" else LOCAL_RANK,
            "cache_dir": self.batchplan.cache_dir,
            "profiler": None if simulated else profiler,
        }
        result = autobatch_ddp(job, **options)
        self.batchplan_plans.append(result.plan)
        if (
            global_batch is None
            and request.dataset_size
            and result.rank_plan.step_batch > request.dataset_size
        ):
            if RANK == 0:
                say(
                    f"the plan's {result.rank_plan.step_batch} images per step exceed the dataset's "
                    f"{request.dataset_size}: planned again for a global batch of {request.dataset_size} "
                    "(Ultralytics' AutoBatch caps a batch at the dataset size)"
                )
            result = autobatch_ddp(replace(job, global_batch=request.dataset_size), **options)
            self.batchplan_plans.append(result.plan)
        how = (
            "estimated for the simulated GPU types"
            if simulated
            else "Ultralytics' AutoBatch probes on each GPU type"
        )
        self._batchplan_source = f"planned in the job ({how})"
        self._batchplan_cap = result.plan.ranks[RANK].max_batch
        if RANK == 0:
            from planner.plan.io import write_plan

            write_plan(result.plan, self.save_dir / "batchplan_plan.json")
        return result.rank_plan

    def _report(self) -> None:
        """One line per rank (its GPU, batch and share); rank 0 adds the step, the loss rule and BatchNorm."""
        if self._batchplan_reported:
            return
        self._batchplan_reported = True
        from ultralytics.utils import RANK

        plan = self.batchplan_rank_plan
        gpu = plan.gpu
        if RANK in {-1, 0}:
            weight_decay = next(
                (
                    g["weight_decay"]
                    for g in self.optimizer.param_groups
                    if g.get("param_group") in {"weight", "muon"}
                ),
                self.args.weight_decay,
            )
            ranks = f"{plan.world_size} rank{'s' if plan.world_size != 1 else ''}"
            say(
                f"{ranks}, {self._batchplan_source}: {plan.step_batch} images per step, "
                f"global batch {plan.global_batch}, accumulate {self.accumulate} (nbs {self.args.nbs}) and "
                f"weight_decay {weight_decay:.6g} on every rank"
            )
            say(self._loss_line(plan))
            if plan.world_size > 1:
                say(self._batchnorm_line(plan))
        steps = len(self.train_loader)
        cap = f", cap {self._batchplan_cap}" if self._batchplan_cap is not None else ""
        say(
            f"rank {plan.rank}/{plan.world_size} {self.device} {gpu}: batch {plan.batch} of {plan.step_batch} per "
            f"step ({plan.batch / plan.step_batch:.1%}{cap}), {steps} step{'s' if steps != 1 else ''} per epoch"
        )

    def _loss_line(self, plan: Any) -> str:
        task = self.batchplan_task
        if self.batchplan_loss_reduction == "sum":
            return (
                f"loss: Ultralytics' {task} loss is its per-image mean × the rank's batch, × the world size: "
                "DDP's mean counts every image of the step once, no per-rank weight (planner/runtime/weights.py)"
            )
        return (
            f"loss: Ultralytics' {task} loss is a mean over the rank's images: × loss_weight b_i·W/B "
            f"= {plan.loss_weight:.4g} on rank {plan.rank}, so that every image of the step counts once "
            "(planner/runtime/weights.py)"
        )

    def _batchnorm_line(self, plan: Any) -> str:
        uneven = len(set(plan.batches)) > 1
        batches = ", ".join(map(str, plan.batches))
        if self._batchplan_sync_bn:
            return (
                f"BatchNorm: SyncBatchNorm ({self._batchplan_sync_bn} layers) over all {plan.step_batch} images "
                "of each step; checkpoints keep plain BatchNorm"
            )
        why = (
            "sync_bn=False"
            if self.batchplan.sync_bn is False
            else (f"sync_bn off: SyncBatchNorm needs CUDA, the ranks run on {self.device.type}")
        )
        if not uneven:
            return f"BatchNorm: each rank over its own batch ({why}); the batches are equal ({batches})"
        return (
            f"BatchNorm: each rank over its own batch ({why}); with uneven batches ({batches}) the ranks' "
            "BatchNorm statistics differ"
        )


def _cuda_gpu(index: int) -> Any:
    """``GpuStats`` of CUDA device ``index`` (torch's numbering): its name and total memory, read from its
    properties (no CUDA context is made on it; its use is not read)."""
    import torch

    from torchkit.hardware.nvml import GpuStats

    props = torch.cuda.get_device_properties(index)
    total = int(props.total_memory)
    return GpuStats(
        index=index, name=props.name, memory_total_bytes=total, memory_used_bytes=0, memory_free_bytes=total
    )
