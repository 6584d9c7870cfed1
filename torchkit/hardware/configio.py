"""Strict YAML reading for batchplan's config files (the GPU catalog, cluster configs).

The helpers (``ConfigLocation``, ``read_yaml_file``, ``expect_*``) that ``torchkit.hardware.catalog`` and
``planner.cluster`` share: duplicate and unknown keys are errors, and every error names the file, the path
inside it (``nodes[1].gpus[0].type``) and the fix.

Pure Python + PyYAML (no torch).
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from torchkit.errors import ConfigError
from torchkit.hardware.yaml_limits import DocumentLimits, YamlLimitError, check_yaml_limits
from torchkit.terminal_text import needs_escaping, printable

#: largest config file read: the biggest shipped config is a few KiB, a 5,000-node one about 400 KiB
MAX_CONFIG_BYTES = 16 * 2**20
#: deepest nesting of a config: a cluster config needs 5 levels (nodes, node, gpus, entry, value); PyYAML
#: composes recursively, so a few thousand '[' would otherwise end in RecursionError (checked on the event
#: stream, ``torchkit.hardware.yaml_limits``)
MAX_YAML_DEPTH = 32
#: a float in exponent notation without a '.' or a sign in the exponent (``1e3``, ``1.0e300``): YAML 1.2 and
#: JSON read it as a number, YAML 1.1 (PyYAML) as a string
_EXPONENT_FLOAT = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)[eE][-+]?\d+")


@dataclass(frozen=True)
class ConfigLocation:
    """Where a value sits: the file (or a label) and the path inside it, for error messages."""

    source: str
    """file name or label, e.g. ``cluster_configs/demo-mixed.yaml``"""
    path: str = ""
    """path inside the document, e.g. ``nodes[1].gpus[0].type``; empty for the top level"""

    def key(self, name: object) -> ConfigLocation:
        """The location of mapping key ``name`` below this one."""
        return ConfigLocation(self.source, f"{self.path}.{name}" if self.path else str(name))

    def index(self, i: int) -> ConfigLocation:
        """The location of list item ``i`` below this one."""
        return ConfigLocation(self.source, f"{self.path}[{i}]")

    def error(self, message: str) -> ConfigError:
        """A ConfigError ``<file>: <path>: <message>``."""
        return ConfigError(
            f"{self.source}: {self.path}: {message}" if self.path else f"{self.source}: {message}"
        )


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml's parser where PyYAML has it
    """SafeLoader that rejects duplicate keys (PyYAML silently keeps the last one)."""


def _construct_strict_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges may be overridden on purpose
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first_line = seen.get(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                "found an unhashable key",
                key_node.start_mark,
            ) from None
        if first_line is not None:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r} (first defined on line {first_line + 1}; keep one)",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line
    loader.flatten_mapping(node)
    return dict(loader.construct_pairs(node, deep=True))


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_strict_mapping)


def parse_yaml_text(
    text: str,
    source: str,
    *,
    limits: DocumentLimits | None = None,
) -> Any:
    """Parse YAML text strictly: no duplicate keys, and every limit of ``torchkit.hardware.yaml_limits``
    (``MAX_YAML_DEPTH`` levels, aliases bounded in count and expanded size, and ``limits``: entries per
    collection, a total) checked on the event stream before anything is composed.
    A syntax error becomes a ConfigError with its line, a limit one naming the limit."""
    try:
        check_yaml_limits(text, max_depth=MAX_YAML_DEPTH, limits=limits)
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no arbitrary objects
    except YamlLimitError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = exc.problem or exc.context or "invalid YAML"
        raise ConfigError(f"{where}: YAML syntax error: {problem} (fix the YAML on that line)") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: YAML error: {exc} (fix the YAML)") from None
    except ValueError as exc:  # an integer of more digits than Python converts (sys.int_info)
        raise ConfigError(f"{source}: a value batchplan cannot read: {exc} (fix the YAML)") from None


def read_yaml_file(
    path: str | os.PathLike[str],
    what: str,
    *,
    limits: DocumentLimits | None = None,
) -> Any:
    """Read and parse a YAML file; a missing, unreadable or malformed file is a ConfigError.

    ``what`` names the kind of file for the message (``"cluster config"``, ``"GPU catalog"``); ``limits``
    bounds what it may hold (``parse_yaml_text``).
    """
    file_path = Path(path)
    if not file_path.exists():
        raise ConfigError(f"{what} {file_path} does not exist (check the path)")
    if not file_path.is_file():
        raise ConfigError(f"{what} {file_path} is not a file (give the path of a .yaml file)")
    size = file_path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{what} {file_path} is {size} bytes, over the limit of {MAX_CONFIG_BYTES} bytes (is it the right file?)"
        )
    try:
        text = file_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"{what} {file_path} cannot be read: {exc} (check its permissions and encoding)"
        ) from None
    return parse_yaml_text(text, str(file_path), limits=limits)


def expect_mapping(
    value: Any,
    where: ConfigLocation,
    *,
    required: Mapping[str, str],
    optional: Sequence[str] = (),
    what: str = "a mapping",
) -> dict[str, Any]:
    """Check that ``value`` is a mapping with string keys, all of ``required`` present and no others.

    ``required`` maps each required key to a hint shown when it is missing (``"e.g. name: node-a"``).
    """
    if not isinstance(value, dict):
        raise where.error(f"expected {what}, got {describe_value(value)}")
    allowed = [*required, *optional]
    unknown = [key for key in value if not isinstance(key, str) or key not in allowed]
    if len(unknown) == 1:
        key = unknown[0]
        close = _closest_key(key, allowed) if isinstance(key, str) else None
        hint = f"; did you mean {close!r}?" if close else ""
        raise where.key(key).error(f"unknown key {key!r} (allowed keys: {', '.join(allowed)}{hint})")
    if unknown:  # every one at once: fixing them one run at a time is a chore
        named = []
        for key in unknown:
            close = _closest_key(key, allowed) if isinstance(key, str) else None
            named.append(f"{key!r}" + (f" (did you mean {close!r}?)" if close else ""))
        raise where.error(f"unknown keys {', '.join(named)} (allowed keys: {', '.join(allowed)})")
    for key, hint in required.items():
        if key not in value:
            raise where.key(key).error(f"missing required key {key!r} ({hint})")
    return value


def _closest_key(key: str, allowed: Sequence[str]) -> str | None:
    """The allowed key a misspelt ``key`` most likely meant: a shared stem first (``cpus`` ->
    ``cpu_count``), else the most similar spelling (``gpu`` -> ``gpus``)."""
    prefixed = [name for name in allowed if len(os.path.commonprefix([key, name])) >= 3]
    if prefixed:
        return max(prefixed, key=lambda name: len(os.path.commonprefix([key, name])))
    close = difflib.get_close_matches(key, allowed, n=1)
    return close[0] if close else None


def expect_str(value: Any, where: ConfigLocation) -> str:
    """A non-empty string (YAML reads ``yes``/``1``/``1.0`` as other types: quote them) of one line of visible
    text: no control, format or separator character (a newline in an offer's ``source:`` became live YAML in the
    cluster file ``advise`` writes; ESC or U+202E in a GPU type name drove the terminal that showed it)."""
    if not isinstance(value, str) or not value.strip():
        raise where.error(f"expected a non-empty string, got {describe_value(value)} (quote it if needed)")
    text = value.strip()
    found = next((c for c in text if needs_escaping(c)), None)
    if found is not None:
        raise where.error(
            f"'{printable(text, max_chars=80)}' holds the character {printable(found)} (a name or "
            "source is one line of visible text: remove it)"
        )
    return text


def expect_int(
    value: Any,
    where: ConfigLocation,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    hint: str = "",
) -> int:
    """An integer (not a bool, not a float) in ``[minimum, maximum]``."""
    suffix = f" ({hint})" if hint else ""
    if isinstance(value, bool) or not isinstance(value, int):
        raise where.error(f"expected an integer, got {describe_value(value)}{suffix}")
    if minimum is not None and value < minimum:
        raise where.error(f"must be at least {minimum}, got {value}{suffix}")
    if maximum is not None and value > maximum:
        raise where.error(f"must be at most {maximum}, got {describe_value(value)}{suffix}")
    return value


def expect_number(
    value: Any,
    where: ConfigLocation,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    positive: bool = False,
    hint: str = "",
) -> float:
    """A finite int or float (not a bool) within ``[minimum, maximum]``, > 0 if ``positive``.

    ``1e3`` or ``1.0e300``, which YAML 1.1 reads as strings, are taken as the numbers they spell."""
    suffix = f" ({hint})" if hint else ""
    if isinstance(value, str) and _EXPONENT_FLOAT.fullmatch(value.strip()):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise where.error(f"expected a number, got {describe_value(value)}{suffix}")
    if positive and value <= 0:
        raise where.error(f"must be greater than 0, got {value}{suffix}")
    if minimum is not None and value < minimum:
        raise where.error(f"must be at least {minimum}, got {value}{suffix}")
    if maximum is not None and value > maximum:
        raise where.error(f"must be at most {maximum}, got {value}{suffix}")
    return float(value)


def expect_list(value: Any, where: ConfigLocation, *, what: str = "a list", non_empty: bool = True) -> list:
    """A YAML sequence; empty is an error when ``non_empty``."""
    if not isinstance(value, list):
        raise where.error(f"expected {what}, got {describe_value(value)}")
    if non_empty and not value:
        raise where.error(f"is empty (expected {what} with at least one entry)")
    return value


def describe_value(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, int) and value.bit_length() > 192:  # repr of a huge int is slow, or refused
        return f"int of about {int(value.bit_length() * math.log10(2))} digits"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"
