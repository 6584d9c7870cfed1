"""``get_workload``: a model name -> its ``Workload``, from the source the name names (see
``torchkit.workloads.registry``): a built-in name, a library model (``timm:``, ``torchvision:``, ``hf:``,
``ultralytics:``; the ``[models]`` extra, each library imported only when asked for, fresh weights, nothing
downloaded) or ``package.module:factory`` (``torchkit.workloads.user_models``)."""

from __future__ import annotations

import importlib

from torchkit.errors import WorkloadError
from torchkit.workloads.registry import (
    WORKLOAD_NAMES,
    LibrarySource,
    builtin_model,
    is_user_factory,
    library_source,
    other_sources,
    takes_tokens,
)
from torchkit.workloads.workload import Workload, check_model, model_template


def get_workload(
    name: str,
    *,
    imgsz: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    seq_len: int | None = None,
    vocab_size: int | None = None,
    input_dtype: str | None = None,
) -> Workload:
    """The workload called ``name``: a built-in name, a library model (``timm:``, ``torchvision:``, ``hf:``,
    ``ultralytics:``) or ``package.module:factory``.

    Args:
        imgsz: square image size for image models (default: the model's own, 224 or 640).
        input_shape: per-sample input shape; for a factory returning an ``nn.Module``, this or ``seq_len``
            is required; for an image model ``(3, H, W)`` is the same as ``imgsz``.
        seq_len: sequence length of token models (``gpt2-small``, ``hf:``, a factory with ``vocab_size``).
        vocab_size: a factory's input is integer token ids in ``[0, vocab_size)``.
        input_dtype: a factory's input dtype (``float32`` default; ``int64`` with ``vocab_size``; see
            ``inputs.INPUT_DTYPES``).

    Raises:
        WorkloadError: unknown name, a library that is missing, a factory that cannot be imported or fails,
            a model without parameters, an input the model cannot take, an invalid size, an option the
            source does not take.
    """
    _check_options(name, imgsz=imgsz, seq_len=seq_len, vocab_size=vocab_size, input_dtype=input_dtype)
    source = library_source(name)
    if source is not None:
        return _library_workload(name, source, imgsz=imgsz, input_shape=input_shape, seq_len=seq_len)
    if ":" in name:
        from torchkit.workloads.user_models import user_workload

        return user_workload(
            name, input_shape=input_shape, seq_len=seq_len, vocab_size=vocab_size, input_dtype=input_dtype
        )
    entry = builtin_model(name)
    if entry is None:
        raise WorkloadError(
            f"unknown workload {name!r} (known: {', '.join(WORKLOAD_NAMES)}; or {other_sources()})"
        )
    from torchkit.workloads.builtin import builtin_workload

    return builtin_workload(entry, imgsz=imgsz, input_shape=input_shape, seq_len=seq_len)


def _check_options(
    name: str, *, imgsz: int | None, seq_len: int | None, vocab_size: int | None, input_dtype: str | None
) -> None:
    """Refuse options the source does not take (they would be silently ignored otherwise)."""
    user = is_user_factory(name)
    if (vocab_size is not None or input_dtype is not None) and not user:
        flag = "--vocab-size" if vocab_size is not None else "--input-dtype"
        raise WorkloadError(
            f"{flag} describes the input of a package.module:factory model; {name!r} brings its own input "
            "(drop the flag)"
        )
    if user and imgsz is not None:
        raise WorkloadError(
            f"model {name!r} is a user factory: give its per-sample input with --input-shape (or --seq-len N "
            "--vocab-size V for token ids); --imgsz is for the image models"
        )
    if user:
        return
    tokens = takes_tokens(name)
    known = builtin_model(name) is not None or library_source(name) is not None
    if seq_len is not None and known and not tokens:
        token_models = [n for n in WORKLOAD_NAMES if takes_tokens(n)]
        raise WorkloadError(
            f"--seq-len is for token models ({', '.join(token_models)}, hf:, a factory); {name!r} takes images"
        )
    if imgsz is not None and tokens:
        raise WorkloadError(f"--imgsz is for image models; {name!r} takes token ids (use --seq-len)")


def _library_workload(
    name: str,
    source: LibrarySource,
    *,
    imgsz: int | None,
    input_shape: tuple[int, ...] | None,
    seq_len: int | None,
) -> Workload:
    target = name[len(source.prefix) :]
    if not target:
        raise WorkloadError(
            f"model {name!r} names no model after {source.prefix!r} (e.g. {source.prefix}{source.example})"
        )
    module_name, _, function = source.builder.partition(":")
    build = getattr(importlib.import_module(module_name), function)
    if source.input == "tokens":
        workload = build(name, target, seq_len=seq_len, input_shape=input_shape)
    else:
        workload = build(name, target, imgsz=imgsz, input_shape=input_shape)
    check_model(model_template(workload), workload)
    return workload
