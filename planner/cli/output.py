"""How results are shown: rich tables on a terminal, aligned plain text when piped, exact JSON with
``--json``. Results are computed elsewhere; this module only renders them (one table renderer for all)."""

from __future__ import annotations

import json
import operator
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from planner.errors import ConfigError
from torchkit.terminal_text import printable
from torchkit.units import GIB

#: a table of more rows than this is printed as plain text even on a terminal (rich takes minutes for 65,536)
RICH_MAX_ROWS = 2000


def format_gib(num_bytes: int | float | None, digits: int = 1) -> str:
    """Bytes as GiB (2^30) with ``digits`` decimals; ``-`` for unknown."""
    if num_bytes is None or num_bytes < 0:
        return "-"
    return f"{num_bytes / GIB:.{digits}f}"


def format_ms(seconds: float) -> str:
    """Seconds as milliseconds with the digits that matter: ``138``, ``3.2``, ``0.45`` (a small model's
    sub-millisecond step must not print as ``0``)."""
    ms = seconds * 1000
    return f"{ms:.0f}" if ms >= 10 else f"{ms:.1f}" if ms >= 1 else f"{ms:.2f}"


def print_json(obj: Any) -> None:
    """Exact JSON on stdout (sorted keys off: field order follows the schema)."""
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A table on stdout: rich when stdout is a terminal, plain aligned text otherwise (pipes, files, CI)."""
    # every cell escaped: a GPU type or node name from a file must not reorder (U+202E) or recolour the table
    cells = [[("" if c is None else printable(str(c))) for c in row] for row in rows]
    if sys.stdout.isatty() and len(cells) <= RICH_MAX_ROWS:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title)
        for name in columns:
            table.add_column(name)
        for row in cells:
            table.add_row(*row)
        Console().print(table)
        return
    # column by column, in C (a 65,536-rank plan is a table of 65,536 rows); as many columns as the shortest row
    count = min(len(columns), *map(len, cells)) if cells else len(columns)
    widths = [
        max(len(columns[i]), max(map(len, map(operator.itemgetter(i), cells)), default=0))
        for i in range(count)
    ]
    lines = [title] if title else []
    line = "  ".join(
        f"{{:<{w}}}" for w in widths
    ).format  # one format call a row: 65,536 rows in well under a second
    lines.extend(line(*row[: len(widths)]).rstrip() for row in [list(columns), *cells])
    sys.stdout.write("\n".join(lines) + "\n")


def echo(text: str = "") -> None:
    """A line of result text on stdout."""
    sys.stdout.write(text + "\n")


def note(text: str) -> None:
    """A log line on stderr (never mixed into the result), its control and format characters escaped
    (``torchkit.terminal_text``: a name from a file cannot forge lines or drive the terminal)."""
    sys.stderr.write(printable(text) + "\n")


def check_writable(flag: str, value: str) -> None:
    """``value`` of ``flag`` can become a file: not a directory (``newdir/`` names one, existing or not), no
    parent of it is a file, and its name is one the file system can hold."""
    path = Path(value)
    try:
        if value.endswith(os.sep) or path.is_dir():
            raise ConfigError(f"{flag} {value} is a directory (name a file, e.g. {path / 'plan.json'})")
        for parent in path.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise ConfigError(
                        f"{flag} {value}: {parent} is a file, not a directory (choose another path)"
                    )
                break
        limit = os.pathconf(_existing_parent(path), "PC_NAME_MAX")
    except OSError as exc:  # ENAMETOOLONG for a path over PATH_MAX, EACCES on a parent
        raise ConfigError(
            f"{flag} {value[:80]}...: {exc.strerror or exc} (choose a shorter or reachable path)"
        ) from None
    # the file is written to a temporary name beside it first (planner.files): ".NAME.XXXXXXXX.tmp"
    extra = len("..12345678.tmp")
    name_bytes = len(path.name.encode("utf-8", "surrogateescape"))
    if name_bytes + extra > limit or any(
        len(p.encode("utf-8", "surrogateescape")) > limit for p in path.parts
    ):
        raise ConfigError(
            f"{flag} names a file of {name_bytes} bytes, over what the file system holds ({limit} bytes "
            f"a name, less the {extra} a temporary name adds): choose a shorter name"
        )


def _existing_parent(path: Path) -> str:
    for parent in (path.parent, *path.parent.parents):
        if parent.exists():
            return str(parent)
    return "."
