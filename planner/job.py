"""The job being planned: which model, input, precision and optimizer, and how batches are to be chosen.

A ``JobSpec`` is validated once, here, whether it comes from CLI flags, a plan file or Python; every other
layer trusts it. ``job`` in plan.json is this record (``planner.codec``: every field, in order; a key it does
not know is an error, since a job option silently dropped would plan another job).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Literal, get_args

from planner.codec import Meta, forbid_unknown_keys
from planner.errors import FieldError
from torchkit.hardware.catalog import GpuSpec
from torchkit.step.budget import DEFAULT_FRACTION, memory_budget_bytes
from torchkit.step.fit import MemoryFitKind
from torchkit.step.options import OPTIMIZERS, AmpMode, OptimizerName

#: a GPU with less free memory than this share is someone else's: the seed's idle criterion
#: (Ultralytics ``select_device`` → ``GPUInfo.select_idle_gpu(min_memory_fraction=0.2)``); planner.probing.busy
DEFAULT_MIN_FREE_MEMORY_FRACTION = 0.2
#: a GPU busier than this leaves a new job at most half of it, and every DDP step waits for that rank
#: (planner.probing.busy derates the GPUs kept by their utilisation)
DEFAULT_MAX_UTILIZATION_FRACTION = 0.5

# The job's vocabulary, each written once: the CLI's choices and every check read these enums and Literals.
# An enum member is its string (``Mode.BALANCED == "balanced"``, JSON writes ``"balanced"``): plan.json and
# every comparison with a string keep working.


class Mode(str, Enum):
    """How per-rank batches are chosen (``planner.allocate``)."""

    BALANCED = "balanced"
    """speed- and memory-aware: the step time of the slowest rank is minimised"""
    MAX = "max"
    """each rank its own cap (per-device autobatch)"""
    UNIFORM = "uniform"
    """every rank the smallest cap (plain DDP)"""

    def __str__(self) -> str:
        return self.value


class AmpChoice(str, Enum):
    """Mixed precision asked for: ``auto`` is bf16 where the GPU supports it, else fp16; the others are
    ``torchkit.step.options.AmpMode`` (checked below)."""

    AUTO = "auto"
    FP16 = "fp16"
    BF16 = "bf16"
    OFF = "off"

    def __str__(self) -> str:
        return self.value


FitKind = MemoryFitKind

AMP_CHOICES: tuple[str, ...] = tuple(a.value for a in AmpChoice)
assert set(AMP_CHOICES) == {"auto", *get_args(AmpMode)}, "AmpChoice must be auto and torchkit's AmpMode"
MODES: tuple[str, ...] = tuple(m.value for m in Mode)
FIT_KINDS: tuple[str, ...] = get_args(FitKind)
#: a user factory's input dtypes: ``torchkit.workloads.INPUT_DTYPES``, named here without importing torch
InputDtype = Literal["float32", "float16", "bfloat16", "int64", "int32"]
INPUT_DTYPES: tuple[str, ...] = get_args(InputDtype)


class Method(str, Enum):
    """How a profile is made (``planner.obtain``): ``auto`` measures where the probe finds a free CUDA GPU
    of the type and estimates elsewhere, with a note."""

    AUTO = "auto"
    MEASURE = "measure"
    ESTIMATE = "estimate"

    def __str__(self) -> str:
        return self.value


METHODS: tuple[str, ...] = tuple(m.value for m in Method)

#: largest ``bucket_cap_mb`` accepted, MiB (1 TiB: one bucket for any model that fits a GPU)
MAX_BUCKET_CAP_MB = 2**20

#: bounds of the sizes a job may ask for, checked before any tensor is built (``--imgsz 2**31`` once ended in a
#: torch TypeError inside the input builder): far above any real training input, far below int64 overflow
MAX_IMAGE_SIDE = 16_384
"""largest ``imgsz``: 16,384² RGB is 805 M values a sample (aerial tiles are cut smaller)"""
MAX_INPUT_DIM = 2**24
"""largest dimension of ``input_shape`` (16 M: a 17-minute 16 kHz waveform)"""
MAX_SAMPLE_ELEMENTS = 2**40
"""most values in one sample of ``input_shape``: times a batch of 65,536 and 8 bytes a value, a byte count
still fits an int64"""
MAX_SEQ_LEN = 2**20
"""longest ``seq_len`` (1 M tokens, the longest contexts trained)"""
MAX_VOCAB_SIZE = 2**24
"""largest ``vocab_size`` (16 M; tokenizers have under 300 k)"""
DEFAULT_USER_CODE_TIMEOUT_S = 300.0
"""a factory builds its model in seconds (the largest library models in under a minute on a CPU); one that
hangs is stopped after five minutes"""
MAX_USER_CODE_TIMEOUT_S = 86_400.0
"""the longest ``user_code_timeout_s``: a day"""
MAX_BATCH_ARGUMENT = 65_536
"""largest ``multiple_of`` and ``min_batch``: the planner never gives a rank more (``MAX_PLANNED_BATCH``)"""


def _size_over_its_limit(job: JobSpec) -> tuple[str, object, str] | None:
    """``(field, value, fix)`` of the first size over its bound above, or None."""
    for name, limit in (
        ("imgsz", MAX_IMAGE_SIDE),
        ("seq_len", MAX_SEQ_LEN),
        ("vocab_size", MAX_VOCAB_SIZE),
        ("multiple_of", MAX_BATCH_ARGUMENT),
        ("min_batch", MAX_BATCH_ARGUMENT),
    ):
        value = getattr(job, name)
        if value is not None and value > limit:
            return name, value, f"at most {limit}"
    timeout = job.user_code_timeout_s
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout <= MAX_USER_CODE_TIMEOUT_S
    ):
        return "user_code_timeout_s", timeout, f"seconds in (0, {MAX_USER_CODE_TIMEOUT_S:g}]"
    if job.input_shape is not None:
        if max(job.input_shape) > MAX_INPUT_DIM:
            return "input_shape", job.input_shape, f"each dimension at most {MAX_INPUT_DIM}"
        if math.prod(job.input_shape) > MAX_SAMPLE_ELEMENTS:
            return "input_shape", job.input_shape, f"at most {MAX_SAMPLE_ELEMENTS} values a sample"
    return None


class JobFieldError(FieldError):
    """A ``JobSpec`` field has a value that cannot be planned with (``planner.errors.FieldError``)."""


@forbid_unknown_keys
@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """Everything that shapes a plan apart from the cluster."""

    model: str
    """built-in workload name (``resnet50``, ...), a library model (``timm:NAME``, ``torchvision:NAME``,
    ``hf:ARCH``, ``ultralytics:FILE.yaml``) or ``package.module:factory``"""
    imgsz: int | None = None
    """square image side for image workloads (default: the workload's own)"""
    input_shape: Annotated[
        tuple[int, ...] | None, Meta(description="be a list of positive integers or null")
    ] = None
    """per-sample input shape, e.g. ``(3, 224, 224)``; required for a user factory"""
    seq_len: int | None = None
    """sequence length for token workloads"""
    vocab_size: int | None = None
    """a user factory's input is integer token ids in ``[0, vocab_size)``"""
    input_dtype: InputDtype | None = None
    """a user factory's input dtype (one of ``INPUT_DTYPES``; default float32, int64 with ``vocab_size``)"""
    amp: AmpChoice = AmpChoice.AUTO
    """mixed precision: ``auto`` takes bf16 where the GPU supports it, else fp16"""
    optimizer: OptimizerName = "sgd"
    """optimizer whose state is counted in memory: SGD with momentum or AdamW"""
    fraction: float = DEFAULT_FRACTION
    """share of each device's available memory a rank may plan to use, in (0, 1]"""
    mode: Mode = Mode.BALANCED
    """``balanced`` (speed- and memory-aware), ``max`` (each rank its own cap) or ``uniform`` (plain DDP)"""
    global_batch: int | None = None
    """samples per optimizer step over all ranks; None maximises throughput"""
    multiple_of: int = 1
    """every per-rank batch is a multiple of this"""
    min_batch: int = 1
    """a rank that cannot fit this many samples is excluded"""
    method: Method = Method.AUTO
    """how profiles are made: measure on a real GPU, estimate on fake tensors, or auto (measure where the GPU's
    own process can use it with CUDA, else estimate: ``planner.obtain.method``)"""
    gpus: str = "all"
    """per node: ``all``, ``-1,-1`` (that many most idle GPUs) or explicit indices ``0,2``"""
    min_free_memory_fraction: float = DEFAULT_MIN_FREE_MEMORY_FRACTION
    """a GPU with less free memory than this share of its total is skipped as busy"""
    max_utilization_fraction: float = DEFAULT_MAX_UTILIZATION_FRACTION
    """a GPU busier than this utilisation is skipped (the GPUs kept are derated by theirs: planner.probing.busy)"""
    fit: FitKind = "affine"
    """memory curve model"""
    channels_last: bool = False
    """the training script keeps model and batch in NHWC memory format (``torch.channels_last``): convolutions
    then skip (16-bit, TF32) or pay (fp32 on CUDA cores) the layout transposes, which the estimated step
    time counts"""
    user_code_timeout_s: float = DEFAULT_USER_CODE_TIMEOUT_S
    """seconds a ``package.module:factory`` may take to import and build its model, in the driver and in each
    probe, before the run stops it with an error (``planner.obtain.time_limit``); shapes no plan"""
    bucket_cap_mb: float | None = None
    """DDP's ``bucket_cap_mb`` in the training script, MiB (None: DDP's default, 25 MiB with a 1 MiB first
    bucket): how the gradients are bucketed for the synchronisation model (``torchkit.estimate.ddp_sync``)"""

    def __post_init__(self) -> None:
        def bad(field: str, value: object, fix: str) -> JobFieldError:
            return JobFieldError(field, f"`{field}` {value!r} is invalid ({fix})")

        if not isinstance(self.model, str) or not self.model.strip():
            raise bad("model", self.model, "give a built-in workload name or package.module:factory")
        for name in ("imgsz", "seq_len", "vocab_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise bad(name, value, "use a positive integer")
        if self.input_shape is not None and (
            not self.input_shape
            or any(isinstance(d, bool) or not isinstance(d, int) or d <= 0 for d in self.input_shape)
        ):
            raise bad("input_shape", self.input_shape, "use positive integers, e.g. 3,224,224")
        if self.input_dtype is not None and self.input_dtype not in INPUT_DTYPES:
            raise bad("input_dtype", self.input_dtype, f"use one of {', '.join(INPUT_DTYPES)}")
        if self.amp not in AMP_CHOICES:
            raise bad("amp", self.amp, f"use one of {', '.join(AMP_CHOICES)}")
        object.__setattr__(self, "amp", AmpChoice(self.amp))
        if self.optimizer not in OPTIMIZERS:
            raise bad("optimizer", self.optimizer, f"use one of {', '.join(OPTIMIZERS)}")
        if self.mode not in MODES:
            raise bad("mode", self.mode, f"use one of {', '.join(MODES)}")
        object.__setattr__(self, "mode", Mode(self.mode))
        if self.method not in METHODS:
            raise bad("method", self.method, f"use one of {', '.join(METHODS)}")
        object.__setattr__(self, "method", Method(self.method))
        if self.fit not in FIT_KINDS:
            raise bad("fit", self.fit, f"use one of {', '.join(FIT_KINDS)}")
        if (
            isinstance(self.fraction, bool)
            or not isinstance(self.fraction, int | float)
            or not 0 < self.fraction <= 1
        ):
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
                raise bad(
                    "global_batch", gb, "use a positive integer, or leave it out to maximise throughput"
                )
            if gb % self.multiple_of:
                lower = gb // self.multiple_of * self.multiple_of
                sizes = f"{lower} or {lower + self.multiple_of}" if lower else f"{self.multiple_of}"
                raise bad(
                    "global_batch",
                    gb,
                    f"it must be a multiple of `multiple_of` {self.multiple_of}: try {sizes}",
                )
        if not isinstance(self.gpus, str) or not self.gpus.strip():
            raise bad("gpus", self.gpus, "use all, -1,-1 or indices like 0,2")
        if not isinstance(self.channels_last, bool):
            raise bad("channels_last", self.channels_last, "use true or false")
        too_large = _size_over_its_limit(self)
        if too_large is not None:
            raise bad(*too_large)
        cap = self.bucket_cap_mb
        if cap is not None and (
            isinstance(cap, bool) or not isinstance(cap, int | float) or not 0 < cap <= MAX_BUCKET_CAP_MB
        ):
            raise bad(
                "bucket_cap_mb",
                cap,
                f"use DDP's bucket_cap_mb in MiB, > 0 and at most {MAX_BUCKET_CAP_MB}, e.g. 25",
            )

    def memory_budget_bytes(self, available_bytes: int) -> int:
        """What a rank may plan to use of a device with ``available_bytes`` free: ``fraction`` of it."""
        return memory_budget_bytes(self.fraction, available_bytes)

    def amp_for(self, gpu: GpuSpec) -> str:
        """The AMP mode used on this GPU type: ``auto`` is bf16 where supported, else fp16.

        Raises:
            JobFieldError: bf16 asked for on a GPU without bf16.
        """
        if self.amp == AmpChoice.AUTO:
            return "bf16" if gpu.supports_bf16 else "fp16"
        if self.amp == AmpChoice.BF16 and not gpu.supports_bf16:
            raise JobFieldError(
                "amp",
                f"`amp` bf16 asked for, but {gpu.name} has no bf16 support (use `amp` auto or `amp` fp16)",
            )
        return self.amp.value
