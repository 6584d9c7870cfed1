"""Entry point of the ``batchplan`` console script.

stdout carries the result (a table, or exact JSON with ``--json``); stderr carries logs and progress. A user
error is one line ``error: <what> (<how to fix>)`` and exit code 2 (1 for an infeasible plan or a failed
preflight); ``--debug`` shows the traceback too, with the same exit code. Ctrl-C and SIGTERM stop a run the
same way: one ``error:`` line, everything it started torn down, exit 128 + the signal (130, 143). Under
``--json`` every such failure also puts one ``batchplan/error@1`` document on stdout
(``planner.cli.json_error``). A closed stderr (a log piped to ``head``) drops the logs, not the run
(``planner.cli.log_stream``); a closed stdout after the files are written ends the run with 0 (the reader took
what it wanted), and no other broken pipe does.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import logging
import re
import sys
import traceback

from planner import __version__
from planner.cli import advise, catalog, devices, plan, preflight, profile, show
from planner.cli.options import flag_of
from planner.errors import FieldError, UserError
from torchkit.terminal_text import printable

# one module per command, each defining add_parser(subparsers) (which sets func=run) and run(args) -> int;
# each module imports its heavy parts (Ray, torch) inside run, so building the parser stays cheap
COMMANDS = (devices, profile, plan, preflight, show, catalog, advise)


#: flags whose value may start with "-" (a GPU selection such as -1,-1): argparse would take "-1,-1" for an
#: unknown option, so "--gpus -1,-1" is rewritten to "--gpus=-1,-1" before parsing
_SPEC_FLAGS = ("--gpus", "--select", "--device")
_SPEC_VALUE = re.compile(r"^-\d+(,-?\d+)*$")


def _join_spec_values(argv: list[str]) -> list[str]:
    joined: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token in _SPEC_FLAGS and i + 1 < len(argv) and _SPEC_VALUE.match(argv[i + 1]):
            joined.append(f"{token}={argv[i + 1]}")
            i += 2
            continue
        joined.append(token)
        i += 1
    return joined


class _UsageError(SystemExit):
    """A bad command line, already reported on stderr; ``message`` is that line without ``error: ``."""

    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = message


class _ArgumentParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in our one-line format with exit code 2: an unknown flag with the
    command's flags it most likely meant, and the command's own help (not ``batchplan --help``)."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        parsed, extras = super().parse_known_args(args, namespace)
        commands = self._commands()
        if extras and commands:  # the top-level parser: the unknown words belong to the command given
            command = commands.get(getattr(parsed, "command", None) or "")
            if command is not None:
                command.error(
                    f"unrecognized arguments: {' '.join(extras)}", hint=_did_you_mean(extras, command)
                )
        return parsed, extras

    def _commands(self) -> dict[str, argparse.ArgumentParser]:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}

    def error(self, message: str, hint: str = "") -> None:  # type: ignore[override]
        line = f"{message} ({hint}see '{self.prog} --help')"
        sys.stderr.write(f"error: {line}\n")
        raise _UsageError(line)


def _did_you_mean(words: list[str], parser: argparse.ArgumentParser) -> str:
    """``did you mean --global-batch? `` for the unknown flags among ``words``: the command's flags spelt alike
    (``--global_batch``, ``--noray``) or sharing a word with it (``--batch-size``: ``--global-batch``)."""
    flags = sorted({s for a in parser._actions for s in a.option_strings if s.startswith("--")})
    found: list[str] = []
    for word in words:
        if not word.startswith("--"):
            continue
        wanted = word.split("=", 1)[0].lower().replace("_", "-")
        if wanted in flags:  # --global_batch: the same flag, spelt with underscores
            close = [wanted]
        else:
            close = difflib.get_close_matches(wanted, flags, n=2, cutoff=0.75)
            words_of = {w for w in wanted.strip("-").split("-") if len(w) >= 5}  # "batch", not "size" or "no"
            close += [f for f in flags if words_of & set(f.strip("-").split("-"))]
        found.extend(f for f in close if f not in found)
    return f"did you mean {' or '.join(found[:3])}? " if found else ""


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(
        prog="batchplan",
        description="Cluster-aware batch planner for PyTorch DDP on mixed GPUs.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_ArgumentParser)
    for command in COMMANDS:
        command.add_parser(sub)
    for command_parser in sub.choices.values():
        # also after the command (`batchplan plan --debug`); SUPPRESS keeps a --debug given before it
        command_parser.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks and debug logs"
        )
    return parser


def _version() -> str:
    return f"batchplan {__version__}"


def main(argv: list[str] | None = None) -> int:
    from planner.cli.log_stream import guarded_log_stream

    with guarded_log_stream():  # a closed stderr drops the logs, never the result (planner.cli.log_stream)
        code = _main(argv)
        if argv is None:  # this process is batchplan's own (the console script): nothing may keep it alive
            _leave_without_stray_threads(code)
    return code


def _parse_args(parser: argparse.ArgumentParser, words: list[str]) -> argparse.Namespace:
    """``words`` parsed; a bad command line, already reported on stderr, puts a ``batchplan/error@1`` document
    on stdout too under --json (``planner.cli.json_error``) before it raises ``_UsageError``."""
    from planner.cli.json_error import print_error_document, wants_json

    try:
        return parser.parse_args(_join_spec_values(words))
    except _UsageError as exc:
        if wants_json(words):
            named = {command.__name__.rsplit(".", 1)[-1] for command in COMMANDS}  # one module per command
            print_error_document(next((w for w in words if w in named), None), exc.message, 2)
        raise


def _interrupted(exc: KeyboardInterrupt, args: argparse.Namespace, as_json: bool, own_process: bool) -> int:
    """Ctrl-C, SIGTERM (``planner.cli.signals``) or a KeyboardInterrupt the model's code raised, said in one
    line (and a document under --json) once everything the run started is stopped: the exit code. In
    batchplan's own process (``own_process``) a signal ends it here, without the interpreter's teardown."""
    from planner.cli.json_error import print_error_document
    from planner.cli.signals import exit_code_and_line, raised_by_code

    if args.debug:
        traceback.print_exc()
    if raised_by_code(exc):  # no signal came: the model's code raised it (a factory), not the user
        message = printable(
            f"the code run for the model raised {type(exc).__name__}({str(exc)[:200]!r}) with "
            f"no Ctrl-C or signal (model {getattr(args, 'model', None)!r}: its factory must "
            "return the model); everything this run started was stopped"
        )
        sys.stderr.write(f"error: {message}\n")
        if as_json:
            print_error_document(args.command, message, 2)
        return 2
    code, line = exit_code_and_line(exc)
    sys.stderr.write(line + "\n")
    if as_json:
        print_error_document(args.command, line.removeprefix("error: "), code)
    if own_process:
        _exit_now(code)
    return code


def _main(argv: list[str] | None) -> int:
    from planner.cli.json_error import print_error_document
    from planner.cli.signals import handle_signals
    from planner.cli.stdout_guard import (
        forget_writes,
        guarded_result_stream,
        stdout_closed_by_reader,
        unusable_stdout,
    )

    problem = unusable_stdout()
    if problem is not None:  # `batchplan plan >&-`: the result has nowhere to go; said before any work
        if sys.stderr is not None:
            sys.stderr.write(f"error: {problem}\n")
        return 2
    forget_writes()
    handle_signals()
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    args = _parse_args(parser, words)
    _configure_logging(args.debug)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    absolute_paths(args)  # before any user code runs: a factory's os.chdir must not move the outputs
    as_json = bool(getattr(args, "json", False))
    try:
        with guarded_result_stream():
            code = int(args.func(args) or 0)
            sys.stdout.flush()  # a full device fails here, inside the error handling, not at interpreter exit
        return code
    except UserError as exc:
        if args.debug:
            traceback.print_exc()
        message = printable(exc.render(flag_of) if isinstance(exc, FieldError) else str(exc))
        sys.stderr.write(f"error: {message}\n")
        if as_json:
            print_error_document(args.command, message, exc.exit_code)
        return exc.exit_code
    except (
        KeyboardInterrupt
    ) as exc:  # Ctrl-C, or SIGTERM (planner.cli.signals): everything started is stopped
        return _interrupted(exc, args, as_json, own_process=argv is None)  # argv None: the console script
    except BrokenPipeError:
        if (
            not stdout_closed_by_reader()
        ):  # not the result's reader: a pipe of ours broke, the run did not finish
            raise
        # `batchplan plan | head`: the reader of the result went away after the files were written; what is
        # still buffered goes nowhere (not an "Exception ignored" at interpreter exit)
        _silence_stdout()
        return 0
    except (
        Exception
    ) as exc:  # a bug of ours: its traceback follows, and a --json reader still gets a document
        if as_json:
            print_error_document(args.command, f"internal error: {type(exc).__name__}: {exc}", 1)
        raise


class _PrintableFormatter(logging.Formatter):
    """Log lines with every control, format and separator character of their text escaped
    (``torchkit.terminal_text``): a log line quoting a path, a node name or a factory's message stays one line
    and never drives the terminal. A traceback (``--debug``) keeps its lines."""

    def format(self, record: logging.LogRecord) -> str:
        record.msg, record.args = printable(record.getMessage()), None
        return super().format(record)


def _configure_logging(debug: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        _PrintableFormatter("%(levelname)s %(name)s: %(message)s" if debug else "%(message)s")
    )
    logging.basicConfig(level=logging.DEBUG if debug else logging.INFO, handlers=[handler])


def absolute_paths(args: argparse.Namespace) -> None:
    """The file ``-o`` names, absolute from the working directory batchplan started in (``args.output_path``),
    before any user code runs: a factory that calls ``os.chdir`` sent a relative ``-o`` into its own directory.
    ``args.output`` keeps its spelling for the launch lines and messages that name it. (The working directory
    itself is put back after each call into user code: ``torchkit.workloads.user_models``.)"""
    import os

    output = getattr(args, "output", None)
    if isinstance(output, str) and output and not output.endswith(os.sep):
        args.output_path = os.path.abspath(output)


def _leave_without_stray_threads(code: int) -> None:
    """A thread user code started (a factory's non-daemon thread) kept the process alive forever after the
    result was printed: where one is left, say so and exit now, the result being decided."""
    import threading

    stray = [
        t.name
        for t in threading.enumerate()
        if t is not threading.main_thread() and not t.daemon and t.is_alive()
    ]
    if stray:
        shown = ", ".join(stray[:4]) + (", ..." if len(stray) > 4 else "")
        if sys.stderr is not None:
            sys.stderr.write(
                printable(
                    f"note: {len(stray)} thread(s) still running ({shown}) would keep batchplan "
                    "alive after its result: exiting without waiting for them"
                )
                + "\n"
            )
        _exit_now(code)


def _silence_stdout() -> None:
    import os

    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _exit_now(code: int) -> None:
    """Exit without the interpreter's finalization: the run's result is decided, so only the streams are
    flushed. After a Ray start cut short by a signal (everything it started already stopped and swept, see
    ``planner.probing.session``), Ray's half-initialised C++ state can crash the teardown (SIGSEGV after the
    ``error:`` line, seen once in 20 interrupted starts); after a fake pass cut short, collecting its tensors
    took 5 s after the ``error:`` line (and torch's exit hook logged its cache statistics)."""
    import os

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    raise SystemExit(main())
