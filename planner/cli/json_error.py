"""Under ``--json`` a failed run still gives its reader one JSON document on stdout.

A scheduler that runs ``batchplan plan --json`` (or ``preflight``, ``profile``, ``devices``, ``catalog``,
``show``) parses stdout; an empty stdout after a failure (a probe killed mid-estimate, an infeasible job, a
bad flag) is a second error on its side. So ``main`` prints, for every run that ends with an error instead of
its result::

    {"schema": "batchplan/error@1", "command": "plan", "error": "<the stderr line without 'error: '>",
     "exit_code": 1}

and the usual one ``error:`` line on stderr. Nothing is printed when the command has already written to stdout
(a result cut short by a full device: a second document would make the first unreadable). A run that ends
with its own result and exit 1 (``preflight`` no-go, ``profile`` where nothing fits) prints that result, not
this.
"""

from __future__ import annotations

import contextlib
import json
import sys

ERROR_SCHEMA = "batchplan/error@1"


def wants_json(argv: list[str]) -> bool:
    """Whether the command line asks for JSON (read from the words, for errors found while parsing them)."""
    return "--json" in argv


def error_document(command: str | None, message: str, exit_code: int) -> dict:
    """The ``batchplan/error@1`` document of a failed run."""
    return {"schema": ERROR_SCHEMA, "command": command, "error": message, "exit_code": exit_code}


def print_error_document(command: str | None, message: str, exit_code: int) -> None:
    """Write the error document on stdout, unless stdout already holds something or cannot be written."""
    from planner.cli.stdout_guard import stdout_written

    if stdout_written():
        return
    with contextlib.suppress(OSError, ValueError):  # stdout gone too: the stderr line is all there is
        sys.stdout.write(json.dumps(error_document(command, message, exit_code), indent=2) + "\n")
        sys.stdout.flush()
