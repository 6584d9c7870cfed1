"""The job being planned: which model, input, precision and optimizer, and how batches are to be chosen.

A ``JobSpec`` is validated once, here, whether it comes from CLI flags, a plan file or Python; every other
layer trusts it. ``job`` in plan.json is its ``to_json()``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Literal

from torchkit.catalog import GpuSpec
from torchkit.errors import ConfigError

AmpChoice = Literal["auto", "fp16", "bf16", "off"]
OptimizerName = Literal["sgd", "adamw"]
Mode = Literal["balanced", "max", "uniform"]
Method = Literal["auto", "measure", "estimate"]
FitKind = Literal["affine", "loglog"]

AMP_CHOICES: tuple[str, ...] = ("auto", "fp16", "bf16", "off")
OPTIMIZERS: tuple[str, ...] = ("sgd", "adamw")
MODES: tuple[str, ...] = ("balanced", "max", "uniform")
METHODS: tuple[str, ...] = ("auto", "measure", "estimate")
FIT_KINDS: tuple[str, ...] = ("affine", "loglog")

#: CLI flags whose names differ from their JobSpec field (errors name the flag the user typed)
_FLAG_OF_FIELD = {"min_free_memory_fraction": "min-memory-fraction", "max_utilization_fraction": "max-utilization"}

#: Ultralytics' default share of available memory AutoBatch aims for (autobatch.py, fraction=0.60)
DEFAULT_FRACTION = 0.60
#: a GPU with less free memory than this share is someone else's: the seed's idle criterion
#: (Ultralytics ``select_device`` → ``GPUInfo.select_idle_gpu(min_memory_fraction=0.2)``); planner.busy
DEFAULT_MIN_FREE_MEMORY_FRACTION = 0.2
#: a GPU busier than this leaves a new job at most half of it, and every DDP step waits for that rank
#: (planner.busy derates the GPUs kept by their utilisation)
DEFAULT_MAX_UTILIZATION_FRACTION = 0.5


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """Everything that shapes a plan apart from the cluster."""

    model: str
    """built-in workload name (``resnet50``, ...) or ``package.module:factory``"""
    imgsz: int | None = None
    """square image side for image workloads (default: the workload's own)"""
    input_shape: tuple[int, ...] | None = None
    """per-sample input shape, e.g. ``(3, 224, 224)``; required for a user factory"""
    seq_len: int | None = None
    """sequence length for token workloads"""
    amp: AmpChoice = "auto"
    """mixed precision: ``auto`` takes bf16 where the GPU supports it, else fp16"""
    optimizer: OptimizerName = "sgd"
    """optimizer whose state is counted in memory: SGD with momentum or AdamW"""
    fraction: float = DEFAULT_FRACTION
    """share of each device's available memory a rank may plan to use, in (0, 1]"""
    mode: Mode = "balanced"
    """``balanced`` (speed- and memory-aware), ``max`` (each rank its own cap) or ``uniform`` (plain DDP)"""
    global_batch: int | None = None
    """samples per optimizer step over all ranks; None maximises throughput"""
    multiple_of: int = 1
    """every per-rank batch is a multiple of this"""
    min_batch: int = 1
    """a rank that cannot fit this many samples is excluded"""
    method: Method = "auto"
    """how profiles are made: measure on a real GPU, estimate on fake tensors, or auto (measure where possible)"""
    gpus: str = "all"
    """per node: ``all``, ``-1,-1`` (that many most idle GPUs) or explicit indices ``0,2``"""
    min_free_memory_fraction: float = DEFAULT_MIN_FREE_MEMORY_FRACTION
    """a GPU with less free memory than this share of its total is skipped as busy"""
    max_utilization_fraction: float = DEFAULT_MAX_UTILIZATION_FRACTION
    """a GPU busier than this utilisation is skipped (the GPUs kept are derated by theirs: planner.busy)"""
    fit: FitKind = "affine"
    """memory curve model"""

    def __post_init__(self) -> None:
        def bad(field: str, value: object, fix: str) -> ConfigError:
            flag = _FLAG_OF_FIELD.get(field, field.replace("_", "-"))
            return ConfigError(f"--{flag} {value!r} is invalid ({fix})")

        if not isinstance(self.model, str) or not self.model.strip():
            raise bad("model", self.model, "give a built-in workload name or package.module:factory")
        for name in ("imgsz", "seq_len"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise bad(name, value, "use a positive integer")
        if self.input_shape is not None and (
            not self.input_shape or any(isinstance(d, bool) or not isinstance(d, int) or d <= 0 for d in self.input_shape)
        ):
            raise bad("input_shape", self.input_shape, "use positive integers, e.g. 3,224,224")
        if self.amp not in AMP_CHOICES:
            raise bad("amp", self.amp, f"use one of {', '.join(AMP_CHOICES)}")
        if self.optimizer not in OPTIMIZERS:
            raise bad("optimizer", self.optimizer, f"use one of {', '.join(OPTIMIZERS)}")
        if self.mode not in MODES:
            raise bad("mode", self.mode, f"use one of {', '.join(MODES)}")
        if self.method not in METHODS:
            raise bad("method", self.method, f"use one of {', '.join(METHODS)}")
        if self.fit not in FIT_KINDS:
            raise bad("fit", self.fit, f"use one of {', '.join(FIT_KINDS)}")
        if isinstance(self.fraction, bool) or not isinstance(self.fraction, int | float) or not 0 < self.fraction <= 1:
            raise bad("fraction", self.fraction, "use a share of memory in (0, 1], e.g. 0.6")
        for name in ("min_free_memory_fraction", "max_utilization_fraction"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
                raise bad(name, value, "use a fraction in [0, 1]")
        for name in ("multiple_of", "min_batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad(name, value, "use an integer >= 1")
        if self.global_batch is not None:
            gb = self.global_batch
            if isinstance(gb, bool) or not isinstance(gb, int) or gb < 1:
                raise bad("global_batch", gb, "use a positive integer, or leave it out to maximise throughput")
            if gb % self.multiple_of:
                lower = gb // self.multiple_of * self.multiple_of
                sizes = f"{lower} or {lower + self.multiple_of}" if lower else f"{self.multiple_of}"
                raise bad(
                    "global_batch", gb, f"it must be a multiple of --multiple-of {self.multiple_of}: try {sizes}"
                )
        if not isinstance(self.gpus, str) or not self.gpus.strip():
            raise bad("gpus", self.gpus, "use all, -1,-1 or indices like 0,2")

    def amp_for(self, gpu: GpuSpec) -> str:
        """The AMP mode used on this GPU type: ``auto`` is bf16 where supported, else fp16.

        Raises:
            ConfigError: bf16 asked for on a GPU without bf16.
        """
        if self.amp == "auto":
            return "bf16" if gpu.supports_bf16 else "fp16"
        if self.amp == "bf16" and not gpu.supports_bf16:
            raise ConfigError(
                f"--amp bf16 asked for, but {gpu.name} has no bf16 support (use --amp auto or --amp fp16)"
            )
        return self.amp

    def to_json(self) -> dict:
        data = asdict(self)
        data["input_shape"] = list(self.input_shape) if self.input_shape is not None else None
        return data

    @classmethod
    def from_json(cls, data: dict) -> JobSpec:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"job has unknown fields {unknown} (known: {sorted(known)})")
        if "model" not in data:
            raise ConfigError("job lacks the field 'model' (regenerate the plan with batchplan plan)")
        values = dict(data)
        if values.get("input_shape") is not None:
            values["input_shape"] = tuple(values["input_shape"])
        return cls(**values)


def parse_input_shape(text: str) -> tuple[int, ...]:
    """``"3,224,224"`` (or ``3x224x224``) → ``(3, 224, 224)``; a clear error for anything else, empty parts
    included."""
    parts = [part.strip() for part in re.split(r"[,x]", text)]
    shape = tuple(int(part) for part in parts if part.isdigit())
    if not parts or len(shape) != len(parts) or any(d <= 0 for d in shape):
        raise ConfigError(f"--input-shape {text!r} is invalid (use positive integers like 3,224,224)")
    return shape
