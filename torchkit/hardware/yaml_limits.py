"""Limits of a YAML document, checked on its event stream before anything is composed or built.

A YAML file under the byte limit can still cost gigabytes and minutes: an alias bomb (``&a [x, x, ...]``,
``&b [*a, *a, ...]``, nine levels of nine) is 524 bytes and expands to 9^10 scalars wherever the value is
walked (a node name printed in an error, a GPU count compared); 16,384 aliases of a 1 MiB name are 16 GiB
once rendered; a 16 MiB flow list under ``nodes:`` takes minutes to compose before its length is seen.

:func:`check_yaml_limits` reads the parser's events once (libyaml's C parser where PyYAML has it), keeps
no tree, and stops at the first limit passed:

- nesting: at most ``max_depth`` collections deep;
- aliases: at most ``MAX_YAML_ALIASES`` of them, and the document *expanded* (every alias replaced by what
  it names, counted as one unit per collection and per scalar, plus the scalar's characters) no larger than
  ``MAX_YAML_EXPANDED_UNITS``: an aliased file may not stand for more than an unaliased file under the byte
  limit could hold;
- entries: each collection at most as many entries as ``max_entries`` allows for its place in the document
  (a path pattern such as ``nodes`` or ``nodes[].gpus``), others at most ``default_max_entries``;
- a total: the sum of one key's integer values over the mappings at one place (``count:`` of every
  ``nodes[].gpus[]`` entry, 1 where it is absent) at most a :class:`TotalLimit`.

Pure Python + PyYAML (no torch).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import yaml

#: most aliases a document may use: a merge key (``<<: *defaults``) in every node of the largest cluster
#: config (16,384 nodes), four times over
MAX_YAML_ALIASES = 65_536
#: most a document may expand to with its aliases replaced, in units (one per scalar and collection, plus
#: each scalar's characters): about what a 16 MiB file without aliases can hold
MAX_YAML_EXPANDED_UNITS = 16 * 2**20

#: libyaml's event parser where PyYAML was built with it (about 20x faster than the pure-Python one)
_EVENT_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True, kw_only=True)
class TotalLimit:
    """A bound on the sum of one key's values over the mappings at one place of a document."""

    entries: str
    """path pattern of the mappings, e.g. ``nodes[].gpus[]``"""
    key: str
    """the key summed, e.g. ``count``; a value that is no plain integer is left to the schema checks"""
    default: int
    """what an entry without the key adds"""
    limit: int
    """largest sum allowed"""
    max_each: int
    """largest value one entry may add; a larger one is left to the schema check, whose message is the better
    one (``count: 5000000`` is over the per-node limit, whatever the total)"""
    what: str
    """what the sum counts, for the message (``GPUs``)"""


@dataclass(frozen=True, kw_only=True)
class DocumentLimits:
    """What one kind of document may hold, beyond the limits every document has (depth, aliases)."""

    max_entries: Mapping[str, int] = field(default_factory=dict)
    """most entries of the collection at each path pattern (``{"nodes": 16384, "nodes[].gpus": 256}``)"""
    default_max_entries: int | None = None
    """most entries of any other collection; None: unbounded"""
    total: TotalLimit | None = None
    """a bound on a sum over the document, if any"""


class YamlLimitError(ValueError):
    """A document passes one of the limits; the message names the limit and, where known, the place."""


@dataclass
class _Collection:
    """An open mapping or sequence while the events stream by."""

    path: str
    """place in the document, indices written ``[]`` (``nodes[].gpus``)"""
    is_mapping: bool
    anchor: str | None
    limit: int | None
    entries: int = 0
    """entries so far (pairs of a mapping, items of a sequence)"""
    expanded_units: int = 1
    """the collection's size with aliases expanded, so far"""
    expecting_key: bool = True
    """mapping only: whether the next node is a key"""
    key: str = "?"
    """mapping only: the last key read (``?`` for a non-scalar key)"""
    counted: int | None = None
    """mapping at a TotalLimit's place: what it adds to the total (its key's value, so far the default)"""


def _child_path(parent: _Collection | None) -> str:
    if parent is None:
        return ""
    if not parent.is_mapping:
        return f"{parent.path}[]"
    return f"{parent.path}.{parent.key}" if parent.path else parent.key


def check_yaml_limits(text: str, *, max_depth: int, limits: DocumentLimits | None = None) -> None:
    """Raise :class:`YamlLimitError` at the first limit ``text`` passes (see the module docstring).

    A syntax error is left to the parser, which raises ``yaml.YAMLError`` as it would when loading.
    """
    counter = _LimitCounter(max_depth, limits or DocumentLimits())
    for event in _events(text, max_depth):
        if isinstance(event, yaml.ScalarEvent):
            counter.scalar(event)
        elif isinstance(event, yaml.AliasEvent):
            counter.alias(event)
        elif isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            counter.start(event)
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            counter.end()


