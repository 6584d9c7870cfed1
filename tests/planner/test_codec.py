"""The codec (``planner.codec``) on records declared for these tests: what it reads, what it refuses and how it
names the refusal, and that what it writes reads back the same."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import pytest

from planner.codec import (
    FLATTENED,
    NOT_WRITTEN,
    OMIT_DEFAULT,
    UNKNOWN_KEYS,
    Meta,
    convert,
    decode,
    encode,
    forbid_unknown_keys,
)
from planner.errors import ConfigError, FieldError


class Colour(str, enum.Enum):
    RED = "red"
    BLUE = "blue"


class Shape:
    """A tagged base: its subclasses are told apart by ``kind``."""

    tag_field = "kind"


@dataclass(frozen=True, kw_only=True)
class Square(Shape):
    kind: Literal["square"] = "square"
    side: float


@dataclass(frozen=True, kw_only=True)
class Circle(Shape):
    kind: Literal["circle"] = "circle"
    radius: float


@forbid_unknown_keys
@dataclass(frozen=True, kw_only=True)
class Settings:
    size: int = 1
    dims: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or self.size < 1:
            raise FieldError("size", f"`size` {self.size!r} is invalid (use an integer >= 1)")
        if self.dims is not None and not all(isinstance(d, int) and d > 0 for d in self.dims):
            raise FieldError("dims", f"`dims` {self.dims!r} is invalid (use positive integers)")


@dataclass(frozen=True, kw_only=True)
class Item:
    name: Annotated[str, Meta(pattern=r"^[a-z]+$")]
    count: Annotated[int, Meta(ge=0, le=10)]
    share: Annotated[float, Meta(gt=0, le=1, description="be a share in (0, 1]")] = 1.0
    note: str | None = field(default=None, metadata=OMIT_DEFAULT)
    env: Annotated[dict[str, str], Meta(description="map names to strings")] | None = field(
        default=None, metadata=OMIT_DEFAULT
    )


@dataclass(frozen=True, kw_only=True)
class Doc:
    version: Literal["doc@1"]
    colour: Colour
    items: tuple[Item, ...]
    shape: Shape
    settings: Settings = field(default_factory=Settings)
    rates: dict[str, Annotated[float, Meta(ge=0, description="be a rate (a number >= 0)")]] | None = None
    lines: tuple[Annotated[str, Meta(description="be a string")], ...] = ()
    cached: str = field(default="", metadata=NOT_WRITTEN)
    extra: dict[str, Any] = field(default_factory=dict, metadata=UNKNOWN_KEYS)

    def __post_init__(self) -> None:
        if sum(i.count for i in self.items) > 12:
            raise ConfigError("items hold more than 12 things")


def _doc(**changes: Any) -> dict:
    doc = {
        "version": "doc@1",
        "colour": "red",
        "items": [{"name": "a", "count": 2, "share": 0.5}],
        "shape": {"kind": "circle", "radius": 2.0},
        "settings": {"size": 3, "dims": [1, 2]},
        "rates": {"x": 1.5},
        "lines": ["one"],
    }
    doc.update(changes)
    return doc


def _read(doc: dict) -> Doc:
    return decode(Doc, json.dumps(doc).encode(), where="doc.json", fix="write it again")


def test_a_document_reads_into_its_records_and_writes_back_the_same() -> None:
    doc = _doc(newer={"from": "a later writer"})
    read = _read(doc)
    assert read.colour is Colour.RED and read.shape == Circle(radius=2.0) and read.settings.dims == (1, 2)
    assert read.items[0].note is None and read.extra == {"newer": {"from": "a later writer"}}
    written = encode(read)
    assert written == doc  # note omitted at its default, env written as null? no: env is in the item
    assert list(written) == [*list(_doc()), "newer"]


def test_an_item_written_with_every_field_keeps_them_in_declared_order() -> None:
    item = Item(name="b", count=1, note="n", env={"A": "1"})
    assert list(encode(item)) == ["name", "count", "share", "note", "env"]
    assert convert(Item, encode(item), where="x") == item


def test_a_field_in_the_program_only_is_neither_written_nor_read() -> None:
    read = _read(_doc())
    written = encode(Doc(**{**read.__dict__, "cached": "secret"}))
    assert "cached" not in written
    assert _read({**_doc(), "cached": "planted"}).cached == ""  # kept with the unknown keys, not in the field
    assert _read({**_doc(), "cached": "planted"}).extra == {"cached": "planted"}


CASES = {
    "a wrong kind": (_doc(rates="fast"), "doc.json: rates must be dict/null, got 'fast' (write it again)"),
    "a dict value of the wrong kind": (
        _doc(rates={"x": 1.0, "y": "2"}),
        "doc.json: rates['y'] must be a rate",
    ),
    "a bound": (_doc(items=[{"name": "a", "count": 11}]), "doc.json: items[0].count must be <= 10, got 11"),
    "a description": (
        _doc(items=[{"name": "a", "count": 1, "share": 0}]),
        "doc.json: items[0].share must be a share in (0, 1], got 0",
    ),
    "a pattern": (_doc(items=[{"name": "A", "count": 1}]), "items[0].name must match '^[a-z]+$', got 'A'"),
    "inside a described field": (
        _doc(items=[{"name": "a", "count": 1, "env": {"K": 1}}]),
        "items[0].env must map names to strings, got {'K': 1}",
    ),
    "a described element": (_doc(lines=["a", 7]), "doc.json: lines[1] must be a string, got 7"),
    "a missing field": (
        {k: v for k, v in _doc().items() if k != "shape"},
        "doc.json lacks the field 'shape'",
    ),
    "a missing field inside": (_doc(items=[{"name": "a"}]), "doc.json: items[0] lacks the field 'count'"),
    "an enum": (_doc(colour="green"), "doc.json: colour must be one of red, blue, got 'green'"),
    "a literal": (_doc(version="doc@2"), "doc.json: version must be one of doc@1, got 'doc@2'"),
    "a tag": (
        _doc(shape={"kind": "hexagon"}),
        "doc.json: shape: kind 'hexagon' is not one of square, circle",
    ),
    "a record's own rule": (
        _doc(settings={"size": 0}),
        "doc.json: settings.size 0 is invalid (use an integer >= 1)",
    ),
    "its words for a wrong kind": (
        _doc(settings={"dims": ["3"]}),
        "doc.json: settings.dims ('3',) is invalid",
    ),
    "an unknown key where forbidden": (
        _doc(settings={"sise": 2}),
        "doc.json: settings has unknown fields ['sise']",
    ),
    "a cross-field rule": (
        _doc(items=[{"name": "a", "count": 10}, {"name": "b", "count": 3}]),
        "doc.json: items hold more than 12 things",
    ),
    "a bool for an int": (_doc(items=[{"name": "a", "count": True}]), "items[0].count must be int, got True"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_broken_document_is_one_error_naming_the_path_the_rule_and_the_value(case: str) -> None:
    doc, words = CASES[case]
    with pytest.raises(ConfigError) as raised:
        _read(doc)
    assert words in str(raised.value)
    with pytest.raises(ConfigError) as converted:
        convert(Doc, json.loads(json.dumps(doc)), where="doc.json", fix="write it again")
    assert str(converted.value) == str(raised.value)  # from bytes or from memory: the same words


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (b'{"version": NaN}', "NaN is not a number batchplan accepts"),
        (b'{"version": 1e400}', "overflows"),
        (b'{"version": "doc@1"', "not valid JSON"),
        (b"[" * 40 + b"]" * 40, "nested 40 levels deep, over the limit of 32"),
        (b'{"version": "\\u001b[2J"}', "control character"),
        (b'{"version": "\\ud800"}', "lone surrogate"),
        ('{"version": "\u0085"}'.encode(), "control character"),
        (b'{"version": "a\\tb"}', "control character"),
    ],
)
def test_text_that_is_not_strict_json_is_named_by_the_strict_parser(text: bytes, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        decode(Doc, text, where="doc.json", fix="write it again")


def test_escapes_that_are_text_read_as_text() -> None:
    text = 'caf\u00e9 \U0001f600 a\\nb "q" /'  # json.dumps escapes them: \u00e9, a surrogate pair, \\, \"
    assert _read(_doc(lines=[text])).lines == (text,)


@dataclass(frozen=True, kw_only=True)
class Measured:
    slowdown: Annotated[float, Meta(gt=0)]
    steps: int


@dataclass(frozen=True, kw_only=True)
class Filed:
    shape: str | None
    why: str | None = field(default=None, metadata=OMIT_DEFAULT)
    measured: Measured | None = field(default=None, metadata=FLATTENED)


def test_a_flattened_record_is_written_into_its_owner_and_read_back_from_its_keys() -> None:
    filed = Filed(shape="a;b", measured=Measured(slowdown=2.0, steps=3))
    assert encode(filed) == {"shape": "a;b", "slowdown": 2.0, "steps": 3}
    assert convert(Filed, encode(filed), where="x") == filed
    assert decode(Filed, b'{"shape": null, "why": "simulated"}', where="x", fix="") == Filed(
        shape=None, why="simulated"
    )
    with pytest.raises(ConfigError, match=r"x: slowdown must be > 0, got 0"):
        decode(Filed, b'{"shape": "a", "slowdown": 0, "steps": 1}', where="x", fix="")
    with pytest.raises(ConfigError, match=r"x lacks the field 'steps'"):
        decode(Filed, b'{"shape": "a", "slowdown": 1}', where="x", fix="")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (b'{"name": "a", "count": 11}', "item.json: count must be <= 10, got 11 (write it again)"),
        (b'{"name": "a", "count": "2"}', "item.json: count must be int, got '2' (write it again)"),
        (b'{"name": "a"}', "item.json lacks the field 'count' (write it again)"),
    ],
)
def test_a_record_msgspec_reads_alone_names_its_wrong_field_not_bad_json(text: bytes, words: str) -> None:
    # Item keeps, forbids and skips no key, so msgspec reads it whole; its ValidationError is a DecodeError too,
    # which once made every wrong value "not valid JSON"
    with pytest.raises(ConfigError) as raised:
        decode(Item, text, where="item.json", fix="write it again")
    assert str(raised.value) == words
