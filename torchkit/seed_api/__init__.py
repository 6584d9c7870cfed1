"""The seed toolkit (Ultralytics ``torch_utils.py``, ``autodevice.py``, ``autobatch.py``) re-implemented, one
topic a module (``device``, ``gpu_info``, ``precision``, ``fusion``, ``stats``, ``model_utils``, ``training``,
``distributed``, ``profiling``, ``checkpoint``, ``autobatch`` and its decision ``batch_choice``): the
Ultralytics-compatible surface, torchkit's top layer. Every public name is exported lazily from ``torchkit``
itself (``from torchkit import select_device``); import from here only for names that are not part of that API.

It is a leaf: the planner never imports it (an import-linter contract). What the planner shares with it lives
in the engine and is re-exported here under the seed's module names: the budget rule and ``DEFAULT_FRACTION``
(``torchkit.step.budget``), ``get_cpu_info`` (``torchkit.hardware.host``), ``parse_device``
(``torchkit.process.device``) and ``torch_distributed_zero_first`` (``torchkit.process.zero_first``).
"""
