"""Out-of-memory detection, one rule for every place that runs a step and must tell "too big" from a bug
(autobatch's probes, ``profile_ops``, the measured profile).

Importing this module imports no torch; ``is_out_of_memory_error`` imports it when first called.
"""

from __future__ import annotations

#: texts of out-of-memory errors that arrive as a plain RuntimeError: CUDA/HIP/MPS/XPU allocators, cuBLAS
#: handle creation, cuDNN workspace, the CPU allocator (Lightning's batch-size finder uses the CUDA/cuDNN/CPU
#: ones; cuDNN says NOT_SUPPORTED when the workspace for a huge batch cannot be allocated)
OOM_MESSAGES = (
    "out of memory",  # "CUDA out of memory", "CUDA error: out of memory", "HIP/XPU out of memory", "MPS backend out of memory"
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
)


def _oom_exception_types() -> tuple[type[BaseException], ...]:
    import torch

    types: list[type[BaseException]] = []
    for owner in (torch, torch.cuda):
        oom_type = getattr(owner, "OutOfMemoryError", None)
        if isinstance(oom_type, type):
            types.append(oom_type)
    return tuple(types)


def is_out_of_memory_error(exc: BaseException) -> bool:
    """True if ``exc`` means an allocation failed: ``torch.OutOfMemoryError`` / ``torch.cuda.OutOfMemoryError``
    by type, or a RuntimeError carrying one of ``OOM_MESSAGES``."""
    if isinstance(exc, _oom_exception_types()):
        return True
    return isinstance(exc, RuntimeError) and any(text in str(exc) for text in OOM_MESSAGES)
