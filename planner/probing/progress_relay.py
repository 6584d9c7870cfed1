"""Progress of a profile made in a probe, relayed to the driver: the estimator's "fake pass 1 of 3 done (batch
32, 10.6 s)" lines, which ``--no-ray`` prints as they come, and which a probe's log never showed (Ray's worker
logs are not streamed to the driver: ``planner.probing.session``).

The probe puts the lines of the profile it is making under one key of the Ray cluster's own key-value store
(the GCS: no extra process, and it reaches the driver from any node); the driver, waiting for the profile,
reads the key about once a second and turns each new line into a progress event. A relay that fails costs
the progress lines, never the profile.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator

#: the loggers whose INFO lines are a profile's progress (the estimator's fake passes, the extra pass near
#: the cap of a launch-bound model)
PROGRESS_LOGGERS = ("torchkit.estimate.estimator", "planner.profiling.make")
_NAMESPACE = "batchplan"
#: lines kept per profile (a long measured profile must not grow one key without bound)
_MAX_LINES = 100


def _kv():
    from ray.experimental import internal_kv

    return internal_kv


class _Relay(logging.Handler):
    def __init__(self, key: str) -> None:
        super().__init__(logging.INFO)
        self.key = key
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines = [*self.lines, record.getMessage()][-_MAX_LINES:]
            _kv()._internal_kv_put(self.key, json.dumps(self.lines), overwrite=True, namespace=_NAMESPACE)
        except Exception:  # a relay that cannot write costs its lines, not the profile
            pass


@contextlib.contextmanager
def relayed_progress(key: str | None) -> Iterator[None]:
    """In a probe: while the block runs, the progress loggers' INFO lines go to ``key`` (nothing for None)."""
    if not key:
        yield
        return
    relay = _Relay(key)
    loggers = [logging.getLogger(name) for name in PROGRESS_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(relay)
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(relay)
            logger.setLevel(level)


def new_lines(key: str, seen: int) -> list[str]:
    """In the driver: the lines under ``key`` after the first ``seen`` ([] when none, or the store cannot be
    read)."""
    try:
        raw = _kv()._internal_kv_get(key, namespace=_NAMESPACE)
        lines = json.loads(raw) if raw else []
    except Exception:
        return []
    return [str(line) for line in lines[seen:]]


def forget(key: str) -> None:
    """In the driver: drop the key once the profile is in."""
    with contextlib.suppress(Exception):
        _kv()._internal_kv_del(key, namespace=_NAMESPACE)
