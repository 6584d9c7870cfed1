"""A small memory tracker over a ``TorchDispatchMode``: live storage bytes, peak, and the category of every
byte at the peak (parameters, gradients, optimizer state, activations, temporaries, ...).

It works on real and on fake tensors (``FakeTensorMode``): every operator's output storages are recorded
when they first appear and released when Python's last reference to the storage dies (a weak reference
callback), which is when the allocator frees the memory. Events go to a timeline; categories are resolved
at the end (a gradient is only known to be one after backward put it in ``.grad``), and the timeline is
replayed to find the peak and its breakdown. Kernel workspace that no operator returns (oneDNN scratch,
cuDNN workspace) is invisible to a dispatch mode; per-backend models of it add *transient* bytes at an
operator, and the replay reports one peak per model.

Why not ``torch.distributed._tools.MemTracker``: it is private, arrived in torch 2.5 (this project supports
torch>=2.4), and refuses a second iteration without a reset. This tracker uses only public dispatch-mode
API (the documented ``TorchDispatchMode``) plus ``UntypedStorage`` weak references (storage PyObject
preservation, torch>=2.0); tested on torch 2.13.

Known limitations:
- Storage resizes (``UntypedStorage.resize_``, ``out=`` variants that grow their output) are not tracked;
  no training step of the reference workloads does either.
- Memory allocated outside the dispatcher (C++ kernels' scratch, communication buffers) is only seen
  through a workspace model.
- A tensor kept alive only by a C++ structure after Python dropped it is still counted as live (correct)
  because the storage weak reference fires only when the storage itself dies.
- Bytes are ``storage.nbytes()`` exactly (what the CPU allocator is asked for); the CUDA caching
  allocator's 512-byte rounding is applied separately (``rounded_peak_bytes``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

CUDA_MIN_BLOCK_BYTES = 512
"""CUDA caching allocator rounds every request up to a multiple of 512 bytes (``kMinBlockSize`` in
c10/cuda/CUDACachingAllocator.cpp)."""

WorkspaceModel = Callable[[Any, tuple, dict, Any], int]
"""(op overload, args, kwargs, outputs) -> bytes the kernel allocates and frees inside the op. A model may
carry an ``ops`` attribute (a set of op packet names, e.g. ``{"convolution"}``): it is then only called for
those ops, which keeps the tracker's per-op cost low."""


class MemoryCategory(str, Enum):
    """What a live byte is for, as MemTracker's categories (inputs and buffers kept apart)."""

    PARAMETERS = "parameters"
    BUFFERS = "buffers"
    INPUTS = "inputs"
    GRADIENTS = "gradients"
    OPTIMIZER_STATE = "optimizer_state"
    ACTIVATIONS = "activations"
    """created during forward (incl. the loss) and still alive: mostly tensors saved for backward"""
    TEMPORARIES = "temporaries"
    """created during backward or the optimizer step and not a gradient or optimizer state"""
    WORKSPACE = "workspace"
    """kernel-internal bytes from a workspace model (only in the per-backend breakdowns)"""


class Phase(str, Enum):
    SETUP = "setup"
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


_ALLOC, _FREE, _TRANSIENT = 0, 1, 2
_SKIP_OPS = frozenset({torch.ops.prim.device.default})


@dataclass(frozen=True, kw_only=True)
class MemoryPeak:
    """The peak of a tracked run, with what was live at that moment."""

    peak_bytes: int
    """largest sum of live storage bytes (+ the op's workspace for a workspace peak)"""
    breakdown_bytes: dict[str, int]
    """category value -> exact bytes live at the peak; sums to ``peak_bytes`` except for the allocator
    rounding of a rounded workspace peak"""
    op: str
    """the operator at (or just before) the peak"""
    phase: str
    """forward / backward / optimizer / setup"""
    iteration: int
    """the iteration mark in force at the peak (``set_iteration``)"""


