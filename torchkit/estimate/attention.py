"""Scaled-dot-product attention as a CUDA GPU runs it, inside a fake pass that runs on CPU tensors.

Why: ``F.scaled_dot_product_attention`` picks a kernel per device. On CPU, flash attention refuses
``dropout_p > 0`` (``sdp_utils_cpp.cpp``: ``check_for_dropout``), so with attention dropout (the default of
``nn.TransformerEncoderLayer``, HF GPT-2's ``attn_pdrop`` and BERT's ``attention_probs_dropout_prob``, 0.1)
the fake pass takes the math path: it materialises and saves the ``s×s`` softmax probabilities, the dropout
mask and the dropped probabilities per head and layer, and moves them through memory. A CUDA GPU takes
the flash or the memory-efficient kernel for the same call, which keep none of that. Without this module a
GPT-2 at sequence 1024 came out 2.4-3× too large and ~2.4× too slow on every GPU.

What a CUDA target gets (:func:`cuda_attention`, used by the estimator when ``target="cuda"``): every call of
``torch.nn.functional.scaled_dot_product_attention`` (and so of the modules that call it:
``nn.MultiheadAttention`` with ``need_weights=False`` as ``nn.TransformerEncoderLayer`` calls it, HF's "sdpa"
attention, timm's fused attention) is replaced for the duration of the pass by the kernel CUDA's dispatcher
would pick (:func:`cuda_sdpa_backend`; PyTorch ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``,
priority flash → memory-efficient → math):

* **flash** (FlashAttention-2; Dao 2023, arXiv:2307.08691): fp16/bf16, no ``attn_mask``, head dim ≤ 256;
* **memory-efficient** (xFormers' cutlass kernel, Rabe & Staats 2021, arXiv:2112.05682): fp32/fp16/bf16,
  an additive ``attn_mask`` (a boolean one is first turned into a float bias of the query dtype,
  ``convert_boolean_attn_mask``), head dim a multiple of 8 (16-bit) or 4 (fp32);
* **math** otherwise (non-4-D inputs, grouped-query attention with fewer key heads, a mask that needs a
  gradient, unaligned head dims): ``aten._scaled_dot_product_attention_math``, as CUDA runs it too.

Flash and memory-efficient are accounted alike (the estimate is priced for many GPUs, and which of the two
runs depends on the card: flash needs compute capability ≥ 8.0):

* **saved for backward**: q, k, v (already alive as the projections' outputs), the output, the row
  logsumexp ``(b, h, s_q)`` in fp32 (FA-2 Algorithm 1 line 12; memory-efficient pads ``s_q`` to 32, ≤ 124
  bytes per row group more), the mask if any, and with dropout the Philox RNG state — seed and offset, two
  int64 (16 bytes; ``RNG_STATE_BYTES``) — from which backward regenerates the dropout mask (FA-2 §3.1.1);
  no ``s×s`` tensor;
* **backward temporaries**: dq, dk, dv and FA-2's fp32 dq accumulator (``dq_accum`` in ``flash_api.cpp``
  ``mha_bwd``), freed when the kernel returns;
* **FLOPs**: torch's ``sdpa_flop_count`` / ``sdpa_backward_flop_count`` (4·b·h·s_q·s_k·d forward; backward
  recomputes the scores: 2.5× the forward), halved for causal attention (the kernels skip the masked half);
* **bytes moved**: the kernel's inputs and outputs only (IO-aware: the ``s×s`` scores stay in SRAM).

The fused kernel is run as CPU's flash kernel with dropout 0 (``aten._scaled_dot_product_flash_attention_for_cpu``
and its backward, which have the same inputs and outputs), so the tracker sees exactly those tensors and
:mod:`torchkit.estimate.op_costs` prices them as attention kernels. Dropout changes no shape and, in these
kernels, adds only the RNG state: a model with attention dropout 0.1 and the same with 0.0 estimate the same
memory within ``RNG_STATE_BYTES`` per attention call.

A CPU target (``target="cpu"``) leaves the call alone: the fake pass is then what a real CPU step does,
which is what the CPU ground truth checks.

Known limitations: the replacement is of the ``torch.nn.functional`` attribute (a dispatch mode sees the
call only after it has been decomposed); code that imported the function object before the pass
(``from torch.nn.functional import scaled_dot_product_attention``) or calls ``torch._C._nn`` directly keeps
CPU's path. cuDNN attention (opt-in on Hopper) saves the same set. Nested tensors are not modelled.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

AttentionTarget = Literal["cuda", "cpu"]
TARGETS: tuple[str, ...] = ("cuda", "cpu")
SdpaBackend = Literal["flash", "efficient", "math"]

RNG_STATE_BYTES = 16
"""Philox seed + offset that CUDA's flash / memory-efficient kernels save for backward when dropout is on
(two int64; ``rng_state`` of ``mha_fwd`` in FlashAttention's ``flash_api.cpp``)"""
FLASH_MAX_HEAD_DIM = 256
"""FlashAttention-2 supports head dims up to 256 (``check_head_dim_size_flash`` in sdp_utils.cpp)"""


def cuda_sdpa_backend(
    *,
    dtype_bits: int,
    head_dim_qk: int,
    head_dim_v: int,
    ndim: int,
    has_mask: bool,
    mask_needs_grad: bool,
    gqa: bool,
) -> SdpaBackend:
    """The kernel CUDA's SDPA dispatcher picks (see the module docstring for the rules and their source).

    ``dtype_bits``: 16 for fp16/bf16, 32 for fp32 (64: math); ``gqa``: fewer key/value heads than query
    heads."""
    if ndim != 4 or gqa or mask_needs_grad or dtype_bits not in (16, 32):
        return "math"
    if dtype_bits == 16 and not has_mask and head_dim_qk == head_dim_v and head_dim_qk <= FLASH_MAX_HEAD_DIM:
        return "flash"
    alignment = 8 if dtype_bits == 16 else 4
    if head_dim_qk % alignment == 0 and head_dim_v % alignment == 0:
        return "efficient"
    return "math"


@dataclass
class AttentionLedger:
    """What the CUDA model did during one pass: calls per backend, and how many had dropout."""

    calls: Counter = field(default_factory=Counter)
    dropout_calls: int = 0

    @property
    def total(self) -> int:
        return sum(self.calls.values())


def _autocast_dtype(torch: Any) -> Any:
    """The dtype CUDA autocast would run SDPA in (it is on autocast's lower-precision list), or None."""
    if torch.is_autocast_enabled("cpu"):
        return torch.get_autocast_dtype("cpu")
    return None


def _make_fused_function(torch: Any) -> Any:
    class FusedAttention(torch.autograd.Function):
        """Flash / memory-efficient attention: saves q, k, v, out, logsumexp (+ mask, + RNG state)."""

        @staticmethod
        def forward(
            ctx: Any, q: Any, k: Any, v: Any, mask: Any, dropout_p: float, is_causal: bool, scale: Any
        ) -> Any:
            out, logsumexp = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, is_causal, attn_mask=mask, scale=scale
            )
            rng_state = torch.empty(RNG_STATE_BYTES // 8, dtype=torch.int64) if dropout_p > 0 else None
            ctx.save_for_backward(q, k, v, out, logsumexp, mask, rng_state)
            ctx.is_causal, ctx.scale = is_causal, scale
            return out

        @staticmethod
        def backward(ctx: Any, grad_out: Any) -> tuple:
            q, k, v, out, logsumexp, mask, _rng_state = ctx.saved_tensors
            dq_accum = torch.empty(q.shape, dtype=torch.float32)  # FA-2's fp32 dQ accumulator
            dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad_out, q, k, v, out, logsumexp, 0.0, ctx.is_causal, attn_mask=mask, scale=ctx.scale
            )
            del dq_accum
            return dq, dk, dv, None, None, None, None

    return FusedAttention