class _LimitCounter:
    """One document's counts as its events stream by (``check_yaml_limits``), each event checked against the
    limits as it comes."""

    def __init__(self, max_depth: int, limits: DocumentLimits) -> None:
        self.max_depth = max_depth
        self.max_entries, self.default_max_entries = dict(limits.max_entries), limits.default_max_entries
        self.total = limits.total
        self.anchors: dict[str, int] = {}
        """anchor -> the units of what it names, aliases expanded"""
        self.stack: list[_Collection] = []
        """the collections open, outermost first"""
        self.aliases = 0
        self.total_units = 0
        """the document's size so far, aliases expanded"""
        self.summed = 0
        """the total's sum so far (``limits.total``)"""

    def add(self, units: int) -> None:
        """A node of ``units`` units completed: counted in its collection and in the document."""
        stack = self.stack
        if stack:
            parent = stack[-1]
            parent.expanded_units += units
            if parent.is_mapping:
                parent.expecting_key = not parent.expecting_key
                if parent.expecting_key:  # a value completed the pair
                    parent.entries += 1
            else:
                parent.entries += 1
            if parent.limit is not None and parent.entries > parent.limit:
                raise YamlLimitError(
                    f"{parent.path or 'the top level'} holds more than {parent.limit} entries, over the limit of "
                    f"{parent.limit}"
                )
        self.total_units += units
        if self.total_units > MAX_YAML_EXPANDED_UNITS:
            raise YamlLimitError(
                f"expands to more than {MAX_YAML_EXPANDED_UNITS} units with its aliases replaced, over the limit "
                f"of {MAX_YAML_EXPANDED_UNITS} (an alias bomb? write the values out)"
            )

    def scalar(self, event: yaml.ScalarEvent) -> None:
        stack = self.stack
        units = 1 + len(event.value)
        if stack and stack[-1].is_mapping and stack[-1].expecting_key:
            stack[-1].key = event.value
        elif stack and stack[-1].counted is not None and stack[-1].key == self.total.key:
            stack[-1].counted = _plain_int(event.value, self.total.max_each)
        if event.anchor is not None:
            self.anchors[event.anchor] = units
        self.add(units)

    def alias(self, event: yaml.AliasEvent) -> None:
        self.aliases += 1
        if self.aliases > MAX_YAML_ALIASES:
            raise YamlLimitError(
                f"uses more than {MAX_YAML_ALIASES} aliases, over the limit of {MAX_YAML_ALIASES}"
            )
        if self.stack and self.stack[-1].is_mapping and self.stack[-1].expecting_key:
            self.stack[-1].key = "?"
        self.add(self.anchors.get(event.anchor, 1))

    def start(self, event: yaml.MappingStartEvent | yaml.SequenceStartEvent) -> None:
        """A collection opens: one level deeper, with the entry limit of its place."""
        if len(self.stack) >= self.max_depth:
            raise _too_deep(self.max_depth)
        parent = self.stack[-1] if self.stack else None
        if parent is not None and parent.is_mapping and parent.expecting_key:
            parent.key = "?"
        path = _child_path(parent)
        is_mapping = isinstance(event, yaml.MappingStartEvent)
        total = self.total
        self.stack.append(
            _Collection(
                path=path,
                is_mapping=is_mapping,
                anchor=event.anchor,
                limit=self.max_entries.get(path, self.default_max_entries),
                counted=total.default if total and is_mapping and path == total.entries else None,
            )
        )

    def end(self) -> None:
        """The innermost collection closes: its total's share summed, then counted once, whole, in its parent."""
        done = self.stack.pop()
        if done.counted is not None:
            total = self.total
            self.summed += done.counted
            if self.summed > total.limit:
                raise YamlLimitError(
                    f"declares more than {total.limit} {total.what} in all ({total.entries}.{total.key} summed), "
                    f"over the limit of {total.limit}"
                )
        if done.anchor is not None:
            self.anchors[done.anchor] = done.expanded_units
        self.total_units -= (
            done.expanded_units - 1
        )  # its parts were counted as they came; count it once, whole
        self.add(done.expanded_units)


def _events(text: str, max_depth: int) -> Iterator[yaml.Event]:
    """The parser's events; libyaml's own nesting bound (deeper than ours, met while it scans ahead) is our
    depth limit too."""
    try:
        yield from yaml.parse(text, Loader=_EVENT_LOADER)
    except yaml.MarkedYAMLError as exc:
        if "maximum nesting depth" in str(exc.problem):
            raise _too_deep(max_depth) from None
        raise


def _too_deep(max_depth: int) -> YamlLimitError:
    return YamlLimitError(
        f"nested more than {max_depth} levels deep, over the limit of {max_depth} (a config needs about 5)"
    )


def _plain_int(text: str, max_each: int) -> int:
    """A ``count:`` value as the total counts it: a decimal integer up to ``max_each``, else 0 (a value that is
    no such integer, ``3.5``, ``ten`` or ``10**12``, is reported by the schema check, not here)."""
    text = text.strip()
    value = int(text) if text.isdigit() and len(text) <= 12 else 0
    return value if value <= max_each else 0
