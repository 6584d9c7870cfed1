"""Reading JSON that someone else may have written (plan.json, profile-cache entries) without trusting it.

``json.loads`` alone accepts ``NaN`` and ``Infinity``, turns ``1e400`` into ``inf``, keeps the last of two
duplicate keys, and recurses once per nesting level (a file of 100,000 ``[`` ends in ``RecursionError``).
Here the limits are checked before anything is parsed, and what is parsed is strict:

- the file is at most ``max_bytes`` (checked with ``stat``, before it is read);
- nesting is at most ``max_depth`` levels (counted over the raw text, strings blanked out, before parsing);
- every number is finite and every key unique.

``check_tree`` checks a document in memory (parsed, or a plan passed as a mapping): the same depth limit,
finite numbers, and strings free of control characters (a newline or an ANSI escape in a node name would
forge lines in a table or a shell script).
Pure Python + numpy; every failure is a ``ConfigError`` naming the source and the limit.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from planner.errors import ConfigError

#: nesting a batchplan document needs: plan -> profiles -> key -> memory_points -> point is 5 levels; 32 is
#: far beyond any document we write and far below Python's recursion limit (1000)
MAX_JSON_DEPTH = 32

#: C0 controls, DEL and C1 controls: none belongs in a name, a reason or a launch line
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
#: a lone UTF-16 surrogate (JSON's ``"\ud800"``): valid JSON, but no terminal or file can encode it as UTF-8
_SURROGATE = re.compile("[\ud800-\udfff]")
_BAD_TEXT = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_QUOTE, _OPEN_CURLY = ord('"'), ord("{")  # ord("[") | 0x20 == ord("{"); ] and } stay apart from both
#: every byte but a quote and the four brackets: what ``json_depth`` drops
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')


def read_json_file(path: str | os.PathLike, *, what: str, max_bytes: int, fix: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Read ``path`` as strict JSON within the limits (see the module docstring).

    Args:
        what: the kind of file for messages (``"plan file"``).
        max_bytes: largest accepted file size.
        fix: the advice appended to every error (``"regenerate it with batchplan plan"``).

    Raises:
        ConfigError: missing, not a regular file, too large, too deep, not JSON, or not strict.
    """
    raw = read_limited_bytes(path, what=what, max_bytes=max_bytes, fix=fix)
    return loads_strict(raw, source=f"{what} {Path(path)}", fix=fix, max_depth=max_depth)


def read_limited_bytes(path: str | os.PathLike, *, what: str, max_bytes: int, fix: str) -> bytes:
    """The bytes of the regular file ``path``, refused by its size (``stat``) before any is read.

    Raises:
        ConfigError: missing, not a regular file, too large, or unreadable.
    """
    source = Path(path)
    try:
        info = source.stat()
    except FileNotFoundError:
        raise ConfigError(f"{what} {source} does not exist ({fix})") from None
    except OSError as exc:
        raise ConfigError(f"{what} {source} cannot be read: {exc.strerror or exc} ({fix})") from None
    if not source.is_file():
        raise ConfigError(f"{what} {source} is not a regular file ({fix})")
    if info.st_size > max_bytes:
        raise ConfigError(
            f"{what} {source} is {info.st_size} bytes, over the limit of {max_bytes} bytes ({fix})"
        )
    try:
        with source.open("rb") as handle:
            return read_at_most(handle, max_bytes, what=f"{what} {source}", fix=fix)
    except OSError as exc:
        raise ConfigError(f"{what} {source} cannot be read: {exc.strerror or exc} ({fix})") from None


def read_at_most(handle: Any, max_bytes: int, *, what: str, fix: str) -> bytes:
    """The rest of an open binary file, refused when it holds more than ``max_bytes`` (checked on what is read: a
    file that grew since its size was checked is still refused, never read whole).

    Raises:
        ConfigError: over the limit, or unreadable.
    """
    try:
        raw = handle.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigError(f"{what} cannot be read: {exc.strerror or exc} ({fix})") from None
    if len(raw) > max_bytes:
        raise ConfigError(f"{what} is over the limit of {max_bytes} bytes ({fix})")
    return raw


