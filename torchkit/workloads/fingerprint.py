"""The content key of a workload."""

from __future__ import annotations

import hashlib

from torchkit.workloads.workload import Workload, model_template


def workload_fingerprint(workload: Workload) -> str:
    """Content key of a workload (model structure, parameter shapes/dtypes, input, config), 16 hex digits.

    The model is the template (built on the meta device where it can be), so this costs little memory.
    Two workloads with the same key train the same architecture on the same input; the key is what
    profile caches are indexed by.
    """
    model = model_template(workload)
    params = [(n, tuple(p.shape), str(p.dtype), p.requires_grad) for n, p in model.named_parameters()]
    buffers = [(n, tuple(b.shape), str(b.dtype)) for n, b in model.named_buffers()]
    text = repr((str(model), params, buffers, tuple(workload.sample_shape), workload.config))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


