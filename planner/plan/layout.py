"""How plan.json is laid out on disk, so that one rank can read its part without parsing the whole plan.

The writer (:func:`plan_text`) puts every top-level field on its own lines as ``json.dump(indent=2)`` would,
except ``ranks`` and ``nodes``, whose entries take one line each (a 65,536-rank plan is then about 30 MB
instead of 45). After the plan's own fields it appends two fields of the layout, not of the plan:

- ``rank_index``: ``{"sha256", "schema", "ranks_at", "nodes_at", "ranks", "nodes", "batches"}``: a SHA-256 of
  every byte before the index and of the index's other fields, the byte spans ``[start, end)`` of the
  ``ranks`` and ``nodes`` arrays and of each of their entries (flat: ``[s0, e0, s1, e1, ...]``), and every
  rank's batch;
- ``rank_index_at``: the byte offset where the index begins, as the last line before ``}``, so a reader finds
  the index from the file's tail.

:func:`plan_parts` reads that back: it checks the digest over the bytes it covers (a file edited by hand,
re-indented by a tool or cut short no longer matches, and is read whole instead), then parses only what it
is asked for: the header (every field but the two arrays), one rank entry, one node entry; and it checks
that each entry's ``"batch"`` in the bytes is the index's, so no rank can take another split than the file's
entries say. Text is ASCII
(``json.dumps`` escapes the rest), so character and byte offsets agree. The reader of a plan document
(``planner.plan.io.read_plan``) drops the two layout fields; a plan without them (``--json`` output saved
by hand, an older file) is still a plan, read whole.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from planner.errors import ConfigError
from planner.jsonio import check_tree, loads_strict

INDEX_FIELD = "rank_index"
INDEX_AT_FIELD = "rank_index_at"
LAYOUT_FIELDS = frozenset({INDEX_FIELD, INDEX_AT_FIELD})
INDEX_SCHEMA = "batchplan/rank-index@1"
#: top-level arrays written one entry per line and indexed
INDEXED_ARRAYS = ("ranks", "nodes")
_INDEX_JOIN = f',\n  "{INDEX_FIELD}": '
_TRAILER = re.compile(rb',\n  "' + INDEX_AT_FIELD.encode() + rb'": (\d{1,12})\n\}\n\Z')
_BATCH = re.compile(rb'"batch": (\d{1,16})[,}]')
#: the trailer is at most this long (the offset has at most 12 digits)
_TAIL_BYTES = 64


def plan_text(doc: Mapping[str, Any]) -> str:
    """The file text of the plan document ``doc`` (field order kept), with its rank index appended."""
    if not doc:
        raise ConfigError("a plan document has fields")
    pieces: list[str] = ["{\n"]
    length = 2
    spans: dict[str, tuple[int, int]] = {}
    entries: dict[str, list[int]] = {name: [] for name in INDEXED_ARRAYS}

    def put(text: str) -> None:
        nonlocal length
        pieces.append(text)
        length += len(text)

    for i, (key, value) in enumerate(doc.items()):
        if key in LAYOUT_FIELDS:
            continue  # a document read back with its layout fields gets a fresh index
        put(("," if i else "") + ("\n" if i else "") + f"  {json.dumps(key)}: ")
        if key in INDEXED_ARRAYS and isinstance(value, list) and value:
            start = length
            put("[\n")
            for j, item in enumerate(value):
                put(",\n    " if j else "    ")
                entries[key].extend((length, length + len(item_text := json.dumps(item))))
                put(item_text)
            put("\n  ]")
            spans[key] = (start, length)
        else:
            put(json.dumps(value, indent=2).replace("\n", "\n  "))
    head = "".join(pieces)
    if set(spans) != set(INDEXED_ARRAYS):
        return head + "\n}\n"  # no ranks to index (the validator refuses such a plan anyway)
    index = {
        "schema": INDEX_SCHEMA,
        "ranks_at": list(spans["ranks"]), "nodes_at": list(spans["nodes"]),
        "ranks": entries["ranks"], "nodes": entries["nodes"],
        "batches": [r.get("batch") if isinstance(r, Mapping) else None for r in doc["ranks"]],
    }
    index = {"sha256": _digest(head.encode("ascii"), index), **index}
    return f'{head}{_INDEX_JOIN}{json.dumps(index, separators=(",", ":"))},\n  "{INDEX_AT_FIELD}": {len(head)}\n}}\n'


def _digest(head: bytes, index: Mapping[str, Any]) -> str:
    """SHA-256 of the bytes before the index and of the index's own fields (all but the digest), compact."""
    fields = {k: v for k, v in index.items() if k != "sha256"}
    return hashlib.sha256(head + json.dumps(fields, separators=(",", ":")).encode("ascii")).hexdigest()