@dataclass(frozen=True, kw_only=True)
class TrackerResult:
    peak: MemoryPeak
    """peak of live storage bytes, no workspace"""
    workspace_peaks: dict[str, MemoryPeak]
    """workspace model name -> peak with that model's transient bytes added, live bytes rounded to the
    model's allocator block (its breakdown is exact bytes plus ``workspace``)"""
    rounded_peak_bytes: int
    """peak with each storage rounded up to the CUDA caching allocator's 512-byte blocks"""
    max_workspace_bytes: dict[str, int]
    """workspace model name -> largest single-op workspace"""
    phase_peak_bytes: dict[str, int]
    """phase -> peak of live storage bytes while in that phase (exact bytes, no workspace)"""
    num_allocations: int


class MemoryTracker(TorchDispatchMode):
    """Records storage allocations/frees of every op run under it (see module docstring).

    Usage::

        tracker = MemoryTracker(workspace_models={"cpu": cpu_model})
        tracker.register(model.parameters(), MemoryCategory.PARAMETERS)
        with tracker:
            tracker.set_phase(Phase.FORWARD); loss = ...
            tracker.set_phase(Phase.BACKWARD); loss.backward()
            tracker.mark((p.grad for p in params), MemoryCategory.GRADIENTS)
        result = tracker.result(from_iteration=1)
    """

    def __init__(
        self,
        workspace_models: Mapping[str, WorkspaceModel] | None = None,
        *,
        workspace_block_bytes: Mapping[str, int] | None = None,
        op_observer: Callable[[Any, tuple, dict, Any], None] | None = None,
    ) -> None:
        """
        Args:
            workspace_models: name -> model of kernel-internal bytes per op (see ``overhead``).
            workspace_block_bytes: name -> allocator block size live bytes are rounded to for that model's
                peak (512 for CUDA's caching allocator; default 1, exact).
            op_observer: called with (op, args, kwargs, outputs) after every op (FLOP/byte recording).
        """
        super().__init__()
        self._workspace_models = dict(workspace_models or {})
        self._block_bytes = {
            name: int((workspace_block_bytes or {}).get(name, 1)) for name in self._workspace_models
        }
        self._op_observer = op_observer
        self._models_for: dict[Any, tuple[tuple[str, WorkspaceModel], ...]] = {}  # op -> models that apply
        self._events: list[tuple] = []
        self._live: dict[int, tuple[int, weakref.ref]] = {}  # id(storage) -> (sid, weakref)
        self._sizes: list[int] = []  # sid -> bytes
        self._created_phase: list[Phase] = []  # sid -> phase at creation
        self._category: dict[int, MemoryCategory] = {}  # sid -> explicit category (register/mark)
        self._phase = Phase.SETUP
        self._iteration = 0
        self._op = "<start>"

    # -- recording ---------------------------------------------------------------------------------------
    def set_phase(self, phase: Phase) -> None:
        self._phase = phase

    def set_iteration(self, iteration: int) -> None:
        self._iteration = iteration

    def register(self, tensors: Iterable[torch.Tensor], category: MemoryCategory) -> None:
        """Start tracking tensors created outside the tracker (parameters, buffers, inputs) as ``category``."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                sid = self._track(t)
                if sid is not None:
                    self._category[sid] = category

    def mark(self, tensors: Iterable[torch.Tensor | None], category: MemoryCategory) -> None:
        """Re-categorise tracked tensors (gradients after backward, optimizer state after a step)."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                sid = self._track(t)
                if sid is not None:
                    self._category[sid] = category

    def _track(self, t: torch.Tensor) -> int | None:
        try:
            storage = t.untyped_storage()
        except (NotImplementedError, RuntimeError):  # sparse / subclass without storage
            return None
        key = id(storage)
        entry = self._live.get(key)
        if entry is not None and entry[1]() is storage:
            return entry[0]
        nbytes = int(storage.nbytes())
        sid = len(self._sizes)
        self._sizes.append(nbytes)
        self._created_phase.append(self._phase)
        self._live[key] = (sid, weakref.ref(storage, self._on_free(key, sid)))
        self._events.append((_ALLOC, sid, nbytes, self._op, self._phase, self._iteration))
        return sid

    def _on_free(self, key: int, sid: int) -> Callable[[Any], None]:
        def callback(_ref: Any) -> None:
            entry = self._live.get(key)
            if entry is not None and entry[0] == sid:
                del self._live[key]
            self._events.append((_FREE, sid, self._sizes[sid], self._op, self._phase, self._iteration))

        return callback

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 (torch signature)
        kwargs = kwargs or {}
        if func in _SKIP_OPS:
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        self._op = str(func.__name__)
        if isinstance(out, torch.Tensor):
            self._track(out)
        else:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self._track(t)
        if self._op_observer is not None:
            self._op_observer(func, args, kwargs, out)
        models = self._models_for.get(func)
        if models is None:
            packet = func._overloadpacket.__name__
            models = tuple(
                (name, model)
                for name, model in self._workspace_models.items()
                if getattr(model, "ops", None) is None or packet in model.ops
            )
            self._models_for[func] = models
        for name, model in models:
            extra = model(func, args, kwargs, out)
            if extra:
                self._events.append((_TRANSIENT, name, int(extra), self._op, self._phase, self._iteration))
        return out

    # -- results -----------------------------------------------------------------------------------------
    def category_of(self, sid: int) -> MemoryCategory:
        explicit = self._category.get(sid)
        if explicit is not None:
            return explicit
        if self._created_phase[sid] is Phase.FORWARD:
            return MemoryCategory.ACTIVATIONS
        return MemoryCategory.TEMPORARIES

    def result(self, from_iteration: int = 0) -> TrackerResult:
        """Replay the timeline; peaks are taken over events of iterations >= ``from_iteration``."""
        categories = [self.category_of(sid) for sid in range(len(self._sizes))]
        blocks = sorted({1, CUDA_MIN_BLOCK_BYTES, *self._block_bytes.values()})
        by_category = dict.fromkeys(MemoryCategory, 0)
        live = dict.fromkeys(blocks, 0)  # block size -> live bytes rounded up to it
        best = (-1, dict(by_category), "", Phase.SETUP.value, 0)
        best_rounded = 0
        ws_best: dict[str, tuple] = {}
        ws_max: dict[str, int] = dict.fromkeys(self._workspace_models, 0)
        phase_peaks: dict[str, int] = {}
        num_allocations = 0
        for kind, ref, nbytes, op, phase, iteration in self._events:
            if kind in (_ALLOC, _FREE):
                sign = 1 if kind == _ALLOC else -1
                for block in blocks:
                    live[block] += sign * (-(-nbytes // block) * block)
                by_category[categories[ref]] += sign * nbytes
                num_allocations += kind == _ALLOC
                if kind == _FREE:
                    continue
            if iteration < from_iteration:
                continue
            if kind == _TRANSIENT:
                ws_max[ref] = max(ws_max[ref], nbytes)
                total = live[self._block_bytes[ref]] + nbytes
                current = ws_best.get(ref)
                if current is None or total > current[0]:
                    snapshot = dict(by_category)
                    snapshot[MemoryCategory.WORKSPACE] = nbytes
                    ws_best[ref] = (total, snapshot, op, phase.value, iteration)
                continue
            best_rounded = max(best_rounded, live[CUDA_MIN_BLOCK_BYTES])
            if live[1] > phase_peaks.get(phase.value, -1):
                phase_peaks[phase.value] = live[1]
            if live[1] > best[0]:
                best = (live[1], dict(by_category), op, phase.value, iteration)
            for name, block in self._block_bytes.items():
                current = ws_best.get(name)
                if current is None or live[block] > current[0]:
                    ws_best[name] = (live[block], dict(by_category), op, phase.value, iteration)
        workspace_peaks = {name: _peak(ws_best.get(name, best)) for name in self._workspace_models}
        return TrackerResult(
            peak=_peak(best),
            workspace_peaks=workspace_peaks,
            rounded_peak_bytes=best_rounded,
            max_workspace_bytes=ws_max,
            phase_peak_bytes=phase_peaks,
            num_allocations=num_allocations,
        )


def _peak(record: tuple) -> MemoryPeak:
    total, by_category, op, phase, iteration = record
    return MemoryPeak(
        peak_bytes=max(total, 0),
        breakdown_bytes={c.value: int(b) for c, b in by_category.items() if b},
        op=op,
        phase=phase,
        iteration=iteration,
    )
