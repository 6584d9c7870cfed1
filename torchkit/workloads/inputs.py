"""The per-sample input a user describes (shape, dtype, token range), batches of it, and the losses of models
that bring none.

Inputs are described, never guessed: ``--input-shape 3,224,224`` is a float image, ``--seq-len 128
--vocab-size 30000`` is 128 integer token ids in ``[0, 30000)``, ``--input-shape 16,40 --input-dtype
bfloat16`` a half-precision feature matrix. Every batch is built with ``torch.rand*``/``torch.randint`` so
that fake tensors can stand in for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from torchkit.errors import WorkloadError

FLOAT_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
INT_DTYPES: dict[str, torch.dtype] = {"int64": torch.int64, "int32": torch.int32}
INPUT_DTYPES: tuple[str, ...] = (*FLOAT_DTYPES, *INT_DTYPES)
"""what ``--input-dtype`` accepts"""

USER_INPUT_LOSS = "output.float().pow(2).mean()"
"""the loss of a model that brings none: every output element gets a gradient, no labels needed"""


@dataclass(frozen=True, kw_only=True)
class InputSpec:
    """One sample's input tensor: shape, dtype and, for integer inputs, the range of values."""

    shape: tuple[int, ...]
    """per-sample shape, e.g. ``(3, 224, 224)`` or ``(seq_len,)``"""
    dtype: str = "float32"
    """one of ``INPUT_DTYPES``"""
    vocab_size: int | None = None
    """integer inputs are drawn from ``[0, vocab_size)`` (token ids); required for integer dtypes"""

    def __post_init__(self) -> None:
        if not self.shape or any(isinstance(d, bool) or int(d) <= 0 for d in self.shape):
            raise WorkloadError(
                f"input shape {self.shape} must be positive dimensions (e.g. --input-shape 3,224,224)"
            )
        if self.dtype not in INPUT_DTYPES:
            raise WorkloadError(
                f"input dtype {self.dtype!r} is unknown (use one of {', '.join(INPUT_DTYPES)})"
            )
        if self.dtype in INT_DTYPES and (self.vocab_size is None or self.vocab_size < 1):
            raise WorkloadError(
                f"integer inputs ({self.dtype}) need their range: give --vocab-size N (token ids in [0, N))"
            )
        if self.dtype in FLOAT_DTYPES and self.vocab_size is not None:
            raise WorkloadError(
                f"--vocab-size {self.vocab_size} describes integer token ids, but the input dtype is {self.dtype} "
                "(use --input-dtype int64, or drop --vocab-size)"
            )

    @property
    def is_tokens(self) -> bool:
        return self.dtype in INT_DTYPES

    def make(self, batch: int) -> torch.Tensor:
        """A random batch ``[batch, *shape]`` of this input."""
        if self.is_tokens:
            return torch.randint(
                0, int(self.vocab_size or 1), (batch, *self.shape), dtype=INT_DTYPES[self.dtype]
            )
        return torch.randn(batch, *self.shape, dtype=FLOAT_DTYPES[self.dtype])

    def describe(self) -> str:
        shape = ",".join(str(d) for d in self.shape)
        if self.is_tokens:
            return f"{self.dtype} token ids [{shape}] in [0, {self.vocab_size})"
        return f"{self.dtype} [{shape}]"

    def config(self) -> str:
        """What the fingerprint needs beyond the shape."""
        return f"dtype={self.dtype},vocab={self.vocab_size}"


def input_spec(
    *,
    input_shape: tuple[int, ...] | None,
    seq_len: int | None,
    vocab_size: int | None,
    input_dtype: str | None,
    model: str,
) -> InputSpec:
    """The ``InputSpec`` of a user model from its flags: ``--seq-len N`` is ``--input-shape N`` of token ids.

    Raises:
        WorkloadError: no shape at all, both a shape and a sequence length, token flags without a range.
    """
    if seq_len is not None and input_shape is not None:
        raise WorkloadError(f"model {model!r}: give --seq-len or --input-shape, not both")
    if seq_len is not None:
        if vocab_size is None:
            raise WorkloadError(
                f"model {model!r}: --seq-len {seq_len} means integer token ids; give their range with --vocab-size N"
            )
        input_shape = (int(seq_len),)
    if input_shape is None:
        raise WorkloadError(
            f"model {model!r} needs its per-sample input shape (use --input-shape C,H,W for float tensors, e.g. "
            "3,224,224, or --seq-len N --vocab-size V for token ids)"
        )
    dtype = input_dtype or ("int64" if vocab_size is not None else "float32")
    return InputSpec(shape=tuple(int(d) for d in input_shape), dtype=dtype, vocab_size=vocab_size)


def first_tensor(output: Any) -> torch.Tensor:
    """The first tensor in a model's output (a tensor, tuple/list, dict or ``ModelOutput``)."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping):
        values = list(output.values())
    elif isinstance(output, tuple | list):
        values = list(output)
    else:
        values = []
    for value in values:
        if value is None:
            continue
        try:
            return first_tensor(value)
        except TypeError:
            continue
    raise TypeError(f"the model's output ({type(output).__name__}) holds no tensor")


def output_loss(output: Any, targets: Any) -> torch.Tensor:
    """``output.float().pow(2).mean()`` of the model's first output tensor (``USER_INPUT_LOSS``)."""
    return first_tensor(output).float().pow(2).mean()


def model_loss(output: Any, targets: Any) -> torch.Tensor:
    """The loss a model computed itself (Hugging Face models given ``labels`` return ``output.loss``)."""
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if loss is None:
        raise WorkloadError("the model returned no loss although it was given labels")
    return loss


def classification_loss(output: Any, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of ``[B, classes]`` logits (the first output tensor) against class ids."""
    return torch.nn.functional.cross_entropy(first_tensor(output), targets)