@dataclass(frozen=True, kw_only=True)
class PlanParts:
    """The parts of an indexed plan file one rank reads, parsed but not yet validated."""

    header: dict[str, Any]
    """every top-level field but the layout's, with ``ranks`` and ``nodes`` empty"""
    batches: tuple[int, ...]
    """every rank's batch, in rank order (the index's)"""
    num_nodes: int
    raw: bytes
    """the file's bytes, from which :meth:`rank` and :meth:`node` parse single entries"""
    rank_spans: tuple[int, ...]
    node_spans: tuple[int, ...]
    source: str

    def rank(self, i: int) -> Any:
        """``ranks[i]`` parsed from its own bytes."""
        return self._entry(self.rank_spans, i, f"ranks[{i}]")

    def node(self, j: int) -> Any:
        """``nodes[j]`` parsed from its own bytes."""
        return self._entry(self.node_spans, j, f"nodes[{j}]")

    def _entry(self, spans: tuple[int, ...], i: int, what: str) -> Any:
        start, end = spans[2 * i], spans[2 * i + 1]
        value = loads_strict(self.raw[start:end], source=f"{self.source}: {what}", fix="regenerate the plan")
        check_tree(value, f"{self.source}: {what}")
        return value


def plan_parts(raw: bytes, source: str) -> PlanParts | None:
    """The indexed parts of the plan file text ``raw``; None when it holds no index that matches its bytes (the
    plan is then read whole, which also gives the error of a damaged file)."""
    found = _TRAILER.search(raw[-_TAIL_BYTES:])
    if found is None:
        return None
    index_at = int(found.group(1))
    tail_start = len(raw) - len(found.group(0))
    join = _INDEX_JOIN.encode()
    if not 0 < index_at <= tail_start - len(join) or raw[index_at:index_at + len(join)] != join:
        return None
    try:
        index = loads_strict(raw[index_at + len(join):tail_start], source=source, fix="")
    except ConfigError:
        return None
    spans = _checked_index(index, index_at)
    if spans is None or _digest(raw[:index_at], index) != index["sha256"]:
        return None
    if not _batches_match(raw, spans[0], index["batches"]):
        return None
    (r0, r1), (n0, n1) = index["ranks_at"], index["nodes_at"]
    try:
        header = loads_strict(raw[:r0] + b"[]" + raw[r1:n0] + b"[]" + raw[n1:index_at] + b"\n}", source=source,
                              fix="regenerate the plan")
    except ConfigError:
        return None
    if not isinstance(header, dict):
        return None
    return PlanParts(header=header, batches=tuple(index["batches"]), num_nodes=len(spans[1]) // 2, raw=raw,
                     rank_spans=spans[0], node_spans=spans[1], source=source)


def _batches_match(raw: bytes, rank_spans: tuple[int, ...], batches: list[int]) -> bool:
    """Each rank entry's bytes hold exactly one ``"batch": N`` and it is the index's: the index cannot tell a
    rank another split than the entries do (a string cannot hold the unescaped quotes this pattern needs)."""
    start, end = rank_spans[0], rank_spans[-1]
    found = [(m.start(), int(m.group(1))) for m in _BATCH.finditer(raw, start, end)]
    if len(found) != len(batches):
        return False
    for i, (position, batch) in enumerate(found):
        if not rank_spans[2 * i] < position < rank_spans[2 * i + 1] or batch != batches[i]:
            return False
    return True


def _checked_index(index: Any, index_at: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The entry spans of a well-formed index whose spans all lie before ``index_at`` in order; else None."""
    if not (isinstance(index, dict) and index.get("schema") == INDEX_SCHEMA and isinstance(index.get("sha256"), str)):
        return None
    arrays = [index.get(name) for name in ("ranks_at", "nodes_at", "ranks", "nodes", "batches")]
    if not all(isinstance(a, list) and all(type(v) is int for v in a) for a in arrays):
        return None
    ranks_at, nodes_at, ranks, nodes, batches = arrays
    if len(ranks_at) != 2 or len(nodes_at) != 2 or not ranks or not nodes or len(ranks) % 2 or len(nodes) % 2:
        return None
    if len(batches) != len(ranks) // 2 or any(b < 1 for b in batches):
        return None
    for whole, parts in ((ranks_at, ranks), (nodes_at, nodes)):
        bounds = [whole[0], *parts, whole[1]]
        if any(a >= b for a, b in itertools.pairwise(bounds)):  # strictly increasing, entries inside the array
            return None
    if not ranks_at[1] < nodes_at[0] or not nodes_at[1] < index_at:
        return None
    return tuple(ranks), tuple(nodes)
