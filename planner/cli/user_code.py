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


def user_code_summary(job: JobSpec) -> str | None:
    """One sentence naming the module, its file and the factory a job runs; None for a built-in workload."""
    if ":" not in job.model:
        return None
    module, _, factory = job.model.partition(":")
    top = module.split(".", 1)[0]
    # where the import will find it: sys.path first, then the working directory (searched last, so a file
    # there never replaces an installed or standard module); found without importing anything
    spec = importlib.machinery.PathFinder.find_spec(top, [*sys.path, os.getcwd()])
    if spec is None:
        where = "not found on the import path or in the working directory"
    elif spec.origin and spec.origin != "namespace":
        where = f"from {spec.origin}" if top == module else f"from package {spec.origin}"
    else:
        where = f"from {', '.join(spec.submodule_search_locations or [])}"
    return (
        f"user code: importing module {module!r} ({where}) and calling {factory}() to build the model, here and "
        "in every probe"
    )


def announce_user_code(job: JobSpec) -> str | None:
    """Write the summary on stderr (once per run); returns it."""
    summary = user_code_summary(job)
    if summary:
        sys.stderr.write(summary + "\n")
    return summary
