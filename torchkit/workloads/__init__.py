"""Reference workloads (plain torch, no torchvision), library models and user workloads, as one ``Workload``
type. This is the package's face: every public name is exported lazily (PEP 562) from the module that
defines it, so ``import torchkit.workloads`` imports no torch (the CLI reads ``registry`` for its help) and no
module here imports this face (``tests/test_imports.py`` checks that no module imports its own package's
face; import-linter's contract in pyproject.toml too).

- ``workload``: the ``Workload`` dataclass (model factory, batch builder, loss) and its checks;
- ``registry``: the one list of built-in names and library prefixes (help, errors, defaults, calibration);
- ``sources``: ``get_workload``, a model name -> its workload; ``builtin`` the built-ins, ``image_models``
  (``timm:``, ``torchvision:``), ``hf_models`` (``hf:``), ``ultralytics_models`` (``ultralytics:``),
  ``user_models`` (``package.module:factory``);
- ``fingerprint``: ``workload_fingerprint``, the content key profile caches are indexed by;
- ``construct``: models built outside fake mode and their fake copies; ``inputs``: user inputs and losses;
  ``extras``: importing an optional model library only when a model source names it;
- the models: ``resnet``, ``vit``, ``yolo``, ``gpt2``.

Every ``make_batch`` builds its tensors with ``torch.rand*``/``torch.randint`` and no real data, so it
works under ``FakeTensorMode`` (the estimator's fake passes) as well as for real.
"""

from __future__ import annotations

from torchkit.lazy import lazy_exports

#: submodule -> the public names it defines
_DEFINED_IN: dict[str, tuple[str, ...]] = {
    "workload": ("Workload", "call_model", "check_model", "model_template"),
    "sources": ("get_workload",),
    "fingerprint": ("workload_fingerprint",),
    "registry": ("WORKLOAD_NAMES", "DEFAULT_IMGSZ", "DEFAULT_SEQ_LEN", "LIBRARY_PREFIXES"),
    "inputs": ("INPUT_DTYPES", "USER_INPUT_LOSS", "InputSpec"),
}
_EXPORTS: dict[str, str] = {
    name: f"{__name__}.{module}" for module, names in _DEFINED_IN.items() for name in names
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
