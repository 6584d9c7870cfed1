"""Saying, before it happens, that a run imports and runs the user's code (``--model package.module:factory``).

Building the model means importing the user's module and calling its factory, in this process (for the
profile key) and in every probe. That is the point of a factory, but it should never be a surprise: one
line on stderr names the module, the file it will come from, and the factory; ``preflight`` also lists it
among its checks, so a scheduler's log records what was run.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys

from planner.job import JobSpec

#: model sources of the libraries (``torchkit.workloads.LIBRARY_PREFIXES``) -> how each builds a model by name
LIBRARY_BUILDERS = {
    "timm:": "timm.create_model({name!r}, pretrained=False)",
    "torchvision:": "torchvision.models.get_model({name!r}, weights=None)",
    "hf:": "transformers' {name} model from its config, fresh weights",
    "ultralytics:": "ultralytics' DetectionModel({name!r})",
}


def library_model_summary(job: JobSpec) -> str | None:
    """One sentence saying a job's model comes from a model library (``timm:convnext_tiny``), or None."""
    for prefix, builder in LIBRARY_BUILDERS.items():
        if job.model.startswith(prefix):
            name = job.model[len(prefix) :]
            return f"library model: {job.model}, built with {builder.format(name=name)} (nothing downloaded)"
    return None


def user_code_summary(job: JobSpec, where: str = "here and in every probe") -> str | None:
    """One sentence naming the module, its file and the factory a job runs (``where``: in which processes);
    None for a built-in workload or a library model (:func:`library_model_summary`)."""
    if ":" not in job.model or library_model_summary(job) is not None:
        return None
    module, _, factory = job.model.partition(":")
    top = module.split(".", 1)[0]
    # where the import will find it: sys.path first, then the working directory (searched last, so a file
    # there never replaces an installed or standard module); found without importing anything
    spec = importlib.machinery.PathFinder.find_spec(top, [*sys.path, os.getcwd()])
    if spec is None:
        found = "not found on the import path or in the working directory"
    elif spec.origin and spec.origin != "namespace":
        found = f"from {spec.origin}" if top == module else f"from package {spec.origin}"
    else:
        found = f"from {', '.join(spec.submodule_search_locations or [])}"
    return f"user code: importing module {module!r} ({found}) and calling {factory}() to build the model, {where}"


def announce_user_code(job: JobSpec, where: str = "here and in every probe") -> str | None:
    """Write the summary on stderr (once per run); returns it."""
    summary = user_code_summary(job, where) or library_model_summary(job)
    if summary:
        sys.stderr.write(summary + "\n")
    return summary
