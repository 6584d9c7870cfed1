"""Text from outside (a file, a command's answer, an exception of user code, an environment variable) made safe
to show on a terminal or write into a line-based file: every character that could move the cursor, recolour
the screen, start a new line, reorder what follows or hide itself is written as an escape instead.

``printable("ok\\x1b[2Jerror: x")`` is ``'ok\\\\x1b[2Jerror: x'``: the reader sees the escape, the terminal never
runs it, and a forged ``error:`` line stays inside the line that quotes it. Pure Python, no imports beyond the
standard library: every layer may call it.
"""

from __future__ import annotations

import unicodedata

#: Unicode categories escaped: controls (Cc: ESC, newline, DEL, C1), formats (Cf: the bidirectional overrides
#: U+202A-U+202E and isolates U+2066-U+2069, zero-width characters), lone surrogates (Cs), line and paragraph
#: separators (Zl, Zp: a new line to some terminals and most editors)
ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    if char in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def needs_escaping(char: str) -> bool:
    """Whether ``char`` is one :func:`printable` escapes."""
    return unicodedata.category(char) in ESCAPED_CATEGORIES


def printable(text: str, *, max_chars: int | None = None) -> str:
    """``text`` with every control, format, surrogate and separator character escaped (``\\x1b``, ``\\u202e``);
    longer than ``max_chars`` (counted before escaping) it is cut and ends with ``...``. Text that needs no
    escape comes back unchanged, so a message of plain words reads as it did."""
    cut = max_chars is not None and len(text) > max_chars
    shown = text[:max_chars] if cut else text
    if not any(needs_escaping(c) for c in shown):
        return shown + ("..." if cut else "")
    return "".join(_escape(c) if needs_escaping(c) else c for c in shown) + ("..." if cut else "")
