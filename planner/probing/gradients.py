"""The gradient layout of a job's model (bytes of each parameter's gradient, registration order), for the
synchronisation model: parameter shapes only, from the model template the estimator uses (built on the meta
device, or on the CPU where its constructor reads values), cached on disk beside the profiles under the
workload's fingerprint, so a warm plan imports no torch for it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from planner.errors import ConfigError
from planner.job import JobSpec
from planner.profiles.cache import untrusted_cache_dir
from planner.trust import UntrustedPathError, read_trusted, write_trusted

log = logging.getLogger(__name__)

_CACHE_SUBDIR = "gradients"
"""beside the profiles, in a folder of its own (the profile cache's own files stay the only ones at its top)"""


def _cache_path(directory: Path, job: JobSpec, identity: tuple[str, str]) -> Path:
    digest = hashlib.sha256(repr((job.model, *identity)).encode()).hexdigest()[:24]
    return directory / _CACHE_SUBDIR / f"{digest}.json"


_FIX = "the model is built on the meta device again"
_MAX_ENTRY_BYTES = 16 * 2**20  # a gradient size per parameter: a million parameters is ~8 MB of JSON


def _read(path: Path) -> tuple[int, ...] | None:
    """The cached layout where no other user could have written it (``planner.trust``); an entry that is not
    trusted or not readable is said on stderr and built again.

    Raises:
        FieldError: (``cache_dir``) the cache directory, or one above it, is not trusted.
    """
    try:
        raw = read_trusted(path, what="gradient layout cache entry", fix=_FIX, max_bytes=_MAX_ENTRY_BYTES)
        data = json.loads(raw) if raw is not None else None
    except UntrustedPathError as exc:
        if exc.in_directory:
            raise untrusted_cache_dir(exc) from None
        log.warning("%s: not trusted; %s", exc.problem, _FIX)
        return None
    except (ConfigError, ValueError) as exc:
        log.warning("gradient layout cache entry %s is unreadable (%s); %s", path, exc, _FIX)
        return None
    sizes = data.get("grad_bytes") if isinstance(data, dict) else None
    if not isinstance(sizes, list) or not sizes or not all(isinstance(s, int) and s > 0 for s in sizes):
        return None
    return tuple(sizes)


def _write(path: Path, sizes: tuple[int, ...]) -> None:
    """Written for a later trusted read (``planner.trust.write_trusted``); a cache that cannot be written costs a
    rebuild next time, nothing else."""
    try:
        write_trusted(path, json.dumps({"grad_bytes": list(sizes)}), what="gradient layout cache entry",
                      fix="check the cache directory")
    except (OSError, ConfigError) as exc:
        log.warning("%s", exc)


def gradient_layout(job: JobSpec, identity: tuple[str, str], cache_dir: str | os.PathLike | None
                    ) -> tuple[tuple[int, ...], str]:
    """(gradient bytes per parameter that requires grad, where they come from) for ``job``'s model.

    ``identity``: ``planner.profiling.job_fingerprint(job)``, the cache key. Raises whatever
    building the model raises (the caller reports it and plans without the synchronisation)."""
    path = _cache_path(Path(cache_dir), job, identity) if cache_dir is not None else None
    if path is not None and (cached := _read(path)) is not None:
        return cached, _source(job, cached)
    from planner.profiling.make import workload_for
    from torchkit.estimate.ddp_sync import gradient_bytes_of
    from torchkit.workloads.workload import model_template

    # parameter shapes are all it needs: the template the estimator copies (on the meta device, or built on the
    # CPU where the constructor reads values, as Ultralytics' stride probe does; torchkit.workloads.construct)
    sizes = gradient_bytes_of(model_template(workload_for(job)))
    if not sizes:
        raise ValueError(f"{job.model} has no parameter that requires grad: nothing to synchronise")
    if path is not None:
        _write(path, sizes)
    return sizes, _source(job, sizes)


def _source(job: JobSpec, sizes: tuple[int, ...]) -> str:
    """The same whether the layout was built now or read from the cache: a warm plan equals the cold one."""
    return f"{job.model}: {len(sizes)} gradient tensors (the model's parameter shapes)"