def _cuda_sdpa(torch: Any, ledger: AttentionLedger, fused: Any) -> Any:
    def scaled_dot_product_attention(
        query: Any,
        key: Any,
        value: Any,
        attn_mask: Any = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> Any:
        dtype = _autocast_dtype(torch)
        if dtype is not None and query.is_floating_point():
            query, key, value = (t.to(dtype) for t in (query, key, value))
        gqa = query.dim() == 4 and key.dim() == 4 and query.shape[1] != key.shape[1]
        backend = cuda_sdpa_backend(
            dtype_bits=query.element_size() * 8,
            head_dim_qk=int(query.shape[-1]),
            head_dim_v=int(value.shape[-1]),
            ndim=min(query.dim(), key.dim(), value.dim()),
            has_mask=attn_mask is not None,
            mask_needs_grad=bool(attn_mask is not None and attn_mask.requires_grad),
            gqa=gqa,
        )
        ledger.calls[backend] += 1
        ledger.dropout_calls += dropout_p > 0
        if backend == "math":
            return torch.ops.aten._scaled_dot_product_attention_math(
                query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
            )[0]
        if attn_mask is not None and attn_mask.dtype == torch.bool:  # convert_boolean_attn_mask
            attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype).masked_fill(
                attn_mask.logical_not(), float("-inf")
            )
        elif attn_mask is not None:
            attn_mask = attn_mask.to(query.dtype)
        return fused.apply(query, key, value, attn_mask, float(dropout_p), bool(is_causal), scale)

    return scaled_dot_product_attention


@contextlib.contextmanager
def cuda_attention() -> Iterator[AttentionLedger]:
    """Within the block, ``torch.nn.functional.scaled_dot_product_attention`` runs as CUDA's kernel would
    (module docstring); yields the ledger of calls. Not thread-safe (it swaps a module attribute); the
    estimator runs one fake pass at a time per process."""
    import torch
    import torch.nn.functional as F  # noqa: N812 (torch's convention)

    ledger = AttentionLedger()
    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = _cuda_sdpa(torch, ledger, _make_fused_function(torch))
    try:
        yield ledger
    finally:
        F.scaled_dot_product_attention = original


@contextlib.contextmanager
def attention_as(target: str) -> Iterator[AttentionLedger]:
    """``cuda_attention()`` for a CUDA target; for a CPU target an empty ledger and CPU's own kernels."""
    if target == "cuda":
        with cuda_attention() as ledger:
            yield ledger
    else:
        yield AttentionLedger()
