"""Loss weights that make DDP with unequal per-rank batches compute the gradient of one big batch.

Pure Python (no torch): the planner writes these weights into ``plan.json`` and the training script reads
them back, so both must agree on one formula, and the planner must not import torch to get it.

Why ``w_i = b_i · W / B``
-------------------------

Take ``W`` ranks; rank ``i`` holds ``b_i`` samples of a step and ``B = Σ_i b_i``. The usual rank loss is
the mean over its own samples, ``L_i = (1/b_i) Σ_{s∈i} ℓ_s``. DDP all-reduces the gradients and divides
by ``W`` (``sum / world_size``), so the gradient every rank ends up with is

    g = (1/W) Σ_i ∇L_i = (1/W) Σ_i (1/b_i) Σ_{s∈i} ∇ℓ_s .

A sample on rank ``i`` counts ``1/(W·b_i)``: with equal batches that is ``1/B`` for everyone, but with
``b = 5, 3, 8`` a sample on the 3-sample rank counts 8/3 times as much as one on the 8-sample rank. The
gradient of the mean loss over the whole step is instead ``∇L = (1/B) Σ_s ∇ℓ_s``. Scaling each rank's
loss by ``w_i`` gives

    (1/W) Σ_i w_i (1/b_i) Σ_{s∈i} ∇ℓ_s ,

which equals ``∇L`` for every split exactly when ``w_i / (W·b_i) = 1/B``, i.e. ``w_i = b_i · W / B``.
With equal batches ``b_i = B/W`` and ``w_i = 1``: plain DDP is the special case. The weights average to
one (``Σ_i w_i = W``), so a learning rate tuned for the mean loss over ``B`` samples is still right.

This is fix (a) of the three known ones; (b) is a DDP comm hook that multiplies each bucket by ``b_i/B`` and
all-reduces a SUM with no division by ``W`` (Cannikin, Middleware 2024, arXiv 2402.05302: its
``proportional_allreduce_hook`` in github.com/chengyinie/hetero_adaptdl), (c) is summing the losses and
multiplying the gradients by ``W / sample_size`` with ``sample_size`` all-reduced (fairseq's trainer, which
HetSeq, AAAI 2021, github.com/yifding/hetseq, runs on mixed nodes). They give the same gradient; (a) needs
no change to DDP.

Caveats
-------

* **Token-level (or pixel-level) losses.** The derivation assumes each rank's loss is a mean over its
  *samples*. A language-model loss that is a mean over *tokens* weighs each rank by its token count,
  which differs between ranks even with equal batches (transformers #34242). Either reduce to one value
  per sample first (mean over that sample's tokens, then :func:`loss_weight`), or, to weigh every token
  equally over the whole step, take the **sum** over the rank's tokens and multiply by
  :func:`sum_loss_scale` ``(W, T)`` where ``T`` is the step's token count all-reduced over ranks.
* **BatchNorm.** Plain ``BatchNorm`` normalises with the statistics of the rank's own ``b_i`` samples, so a
  rank with a small batch gets noisier statistics and the result is not the big-batch computation. Use
  ``torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)``: it gathers each rank's count with its
  statistics and handles unequal batches.
* **Gradient accumulation.** With ``accumulate = k`` micro-steps per optimizer step and the same per-rank
  batch in every micro-step (what ``plan.json`` describes), use the same ``w_i`` in every micro-step and
  divide by ``k`` as in single-process accumulation: ``loss = w_i · L_i / k``. The summed gradient is
  then that of the mean over all ``k · B`` samples, with or without ``DistributedDataParallel.no_sync``
  on the first ``k - 1`` micro-steps. If micro-steps had different batches the weights would need the
  optimizer step's total instead of ``B``; the planner never produces that.

Which rule applies (``LossReduction``, ``LossRule``)
----------------------------------------------------

The weight is right only for a loss that is a **mean over the rank's own samples** (``LossReduction.MEAN``:
torch's default ``reduction="mean"``, a Hugging Face model whose loss ignores ``num_items_in_batch``). A
loss that already weighs every sample of the step the same needs no per-rank weight, and ``w_i`` on top of
it would weigh each sample by ``b_i`` twice: a **sum** over the rank's samples (``LossReduction.SUM``: DDP's
average is then ``1/W`` of the sum over all samples, the same factor for every sample), or a sum divided by
a **count taken over all ranks** (``LossReduction.GLOBAL_MEAN``: ``sum_loss_scale``, or Hugging Face's
``num_items_in_batch`` with ``average_tokens_across_devices``, the Trainer's default for causal LMs since
transformers 4.54). A training integration (``planner.integrations``) decides the reduction from what its
framework does for the model, states it (``LossRule.line``) and applies ``LossRule.factor`` once: the
weight, or 1.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from planner.errors import ConfigError
from planner.plan.derived import loss_weight_of

__all__ = ["LossReduction", "LossRule", "loss_weight", "loss_weights", "sum_loss_scale"]


def positive_int(value: object, name: str) -> int:
    """``value`` as an int (numpy integers accepted), or ConfigError; bools and floats are rejected."""
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}") from None
    if number <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {number}")
    return number


def loss_weight(rank_batch: int, world_size: int, step_batch: int) -> float:
    """The factor a rank multiplies its mean loss by: ``rank_batch · world_size / step_batch``.

    Args:
        rank_batch: ``b_i``, the samples this rank takes per (micro-)step.
        world_size: ``W``, the number of ranks.
        step_batch: ``B``, the samples of one (micro-)step over all ranks (``Σ_i b_i``).

    Raises:
        ConfigError: a non-positive or non-integer argument, or a ``rank_batch`` that leaves fewer than one
            sample for each of the other ranks (every DDP rank must run forward on at least one sample).
    """
    rank_batch = positive_int(rank_batch, "rank_batch")
    world_size = positive_int(world_size, "world_size")
    step_batch = positive_int(step_batch, "step_batch")
    if step_batch < world_size:
        raise ConfigError(
            f"step_batch={step_batch} is smaller than world_size={world_size}: every rank needs at least one "
            f"sample per step (raise the global batch or use fewer ranks)"
        )
    others = world_size - 1
    if rank_batch > step_batch - others:
        raise ConfigError(
            f"rank_batch={rank_batch} does not fit in step_batch={step_batch} with {others} other rank(s) "
            f"holding at least one sample each (rank_batch ≤ {step_batch - others}; step_batch is the sum of "
            f"all ranks' batches)"
        )
    return loss_weight_of(rank_batch, world_size, step_batch)


def loss_weights(batches: Sequence[int]) -> tuple[float, ...]:
    """Every rank's :func:`loss_weight`, in rank order, for per-rank batches ``batches`` (their sum is B)."""
    if len(batches) == 0:
        raise ConfigError("batches is empty: a plan needs at least one rank")
    checked = [positive_int(b, f"batches[{i}]") for i, b in enumerate(batches)]
    step_batch = sum(checked)
    return tuple(loss_weight(b, len(checked), step_batch) for b in checked)


