"""A workload's identity is the step it trains: ``workload_fingerprint`` hashes everything of a workload that
changes the memory or the time of its training step, so that a profile cache (keyed by it) never answers
one model with another model's curve.

What is hashed (``identity_parts``):

- the factory, the batch builder and the loss: module and qualified name, the source of each (the code
  object's bytes where there is no source), and what their closures, ``functools.partial`` arguments and
  defaults hold (scalars as values; modules by name; other objects by type, never by address);
- the model (``model_identity``): its printout, parameter and buffer shapes/dtypes, the source of the
  ``forward`` of every module class in it (a checkpointed layer and a plain one print alike), the scalar
  attributes of every module, deterministically ordered (dropout rates that are floats, not ``Dropout``
  modules, as in ``nn.MultiheadAttention``; checkpointing flags; ``eps``; activation functions stored as
  attributes; JSON-like dicts such as timm's ``pretrained_cfg``), and its forward/backward hooks;
- the input (per-sample shape, ``config``: a user input's dtype and range, a Hugging Face config, an
  Ultralytics model YAML) and the workload's margin;
- the versions of the libraries the model's classes and the factory come from (timm, transformers,
  ultralytics, torchvision, torch, ...), and of the library a ``timm:``/``hf:``/``ultralytics:``/
  ``torchvision:`` name names.

The job options (amp, optimizer, channels-last, the fit) are not the workload's: the profile key adds them
(``planner.profiles.key``). ``FINGERPRINT_REVISION`` is part of the hash: raise it when what is hashed
changes, so that every key changes with it and old cache entries go cold.

Known limitations: code a ``forward`` calls that is not a module's ``forward`` (a helper function of the
user's module, a library's functional) is covered by the library version or the factory's source, not by
its own source; an attribute holding an arbitrary object counts by its type only.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import inspect
import json
import math
import numbers
import types
from collections.abc import Callable
from enum import Enum
from typing import Any

import torch

from torchkit.workloads.registry import library_source
from torchkit.workloads.workload import Workload, model_template

FINGERPRINT_REVISION = 2
"""1: printout, shapes, input and config (until [truth]); 2: + code, attributes, hooks, library versions"""

#: import names whose version says nothing here: torchkit's own code is hashed as source, and a factory run
#: as a script or typed in a REPL has no distribution
UNVERSIONED_TOP_LEVELS = frozenset({"", "torchkit", "__main__", "builtins"})
#: how deep closures, partials and containers are followed (a cycle or a huge object graph stops here)
MAX_DEPTH = 4
#: the hook tables of an ``nn.Module``: a hook changes what the step does (checkpointing, offloading)
HOOK_TABLES = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")


def workload_fingerprint(workload: Workload) -> str:
    """Content key of a workload (see the module docstring for what it covers), 16 hex digits.

    The model is the template (built on the meta device where it can be), so this costs little memory.
    Two workloads with the same key train the same step on the same input; the key is what profile caches
    are indexed by.

    Raises:
        WorkloadError: the factory fails (``model_template``).
    """
    text = json.dumps(identity_parts(workload), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def identity_parts(workload: Workload) -> dict[str, Any]:
    """What ``workload_fingerprint`` hashes, as JSON-ready data (readable when two keys differ)."""
    model = model_template(workload)
    return {
        "revision": FINGERPRINT_REVISION,
        "factory": callable_identity(workload.build_model),
        "batch": callable_identity(workload.make_batch),
        "loss": callable_identity(workload.loss_fn),
        "input": [list(workload.sample_shape), workload.config, workload.margin_bytes],
        "model": model_identity(model),
        "libraries": library_versions(workload, model),
    }


def model_identity(model: torch.nn.Module) -> dict[str, Any]:
    """The parts of the fingerprint that come from the model itself (deterministic for the same model)."""
    params = [[n, list(p.shape), str(p.dtype), p.requires_grad] for n, p in model.named_parameters()]
    buffers = [[n, list(b.shape), str(b.dtype)] for n, b in model.named_buffers()]
    forwards: dict[str, str] = {}
    modules = []
    for name, module in model.named_modules():
        cls = type(module)
        forwards.setdefault(_path(cls), code_digest(cls.forward))
        entry: dict[str, Any] = {"name": name, "type": _path(cls), "attributes": module_attributes(module)}
        hooks = {
            table: [callable_identity(h) for h in getattr(module, table, {}).values()]
            for table in HOOK_TABLES
        }
        hooks = {table: found for table, found in hooks.items() if found}
        if hooks:
            entry["hooks"] = hooks
        modules.append(entry)
    return {
        "printout": str(model),
        "parameters": params,
        "buffers": buffers,
        "forward": forwards,
        "modules": modules,
    }


@functools.cache
def _module_internals() -> frozenset[str]:
    """The attributes every ``nn.Module`` has (parameter/buffer/module tables, hook tables, ``training``):
    not the module's own settings (hooks are hashed on their own)."""
    return frozenset(vars(torch.nn.Module()))


def module_attributes(module: torch.nn.Module) -> dict[str, Any]:
    """The module's own attributes (``vars`` without the ``nn.Module`` internals), by name: scalars as values,
    tensors by shape and dtype, callables by identity, other objects by type."""
    internals = _module_internals()
    return {key: value_identity(value) for key, value in sorted(vars(module).items()) if key not in internals}


