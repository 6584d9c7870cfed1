#!/usr/bin/env python3
"""Assertions per test file at two git revisions, to check that a change to the tests asserts no less.

Usage: python .ci/assertion_counts.py BASE [HEAD]   (HEAD defaults to the working tree)

Counted per file under tests/: ``assert`` statements, ``pytest.raises``/``pytest.warns``/``pytest.fail`` calls
and calls of the shared checking helpers (a function whose name starts with ``assert_`` or ``check_``).
Prints every file whose count changed, the totals, and exits 1 if any file's count fell (each fall must then be
a removed duplicate, named in the change's note).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RAISING = {"raises", "warns", "fail", "deprecated_call"}


def count(source: str) -> int:
    n = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assert):
            n += 1
        elif isinstance(node, ast.Call):
            func = node.func
            name = (
                func.attr
                if isinstance(func, ast.Attribute)
                else func.id
                if isinstance(func, ast.Name)
                else ""
            )
            owner = (
                func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
            )
            if (owner == "pytest" and name in RAISING) or name.startswith(("assert_", "check_")):
                n += 1
    return n


def counts_at(rev: str | None) -> dict[str, int]:
    if rev is None:
        files = [str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("*.py")]
        return {f: count((REPO / f).read_text()) for f in files}
    listing = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, "tests/"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    out = {}
    for f in listing:
        if f.endswith(".py"):
            text = subprocess.run(
                ["git", "show", f"{rev}:{f}"], cwd=REPO, check=True, capture_output=True, text=True
            ).stdout
            out[f] = count(text)
    return out


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(__doc__, file=sys.stderr)
        return 2
    before = counts_at(argv[0])
    after = counts_at(argv[1] if len(argv) == 2 else None)
    fell = 0
    print(f"{'file':70} {'before':>6} {'after':>6}")
    for f in sorted(set(before) | set(after)):
        b, a = before.get(f, 0), after.get(f, 0)
        if a != b:
            mark = "  FELL" if a < b else ""
            fell += a < b
            print(f"{f:70} {b:6} {a:6}{mark}")
    print(f"{'total':70} {sum(before.values()):6} {sum(after.values()):6}")
    return 1 if fell else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
