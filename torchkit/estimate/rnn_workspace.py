"""The workspace of an LSTM layer, which fake tensors report as empty.

``nn.LSTM`` on CPU tensors (fake ones included) runs oneDNN's ``mkldnn_rnn_layer``, whose forward returns a
workspace saved for the backward: the gates and states of every time step, ~15 floats per (step, sample,
hidden unit), the LSTM's largest activation. Its meta kernel returns ``torch.empty(0)``, so an estimate
without this module saw almost no activation memory and planned batches ~10x too large.

oneDNN sizes the workspace from the layer's dimensions (``rnn_utils::set_offsets``: page-aligned gate and
state buffers with padded leading dimensions). Rather than re-deriving that formula, :func:`workspace_bytes`
asks oneDNN: it runs the real layer for 1 and 2 steps on a few dozen samples (weights zero) and
extrapolates, the size being affine in steps × samples, samples and steps. :class:`RnnWorkspaceMode` puts
a fake workspace of that size in place of the empty one during the fake pass.

Known limitations: on CUDA the layer runs cuDNN, whose reserve space is of the same kind (gates and
states per step) but not byte-identical; bidirectional and projected LSTMs are sized per direction call
as PyTorch issues them.
"""

from __future__ import annotations

import functools
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

_FORWARD = "mkldnn_rnn_layer"


@functools.lru_cache(maxsize=64)
def _measured_bytes(
    steps: int, batch: int, in_features: int, hidden: int, has_biases: bool, dtype: Any
) -> int:
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        gates = 4 * hidden
        x = torch.empty(steps, batch, in_features, dtype=dtype).normal_()
        weights = [torch.zeros(gates, in_features, dtype=dtype), torch.zeros(gates, hidden, dtype=dtype)]
        biases = [torch.zeros(gates, dtype=dtype), torch.zeros(gates, dtype=dtype)]
        h0 = torch.zeros(1, batch, hidden, dtype=dtype)
        try:
            out = torch.ops.aten.mkldnn_rnn_layer(
                x, *weights, *biases, h0, h0.clone(), False, [], 2, hidden, 1, has_biases, False, False, True
            )
        except RuntimeError:
            if dtype == torch.float32:
                raise
            # oneDNN on this CPU has no 16-bit LSTM: size it in fp32 (its gate and cell buffers are fp32
            # anyway; the 16-bit state buffers are overcounted by 2x, an upper bound)
            return _measured_bytes(steps, batch, in_features, hidden, has_biases, torch.float32)
        return int(out[3].numel() * out[3].element_size())


SAMPLE_STATE_ELEMENTS = 65536
"""samples × hidden units of the measured calls: each workspace buffer is then >= 256 KiB, so oneDNN's
4 KiB page alignment of its buffers moves the extrapolation by ~1-2% at most"""


def workspace_bytes(
    steps: int, batch: int, in_features: int, hidden: int, has_biases: bool, dtype: Any
) -> int:
    """oneDNN's training workspace of one LSTM layer call, ``ws(T, B) = a·T·B + b·B + c·T + d``, solved from
    four real calls at T in {1, 2} and B in {Bs, 2·Bs} (Bs = max(64, 65536 / hidden))."""
    key = (in_features, hidden, has_biases, dtype)
    bs = max(64, SAMPLE_STATE_ELEMENTS // max(hidden, 1))
    if steps <= 2 and batch <= 2 * bs or steps * batch <= bs:
        return _measured_bytes(steps, batch, *key)  # as cheap as the samples, and exact
    w11, w12, w21, w22 = (
        _measured_bytes(t, b, *key) for t, b in ((1, bs), (1, 2 * bs), (2, bs), (2, 2 * bs))
    )
    a = (w22 - w21 - w12 + w11) / bs
    b = (w12 - w11) / bs - a
    c = w21 - w11 - a * bs
    d = w11 - a * bs - b * bs - c
    return max(0, round(a * steps * batch + b * batch + c * steps + d))


class RnnWorkspaceMode(TorchDispatchMode):
    """Replaces the empty workspace of ``mkldnn_rnn_layer`` by a fake one of oneDNN's size. Enter it inside
    ``FakeTensorMode`` and outside the memory tracker, which then counts the workspace as the activation it
    is."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func._overloadpacket.__name__ != _FORWARD or not bool(args[15]):  # args[15]: train
            return out
        import torch

        x, w_ih, w_hh = args[:3]
        steps, batch = x.shape[0], x.shape[1]  # ATen passes the input time-major whatever batch_first says
        size = workspace_bytes(
            int(steps), int(batch), int(w_ih.shape[1]), int(w_hh.shape[1]), bool(args[12]), x.dtype
        )
        return (*out[:3], torch.empty(size, dtype=torch.uint8, device=x.device))