def sum_loss_scale(world_size: int, global_count: int) -> float:
    """Factor for a **sum**-reduced rank loss so DDP's average is the mean over ``global_count`` items.

    For token-level losses: ``loss = loss_tokens.sum() * sum_loss_scale(W, T)`` where ``T`` is the number
    of tokens (or samples) in the whole step, all-reduced over ranks. DDP divides the summed gradients by
    ``W``, so the result is ``(1/T) Σ_tokens ∇ℓ``: every token of the step counts the same. Returns
    ``world_size / global_count``.
    """
    world_size = positive_int(world_size, "world_size")
    global_count = positive_int(global_count, "global_count")
    return world_size / global_count


class LossReduction(str, Enum):
    """How a rank's loss reduces over its samples: what decides whether it takes the weight ``b_i·W/B``."""

    MEAN = "mean"
    """a mean over this rank's own samples (or over its own tokens): DDP's average needs ``w_i = b_i·W/B``"""
    SUM = "sum"
    """a sum over this rank's samples: every sample already counts the same; no per-rank weight"""
    GLOBAL_MEAN = "global-mean"
    """a sum divided by a count taken over all ranks (``sum_loss_scale``; Hugging Face's ``num_items_in_batch``
    with ``average_tokens_across_devices``): every sample already counts the same; no per-rank weight"""

    def __str__(
        self,
    ) -> str:  # the value, in f-strings too, on every Python (3.11 changed a mixed-in enum's format)
        return self.value

    @classmethod
    def parse(cls, value: LossReduction | str, name: str = "loss_reduction") -> LossReduction:
        """``value`` as a reduction, or ConfigError naming the choices."""
        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(repr(member.value) for member in cls)
            raise ConfigError(f"{name}={value!r} is not a loss reduction (choose {choices})") from None

    @property
    def weighted(self) -> bool:
        """Whether the rank's loss takes the weight ``b_i·W/B``."""
        return self is LossReduction.MEAN

    @property
    def meaning(self) -> str:
        """The reduction in words (for logs and summaries)."""
        return {
            LossReduction.MEAN: "a mean over the rank's own samples",
            LossReduction.SUM: "a sum over the rank's samples",
            LossReduction.GLOBAL_MEAN: "divided by a count over all ranks",
        }[self]

    @property
    def consequence(self) -> str:
        """What the rank's loss takes, in words."""
        return "loss × b_i·W/B" if self.weighted else "no per-rank weight"


@dataclass(frozen=True, kw_only=True)
class LossRule:
    """The per-rank loss rule a training integration applies: the reduction, and why it is that one."""

    reduction: LossReduction
    """how the rank's loss reduces over its samples"""
    why: str
    """what the framework does with this model's loss that decided it (or why the user declares it)"""
    declared: bool = False
    """the user named the reduction (the framework leaves the loss to the script, or the user overrode the
    integration's decision)"""

    def factor(self, rank_batch: int, world_size: int, step_batch: int) -> float:
        """What the rank multiplies its loss by: :func:`loss_weight` under ``MEAN``, else 1 (never both)."""
        if self.reduction.weighted:
            return loss_weight(rank_batch, world_size, step_batch)
        return 1.0

    def short(self) -> str:
        """The rule and what it applies, for a summary line."""
        how = "declared" if self.declared else "decided"
        return f"loss rule {self.reduction.value} ({how}): {self.reduction.consequence}"

    def line(self) -> str:
        """The rule, what it applies and why, for the log."""
        return f"{self.short()}; {self.reduction.meaning}: {self.why}"
