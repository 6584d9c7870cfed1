"""Checkpoint tools: strip a training checkpoint down to its FP16 weights, shrink optimizer state
(shared/reference/ultralytics-behaviour.md §2.24, §2.25).

Deliberate differences from the seed:
- Checkpoints are loaded with ``torch.load(weights_only=True)``, which cannot run code from the file.
  Plain tensors/containers always load; pickled modules load when every class in them comes from
  ``torch.nn`` (those are allow-listed for the call, plus whatever the user allowed with
  ``torch.serialization.add_safe_globals``). Anything else raises ``CheckpointError`` naming the classes and
  how to load a legacy pickle the user trusts.
- The stripped file is written atomically: a temporary file in the target's directory, fsync, then
  ``os.replace``. A crash mid-write leaves the old file intact, never a truncated one.
- Metadata names batchplan (its version and licence); ``train_args`` is kept as saved (there is no
  Ultralytics default config to filter it against); distillation and QAT models are not special-cased.
"""

from __future__ import annotations

import importlib
import logging
import os
import pickle
import tempfile
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchkit.errors import UserError

LOGGER = logging.getLogger(__name__)

LICENSE = "AGPL-3.0-or-later"

#: keys a stripped checkpoint no longer needs (training state); the seed sets them to None
TRAINING_STATE_KEYS = ("optimizer", "best_fitness", "stopper", "ema", "updates", "scaler")

#: optimizer state kept in FP32 by ``convert_optimizer_state_dict_to_fp16``: the step counter, and Adam's /
#: RMSprop's running moments, whose small values (squared gradients ~1e-8) underflow in FP16
FP32_OPTIMIZER_STATE_KEYS = frozenset({"step", "exp_avg", "exp_avg_sq", "square_avg"})


class CheckpointError(UserError, ValueError):
    """A checkpoint cannot be loaded safely (it holds Python objects ``weights_only`` refuses)."""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("batchplan")
    except PackageNotFoundError:
        return "unknown"


def _resolve_global(name: str) -> Any:
    module_name, _, attr = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError):
        return None


def _torch_nn_classes(names: list[str]) -> list[type]:
    """The entries of ``names`` that are ``nn.Module`` classes defined by torch itself."""
    allowed = []
    for name in names:
        obj = _resolve_global(name)
        if isinstance(obj, type) and issubclass(obj, nn.Module) and obj.__module__.startswith("torch.nn."):
            allowed.append(obj)
    return allowed


def load_checkpoint(f: str | os.PathLike, map_location: Any = "cpu") -> Any:
    """``torch.load(f, weights_only=True)`` with torch's own ``nn.Module`` classes allowed.

    Raises:
        CheckpointError: the file holds other Python objects (custom classes, namespaces, functions).
        FileNotFoundError: no such file.
    """
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(f)
    except FileNotFoundError:
        raise
    except Exception as e:  # a legacy (non-zip) file: nothing to allow up front, torch.load still checks it
        LOGGER.debug("could not list the globals of %s (%s); loading with the default allow-list", f, e)
        names = []
    allowed = _torch_nn_classes(names)
    with torch.serialization.safe_globals(allowed):
        try:
            return torch.load(f, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as e:
            allowed_names = {f"{c.__module__}.{c.__qualname__}" for c in allowed}
            refused = [n for n in names if n not in allowed_names]
            raise CheckpointError(
                f"{f} holds Python objects that torch.load(weights_only=True) refuses to build "
                f"({', '.join(refused) or 'see the loader message'}). If you trust the file, load it the legacy "
                f"way, ckpt = torch.load({str(f)!r}, map_location='cpu', weights_only=False), and save plain "
                "tensors instead (e.g. ckpt['model'] = ckpt['model'].state_dict()), or allow the classes with "
                "torch.serialization.add_safe_globals([...]) and retry. Loader said: "
                f"{str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__}"
            ) from e


def _to_half(obj: Any) -> Any:
    """An ``nn.Module`` → ``.half()`` with gradients off; a tensor mapping (a state dict) → floating tensors
    cast to FP16."""
    if isinstance(obj, nn.Module):
        args = getattr(obj, "args", None)
        if isinstance(args, Mapping):  # a namespace-like config becomes a plain dict (cheaper to unpickle)
            obj.args = dict(args)
        elif hasattr(args, "__dict__") and not isinstance(args, dict):
            obj.args = dict(vars(args))
        if hasattr(obj, "criterion"):
            obj.criterion = None  # the loss holds training-only state
        obj.half()
        for p in obj.parameters():
            p.requires_grad = False
        return obj
    if isinstance(obj, Mapping):
        return {
            k: v.half() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
            for k, v in obj.items()
        }
    return obj


def _atomic_save(obj: Any, path: Path) -> None:
    path = path.resolve()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def strip_optimizer(
    f: str | os.PathLike = "best.pt", s: str | os.PathLike = "", updates: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Turn a training checkpoint into an inference one: EMA weights (if any) as ``model``, in FP16, without
    optimizer/EMA/scaler state; save it to ``s`` (or over ``f``).

    Args:
        f: checkpoint to read: a dict with a ``"model"`` entry (an ``nn.Module`` or a state dict).
        s: where to write; empty means overwrite ``f``.
        updates: entries to put over the result before saving.

    Returns:
        The saved dict: ``{date, version, license, **ckpt, **updates}`` with ``model`` in FP16,
        ``optimizer, best_fitness, stopper, ema, updates, scaler = None`` and ``epoch = -1``; ``{}`` (with a
        warning, as the seed) when ``f`` is not such a dict or cannot be read.

    Raises:
        CheckpointError: ``f`` holds Python objects that are unsafe to unpickle (see ``load_checkpoint``).
    """
    try:
        ckpt = load_checkpoint(f)
        if not isinstance(ckpt, dict):
            raise TypeError("checkpoint is not a Python dictionary")
        if "model" not in ckpt:
            raise KeyError("'model' missing from checkpoint")
    except CheckpointError:
        raise
    except Exception as e:
        LOGGER.warning("Skipping %s, not a valid checkpoint: %s", f, e)
        return {}

    metadata = {"date": datetime.now().astimezone().isoformat(), "version": _version(), "license": LICENSE}
    if ckpt.get("ema") is not None:
        ckpt["model"] = ckpt["ema"]  # the averaged weights are the ones worth keeping
    ckpt["model"] = _to_half(ckpt["model"])
    for key in TRAINING_STATE_KEYS:
        ckpt[key] = None
    ckpt["epoch"] = -1

    combined = {**metadata, **ckpt, **(updates or {})}
    target = Path(s or f)
    _atomic_save(combined, target)
    size_mb = target.stat().st_size / 1e6
    LOGGER.info("Optimizer stripped from %s,%s %.1fMB", f, f" saved as {s}," if s else "", size_mb)
    return combined


def convert_optimizer_state_dict_to_fp16(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Cast FP32 tensors in an optimizer's ``state_dict["state"]`` to FP16, in place, and return the dict.

    Kept as they are: the keys in ``FP32_OPTIMIZER_STATE_KEYS`` (``step``, ``exp_avg``, ``exp_avg_sq``,
    ``square_avg``) and any tensor that is not FP32 (FP64, integer, already FP16). ``momentum_buffer`` (SGD)
    and other FP32 state is converted.
    """
    for state in state_dict["state"].values():
        for key, value in state.items():
            if (
                key not in FP32_OPTIMIZER_STATE_KEYS
                and isinstance(value, torch.Tensor)
                and value.dtype is torch.float32
            ):
                state[key] = value.half()
    return state_dict