def loads_strict(raw: bytes | str, *, source: str, fix: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse strict JSON text within ``max_depth`` (see the module docstring)."""
    data = raw.encode() if isinstance(raw, str) else raw
    depth = json_depth(data)
    if depth > max_depth:
        raise ConfigError(f"{source} is nested {depth} levels deep, over the limit of {max_depth} ({fix})")
    try:
        text = data.decode("utf-8")
        return json.loads(
            text, parse_constant=_reject_constant, parse_float=_finite_float, object_pairs_hook=_unique_keys
        )
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source} is not valid JSON: not UTF-8 text ({exc}) ({fix})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source} is not valid JSON: {exc} ({fix})") from None
    except _StrictnessError as exc:
        raise ConfigError(f"{source}: {exc} ({fix})") from None
    except ValueError as exc:  # an integer literal of more digits than Python converts (sys.int_info)
        raise ConfigError(f"{source} holds a number batchplan does not accept: {exc} ({fix})") from None


def json_depth(data: bytes) -> int:
    """Deepest bracket nesting of JSON text, brackets inside strings ignored; linear time, no recursion.

    Escaped backslashes and quotes (``\\\\``, ``\\"``, read left to right as JSON reads them) are blanked first,
    then every byte but quotes and brackets is dropped (``bytes.translate``, in C): a string is what lies
    between two quotes of what is left. A 33 MB plan takes a tenth of a second, 127 MiB of spaces a few
    hundred MiB of memory (it took 2.4 GiB with a regular expression and an integer per byte)."""
    unescaped = data.replace(b"\\\\", b"__").replace(b'\\"', b"__")
    codes = np.frombuffer(unescaped.translate(None, delete=_NOT_STRUCTURE), dtype=np.uint8)
    outside = np.cumsum(codes == _QUOTE) % 2 == 0  # a quote's own position counts as inside: it is no bracket
    brackets = codes[outside & (codes != _QUOTE)]
    steps = np.where(brackets | 0x20 == _OPEN_CURLY, 1, -1).astype(np.int64)  # [ { open, ] } close
    return int(np.cumsum(steps).max(initial=0))


def check_tree(doc: Any, where: str, *, max_depth: int = MAX_JSON_DEPTH) -> None:
    """The rules of ``loads_strict`` for a document already in memory: depth, finite numbers, string keys,
    no control characters or lone surrogates. Iterative, so no depth of input can overflow the stack.

    A clean document is recognised in one pass over plain values with one search over all its text
    (a 65,536-rank plan holds 1.5 million strings); only a document with a problem is walked again, with
    paths, for the message naming it."""
    if not _is_clean(doc, max_depth):
        _check_tree_naming_the_problem(doc, where, max_depth=max_depth)


def _is_clean(doc: Any, max_depth: int) -> bool:
    """True when ``doc`` is plain JSON data (dict, list, str, int, finite float, bool, None; tuples too) within
    ``max_depth`` whose strings are clean; False when it may not be (then the slow walk decides)."""
    texts: list[str] = []
    level, depth = [doc], 0
    while level:
        if depth > max_depth:
            return False
        below: list[Any] = []
        for value in level:
            kind = type(value)
            if kind is str:
                texts.append(value)
            elif kind is dict:
                texts.extend(value)
                below.extend(value.values())
            elif kind is list or kind is tuple:
                below.extend(value)
            elif kind is float:
                if not math.isfinite(value):
                    return False
            elif not (kind is int or kind is bool or value is None):
                return False
        level, depth = below, depth + 1
    try:
        joined = " ".join(texts)
    except TypeError:  # a key that is not a string
        return False
    return _BAD_TEXT.search(joined) is None


def _check_tree_naming_the_problem(doc: Any, where: str, *, max_depth: int) -> None:
    stack: list[tuple[Any, str, int]] = [(doc, where, 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > max_depth:
            raise ConfigError(f"{where} is nested more than {max_depth} levels deep (at {path})")
        if isinstance(value, bool) or value is None or isinstance(value, int):
            continue
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ConfigError(f"{path} is {value!r}; every number must be finite")
        elif isinstance(value, str):
            check_text(value, path)
        elif isinstance(value, Mapping):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise ConfigError(f"{path} has a key {key!r} that is not a string")
                check_text(key, f"{path} key")
                stack.append((item, f"{path}.{key}", depth + 1))
        elif isinstance(value, (list, tuple)):
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))
        else:
            raise ConfigError(f"{path} is a {type(value).__name__}, which JSON cannot hold")


def check_text(text: str, where: str) -> None:
    """``text`` holds no control character (newline, tab, escape, ...) and no lone surrogate."""
    found = _CONTROL.search(text)
    if found:
        raise ConfigError(f"{where} holds the control character {found.group()!r} in {text[:60]!r}")
    found = _SURROGATE.search(text)
    if found:
        raise ConfigError(
            f"{where} holds the lone surrogate {found.group()!r} in {text[:60]!r}, which is not text (UTF-8 cannot "
            "encode it)"
        )


class _StrictnessError(ValueError):
    pass


def _reject_constant(name: str) -> float:
    raise _StrictnessError(f"{name} is not a number batchplan accepts; every number must be finite")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _StrictnessError(f"the number {text[:40]} overflows to {value}; every number must be finite")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise _StrictnessError(f"the key {twice!r} appears twice in one object")
    return result
