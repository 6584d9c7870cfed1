"""``torchkit/terminal_text.py``: text from outside shown on a terminal with every character that could act on
it escaped (issue #34: ESC, forged ``error:`` lines, U+202E)."""

from __future__ import annotations

import pytest

from torchkit.terminal_text import printable


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("ok\x1b[2J", "ok\\x1b[2J"),
        ("boom\nerror: forged", "boom\\nerror: forged"),
        ("T4\u202eevil", "T4\\u202eevil"),
        ("zero\u200bwidth", "zero\\u200bwidth"),
        ("bell\x07\x7f\x9b", "bell\\x07\\x7f\\x9b"),
        ("lone \udcff", "lone \\udcff"),
        ("para\u2029graph", "para\\u2029graph"),
        ("µs ± σ × 2", "µs ± σ × 2"),
    ],
)
def test_printable_escapes_what_could_act_on_a_terminal_and_nothing_else(text: str, shown: str) -> None:
    assert printable(text) == shown


def test_printable_cuts_long_text_before_escaping() -> None:
    assert printable("a" * 50 + "\x1b", max_chars=10) == "a" * 10 + "..."
    assert printable("ab\x1b", max_chars=10) == "ab\\x1b"
