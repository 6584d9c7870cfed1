"""Timing marks on the device a step runs on: CUDA events on a CUDA device's current stream (the step's
kernels run asynchronously; a host clock would time their launch), else a host clock (``time.perf_counter``
unless given another, e.g. a test's fake clock)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class DeviceClock:
    """``mark()`` now on ``device``; ``elapsed_s(start, end)`` between two marks (waits for ``end`` on CUDA)."""

    def __init__(self, device: Any = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.cuda = getattr(device, "type", None) == "cuda"
        self.device = device
        self._clock = clock

    def mark(self) -> Any:
        if self.cuda:
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return event
        return self._clock()

    def elapsed_s(self, start: Any, end: Any) -> float:
        if self.cuda:
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        return end - start
