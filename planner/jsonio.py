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
#: a JSON string literal (with escapes), blanked out before brackets are counted
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_OPEN = np.frombuffer(b"[{", dtype=np.uint8)
_CLOSE = np.frombuffer(b"]}", dtype=np.uint8)
#: text counted at a time by ``json_depth``
_DEPTH_CHUNK_BYTES = 4 * 2**20


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
            raw = handle.read(max_bytes + 1)  # a file that grew since stat is still refused, never read whole
    except OSError as exc:
        raise ConfigError(f"{what} {source} cannot be read: {exc.strerror or exc} ({fix})") from None
    if len(raw) > max_bytes:
        raise ConfigError(f"{what} {source} is over the limit of {max_bytes} bytes ({fix})")
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
    """Deepest bracket nesting of JSON text, strings ignored; linear time, no recursion, and memory of a few
    times ``_DEPTH_CHUNK_BYTES`` beyond the text (a file of 127 MiB of spaces must not cost gigabytes)."""
    blanked = _JSON_STRING.sub(b'""', data)
    codes = np.frombuffer(blanked, dtype=np.uint8)
    depth = deepest = 0
    for start in range(0, len(codes), _DEPTH_CHUNK_BYTES):
        chunk = codes[start:start + _DEPTH_CHUNK_BYTES]
        steps = np.isin(chunk, _OPEN).astype(np.int8) - np.isin(chunk, _CLOSE).astype(np.int8)
        levels = np.cumsum(steps, dtype=np.int64)
        if levels.size:
            deepest = max(deepest, depth + int(levels.max()))
            depth += int(levels[-1])
    return deepest


def check_tree(doc: Any, where: str, *, max_depth: int = MAX_JSON_DEPTH) -> None:
    """The rules of ``loads_strict`` for a document already in memory: depth, finite numbers, string keys,
    no control characters. Iterative, so no depth of input can overflow the stack."""
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
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _StrictnessError(f"the key {key!r} appears twice in one object")
        result[key] = value
    return result