def value_identity(value: Any, depth: int = 0) -> Any:
    """A JSON-ready stand-in for ``value`` that is the same for equal settings in any process: never an
    address, a set's order or an id."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, numbers.Integral):  # numpy integers and the like
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else repr(number)
    if isinstance(value, bytes):
        return ["bytes", hashlib.sha256(value).hexdigest()[:16]]
    if isinstance(value, Enum):
        return f"{_path(type(value))}.{value.name}"
    if isinstance(value, torch.dtype | torch.device | torch.Size):
        return str(value)
    if isinstance(value, torch.Tensor):
        return ["tensor", list(value.shape), str(value.dtype)]
    if isinstance(value, torch.nn.Module):
        return ["module", _path(type(value))]
    if isinstance(value, types.ModuleType):
        return ["python-module", value.__name__]
    if isinstance(value, type):
        return ["class", _path(value)]
    if depth >= MAX_DEPTH:
        return ["object", _path(type(value))]
    if isinstance(value, tuple | list):
        return [value_identity(v, depth + 1) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((value_identity(v, depth + 1) for v in value), key=repr)
    if isinstance(value, dict):
        return [
            [str(k), value_identity(v, depth + 1)]
            for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))
        ]
    if callable(value):
        return callable_identity(value, depth + 1)
    return ["object", _path(type(value))]


def callable_identity(fn: Callable[..., Any], depth: int = 0) -> Any:
    """Where a callable comes from and what it does: module, qualified name, code, and what it closes over."""
    if isinstance(fn, functools.partial):
        return [
            "partial",
            callable_identity(fn.func, depth + 1),
            value_identity(list(fn.args), depth + 1),
            value_identity(dict(fn.keywords), depth + 1),
        ]
    if isinstance(fn, types.MethodType):
        return ["method", callable_identity(fn.__func__, depth + 1), _path(type(fn.__self__))]
    if isinstance(fn, types.FunctionType):
        cells = [c.cell_contents for c in fn.__closure__ or () if _filled(c)]
        return [
            "function",
            _path(fn),
            code_digest(fn),
            value_identity(cells, depth + 1),
            value_identity(list(fn.__defaults__ or ()), depth + 1),
            value_identity(dict(fn.__kwdefaults__ or {}), depth + 1),
        ]
    if isinstance(fn, type):
        return ["class", _path(fn)]
    if isinstance(fn, torch.nn.Module):
        return ["module", _path(type(fn))]
    if hasattr(fn, "__qualname__"):  # builtins, ufunc-like objects
        return ["callable", _path(fn)]
    return ["callable-object", _path(type(fn)), code_digest(type(fn).__call__)]


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 (an empty cell raises)
    except ValueError:
        return False
    return True


def code_digest(fn: Any) -> str:
    """sha256 (16 hex digits) of a function's source; of its code object's bytes where there is no source
    (defined in a REPL, ``exec``-ed, a ``.pyc`` only); ``builtin`` for functions without Python code."""
    fn = inspect.unwrap(fn) if callable(fn) else fn
    try:
        text = inspect.getsource(fn).encode()
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        if code is None:
            return "builtin"
        text = _code_bytes(code)
    return hashlib.sha256(text).hexdigest()[:16]


def _code_bytes(code: types.CodeType) -> bytes:
    """A code object's bytecode, names and constants (nested code objects likewise). Not ``marshal.dumps``:
    its output depends on reference counts, so the same function can marshal differently."""
    consts = [_code_bytes(c) if isinstance(c, types.CodeType) else repr(c).encode() for c in code.co_consts]
    return b"\0".join([code.co_code, repr((code.co_names, code.co_varnames)).encode(), *consts])


def _path(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or "?"
    return f"{module}.{getattr(obj, '__qualname__', getattr(obj, '__name__', '?'))}"


def library_versions(workload: Workload, model: torch.nn.Module) -> list[list[str]]:
    """``[distribution, version]`` of every installed library a module class of the model or the factory
    comes from, and of the library a ``timm:``/``hf:``/``ultralytics:``/``torchvision:`` name names."""
    tops = {type(m).__module__.split(".")[0] for m in model.modules()}
    tops |= {_origin_module(workload.build_model).split(".")[0]}
    found = {}
    for top in sorted(tops - UNVERSIONED_TOP_LEVELS):
        distribution, version = _distribution_version(top)
        if version is not None:
            found[distribution] = version
    source = library_source(workload.name)
    if source is not None:
        found[source.distribution] = _distribution_version(source.distribution)[1] or "not installed"
    return [[name, found[name]] for name in sorted(found)]


def _origin_module(fn: Any) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__module__", None) or ""


@functools.cache
def _distribution_version(top_level: str) -> tuple[str, str | None]:
    """(distribution, version) of the installed distribution that provides the import name ``top_level``."""
    try:
        return top_level, importlib.metadata.version(top_level)
    except importlib.metadata.PackageNotFoundError:
        pass
    for distribution in _import_names().get(top_level, ()):
        try:
            return distribution, importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return top_level, None


@functools.cache
def _import_names() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()
