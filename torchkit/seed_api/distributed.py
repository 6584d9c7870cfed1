"""``torch_distributed_zero_first`` under the seed's module name (Ultralytics ``torch_utils``); the context
itself is the engine's, ``torchkit.process.zero_first``, where the planner's in-job autobatch takes it from."""

from __future__ import annotations

from torchkit.process.zero_first import torch_distributed_zero_first

__all__ = ["torch_distributed_zero_first"]
