"""The gradient layout of a job's model (bytes of each parameter's gradient, registration order), for the
synchronisation model: parameter shapes only, from the model template the estimator uses (built on the meta
device, or on the CPU where its constructor reads values), kept in the cache directory (``planner.store``,
namespace ``gradients``) under the workload's fingerprint, so a warm plan imports no torch for it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Annotated

from planner.codec import Meta, convert
from planner.errors import ConfigError
from planner.job import JobSpec
from planner.store import CacheStore, Namespace

Layout = Annotated[tuple[Annotated[int, Meta(gt=0)], ...], Meta(min_length=1)]


def _key(inputs: Mapping[str, str]) -> str:
    """The file name the release before the store gave a layout (its entries keep theirs)."""
    return hashlib.sha256(
        repr((inputs["model"], inputs["fingerprint"], inputs["torch_version"])).encode()
    ).hexdigest()[:24]


def _legacy(document: object, where: str) -> tuple[tuple[int, ...], None]:
    """An entry of the release before the store: ``{"grad_bytes": [...]}``."""
    if not isinstance(document, dict):
        raise ConfigError(f"{where} is not a JSON object")
    return convert(Layout, document.get("grad_bytes"), where=f"{where}: grad_bytes"), None


GRADIENTS: Namespace[tuple[int, ...]] = Namespace(
    what="gradient layout cache entry",
    folder="gradients",
    schema="batchplan/gradient-layout-cache@1",
    payload="grad_bytes",
    value_type=Layout,
    key_of=_key,
    redo="building the model's parameter shapes again",
    legacy=_legacy,
)


def gradient_layout(
    job: JobSpec, identity: tuple[str, str], store: CacheStore | None
) -> tuple[tuple[int, ...], str]:
    """(gradient bytes per parameter that requires grad, where they come from) for ``job``'s model.

    ``identity``: ``planner.obtain.job_fingerprint(job)``, the cache key. A cache that cannot be written costs
    a rebuild next time, nothing else. Raises whatever building the model raises (the caller reports it and
    plans without the synchronisation)."""
    inputs = {"model": job.model, "fingerprint": identity[0], "torch_version": identity[1]}
    sizes = store.read(GRADIENTS, _key(inputs)) if store is not None else None
    if sizes is None:
        from planner.obtain.make import workload_for
        from torchkit.estimate.ddp_sync import gradient_bytes_of
        from torchkit.workloads.workload import model_template

        # parameter shapes are all it needs: the template the estimator copies (on the meta device, or built on the
        # CPU where the constructor reads values, as Ultralytics' stride probe does; torchkit.workloads.construct)
        sizes = gradient_bytes_of(model_template(workload_for(job)))
        if not sizes:
            raise ValueError(f"{job.model} has no parameter that requires grad: nothing to synchronise")
        if store is not None:
            try:
                store.write(GRADIENTS, inputs, sizes)
            except ConfigError as exc:
                store.problems.append(f"{exc}; the gradient layout is built again next time")
    # the same whether built now or read from the cache: a warm plan equals the cold one
    return sizes, f"{job.model}: {len(sizes)} gradient tensors (the model's parameter shapes)"
