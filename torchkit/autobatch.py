"""AutoBatch under the module path Ultralytics users know (``ultralytics.utils.autobatch``):
``from torchkit.autobatch import check_train_batch_size, autobatch``. The implementation is
``torchkit.seed_api.autobatch``; this module re-exports its public names.

``torchkit.autobatch`` is also a public *function* of the package (``from torchkit import autobatch``), as it
has been. Once this module is imported, Python binds the package attribute ``torchkit.autobatch`` to the
module; so that both spellings keep working whatever was imported first, calling the module calls the
function: ``torchkit.autobatch(model, imgsz=640)`` is ``torchkit.autobatch.autobatch(model, imgsz=640)``.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from torchkit.seed_api.autobatch import (
    ProbeOutcome,
    autobatch,
    check_train_batch_size,
    estimate_batch,
    run_probes,
)

__all__ = ["ProbeOutcome", "autobatch", "check_train_batch_size", "estimate_batch", "run_probes"]


class _CallableModule(types.ModuleType):
    """This module, callable as the ``autobatch`` function it exports."""

    def __call__(self, *args: Any, **kwargs: Any) -> int:
        return autobatch(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
