"""torchkit.step.oom: an allocation failure is told from any other error, by type and by the known texts."""

from __future__ import annotations

import pytest
import torch

from torchkit.step.oom import is_out_of_memory_error


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (torch.OutOfMemoryError("anything"), True),
        (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (RuntimeError("CUDA error: out of memory"), True),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), True),
        (RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if ..."), True),
        (RuntimeError("HIP out of memory. Tried to allocate 20.00 MiB"), True),
        (
            RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"),
            True,
        ),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), False),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
        (ValueError("out of memory"), False),  # only RuntimeErrors carry allocator messages
    ],
)
def test_is_out_of_memory_error(exc, expected):
    assert is_out_of_memory_error(exc) is expected


@pytest.mark.parametrize(
    "error",
    [
        torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.22 GiB"),
        torch.OutOfMemoryError("whatever text"),
        RuntimeError("CUDA error: out of memory"),
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
        RuntimeError("CUDNN_STATUS_NOT_ENOUGH_WORKSPACE"),
        RuntimeError(
            "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input."
        ),
        RuntimeError("HIP out of memory. Tried to allocate 2.00 GiB"),
    ],
)
def test_is_out_of_memory_recognises_types_and_known_texts(error):
    assert is_out_of_memory_error(error)


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        RuntimeError("CUDA error: invalid configuration argument"),  # batch > 65535 (pytorch#142228)
        ValueError("Expected more than 1 value per channel when training"),
    ],
)
def test_is_out_of_memory_rejects_other_errors(error):
    assert not is_out_of_memory_error(error)
