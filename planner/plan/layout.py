"""How plan.json is laid out on disk, and the index beside it by which one rank reads its part without
parsing the whole plan.

The writer (:func:`plan_text`) puts every top-level field on its own lines as ``json.dump(indent=2)`` would,
except ``ranks`` and ``nodes``, whose entries take one line each (a 65,536-rank plan is then 33 MB instead
of 45); the document is the same. Beside ``plan.json`` it writes ``plan.json.index`` (:func:`index_path`),
``{"sha256", "schema", "plan_bytes", "ranks_at", "nodes_at", "ranks", "nodes", "batches"}``: a SHA-256 of the
plan file's bytes and of the index's other fields, the byte spans ``[start, end)`` of the ``ranks`` and
``nodes`` arrays and of each of their entries (flat: ``[s0, e0, s1, e1, ...]``), and every rank's batch.

:func:`plan_parts` reads that back: it checks the digest (a plan edited by hand, re-indented by a tool, cut
short, or written again without its index no longer matches, and is read whole instead), then gives only
what it is asked for, as text to read: the header (every field, the two arrays empty), one rank entry, one
node entry; and it checks that the entries' ``"batch"`` in the bytes are the index's, so no rank can take another split than
the file's entries say. Text is ASCII (``json.dumps`` escapes the rest), so character and byte offsets
agree. A plan without an index (copied alone to a node, ``--json`` output saved by hand, an older file) is
still a plan, read whole.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np

from planner.codec import Meta, decode
from planner.errors import ConfigError

INDEX_SCHEMA = "batchplan/rank-index@1"
INDEX_SUFFIX = ".index"
#: top-level arrays written one entry per line and indexed
INDEXED_ARRAYS = ("ranks", "nodes")
_SIGNED = re.compile(rb'\{"sha256":"([0-9a-f]{64})",')
_BATCH = re.compile(rb'"batch": (\d{1,16})[,}]')


def index_path(plan_path: Path) -> Path:
    """Where the index of the plan file ``plan_path`` lies: ``plan.json`` -> ``plan.json.index``."""
    return plan_path.with_name(plan_path.name + INDEX_SUFFIX)


def plan_text(doc: Mapping[str, Any]) -> tuple[str, str | None]:
    """The file text of the plan document ``doc`` (field order kept) and of its index (None for a document
    without ranks and nodes, which the validator refuses anyway)."""
    pieces: list[str] = ["{\n"]
    length = 2
    spans: dict[str, tuple[int, int]] = {}
    entries: dict[str, list[int]] = {name: [] for name in INDEXED_ARRAYS}

    def put(text: str) -> None:
        nonlocal length
        pieces.append(text)
        length += len(text)

    for i, (key, value) in enumerate(doc.items()):
        put((",\n" if i else "") + f"  {json.dumps(key)}: ")
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
    put("\n}\n")
    text = "".join(pieces)
    if set(spans) != set(INDEXED_ARRAYS):
        return text, None
    fields = json.dumps(
        {
            "schema": INDEX_SCHEMA,
            "plan_bytes": length,
            "ranks_at": list(spans["ranks"]),
            "nodes_at": list(spans["nodes"]),
            "ranks": entries["ranks"],
            "nodes": entries["nodes"],
            "batches": [r.get("batch") if isinstance(r, Mapping) else None for r in doc["ranks"]],
        },
        separators=(",", ":"),
    )
    digest = _digest(text.encode("ascii"), fields.encode("ascii"))
    return text, f'{{"sha256":"{digest}",{fields[1:]}\n'


def _digest(plan: bytes, fields: bytes) -> str:
    """SHA-256 of the plan file's bytes, then of the index's text without its digest (``{"schema":...}``)."""
    digest = hashlib.sha256(plan)
    digest.update(fields)
    return digest.hexdigest()


@dataclass(frozen=True, kw_only=True)
class PlanParts:
    """The parts of an indexed plan file one rank reads, as JSON text not yet read."""

    header: bytes
    """the plan with ``ranks`` and ``nodes`` empty"""
    batches: tuple[int, ...]
    """every rank's batch, in rank order (the index's)"""
    num_nodes: int
    raw: bytes
    """the file's bytes, of which :meth:`rank` and :meth:`node` give single entries"""
    rank_spans: tuple[int, ...]
    node_spans: tuple[int, ...]

    def rank(self, i: int) -> bytes:
        """The text of ``ranks[i]``."""
        return self.raw[self.rank_spans[2 * i] : self.rank_spans[2 * i + 1]]

    def node(self, j: int) -> bytes:
        """The text of ``nodes[j]``."""
        return self.raw[self.node_spans[2 * j] : self.node_spans[2 * j + 1]]


@dataclass(frozen=True, kw_only=True)
class RankIndex:
    """plan.json.index (``batchplan/rank-index@1``), as :func:`plan_text` writes it."""

    sha256: str
    """SHA-256 of the plan file's bytes, then of this index's text without this field"""
    schema: Literal["batchplan/rank-index@1"]
    plan_bytes: int
    ranks_at: tuple[int, int]
    """the byte span ``[start, end)`` of the ``ranks`` array"""
    nodes_at: tuple[int, int]
    ranks: tuple[int, ...]
    """each entry's span, flat: ``[s0, e0, s1, e1, ...]``"""
    nodes: tuple[int, ...]
    batches: tuple[Annotated[int, Meta(ge=1)], ...]
    """every rank's batch, in rank order"""


def plan_parts(raw: bytes, index_text: bytes, source: str) -> PlanParts | None:
    """The indexed parts of the plan file's bytes ``raw`` by its index's bytes ``index_text``; None when the
    index does not match them (the plan is then read whole, which also gives the error of a damaged file)."""
    index_text = index_text.rstrip(b"\n")
    signed = _SIGNED.match(index_text)
    if signed is None or _digest(raw, b"{" + index_text[signed.end() :]) != signed.group(1).decode():
        return None
    try:
        index = decode(RankIndex, index_text, where=source, fix="")
    except ConfigError:
        return None
    if not _in_order(index, len(raw)) or not _batches_match(raw, index.ranks, index.batches):
        return None
    (r0, r1), (n0, n1) = index.ranks_at, index.nodes_at
    return PlanParts(
        header=raw[:r0] + b"[]" + raw[r1:n0] + b"[]" + raw[n1:],
        batches=index.batches,
        num_nodes=len(index.nodes) // 2,
        raw=raw,
        rank_spans=index.ranks,
        node_spans=index.nodes,
    )


def _batches_match(raw: bytes, rank_spans: tuple[int, ...], batches: tuple[int, ...]) -> bool:
    """The entries' bytes hold one ``"batch": N`` per rank, in order, and they are the index's batches: an index
    edited with its digest recomputed still cannot give a rank another split than the entries that the writer
    wrote (a JSON string cannot hold the unescaped quotes this pattern needs)."""
    found = _BATCH.findall(raw, rank_spans[0], rank_spans[-1])
    return len(found) == len(batches) and tuple(map(int, found)) == batches


def _in_order(index: RankIndex, plan_bytes: int) -> bool:
    """The index's spans lie in order inside a plan file of ``plan_bytes`` bytes, one batch a rank."""
    ranks_at, nodes_at, ranks, nodes = index.ranks_at, index.nodes_at, index.ranks, index.nodes
    if index.plan_bytes != plan_bytes or not ranks or not nodes or len(ranks) % 2 or len(nodes) % 2:
        return False
    if len(index.batches) != len(ranks) // 2:
        return False
    for whole, parts in ((ranks_at, ranks), (nodes_at, nodes)):
        bounds = np.asarray([whole[0], *parts, whole[1]], dtype=np.int64)
        if not np.all(np.diff(bounds) > 0):  # strictly increasing: entries in order, inside their array
            return False
    return ranks_at[1] < nodes_at[0] and nodes_at[1] < plan_bytes
