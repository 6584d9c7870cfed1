"""The one codec of batchplan's documents: every record declared once, as a frozen dataclass, and read from and
written to strict JSON here (msgspec). The codec knows no record type; a record says everything about itself:

- its fields' types: ``int``, ``float`` (an integer is accepted), ``str``, ``bool``, ``None`` (optional),
  tuples, dicts with string keys, ``Literal`` and ``Enum`` choices, other records, ``Any`` (plain JSON);
- bounds and patterns in ``Annotated[T, Meta(ge=..., le=..., pattern=...)]``; ``Meta(description=...)``
  completes "<field> must ..." in an error message about the field or anything inside it, where msgspec's
  words would say too little (``"be a share of the profiled speed in (0, 1]"``, ``"map names to strings"``);
- in its fields' metadata: :data:`OMIT_DEFAULT` (not written while it holds its default: how a field added
  after the first release keeps older files as they were), :data:`NOT_WRITTEN` (in the program only; never
  read from a file), :data:`UNKNOWN_KEYS` (the dict that keeps the keys a newer writer added: read into it,
  written back after the record's own fields), :data:`FLATTENED` (an optional record whose fields are written
  into this record's object where the field stands, present when any of its keys is);
- ``@forbid_unknown_keys``: a key the record does not know is an error (the default: ignored);
- ``__post_init__``: its own rules (cross-field, or friendlier words); a ``ConfigError`` or ``ValueError`` it
  raises is the error, at its path, a ``FieldError``'s fields named as the document names them
  (``job.multiple_of``);
- a field typed by a plain base class with a ``tag_field`` (``torchkit.step.fit.MemoryFit``, ``"kind"``) is
  one of its dataclass subclasses, chosen by that field's ``Literal`` value.

Reading (:func:`decode`) is strict: within ``planner.jsonio``'s nesting limit, UTF-8, no ``NaN`` or
``Infinity``, no number that overflows, no control character or lone surrogate in any string. A key given twice
in one object counts once, the last (RFC 8259 leaves it open; every reader of these documents is this one).
Every failure is one ``ConfigError`` naming the document, the path in it (``ranks[3].speed_factor``), what the
field must be, the value found, and the fix; :func:`convert` does the same for data already in memory (a
parsed YAML file, objects gathered over ``torch.distributed``). Writing (:func:`encode`) gives plain JSON
data, fields in their declared order.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import re
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
from msgspec import Meta

from planner.errors import ConfigError, FieldError
from planner.jsonio import MAX_JSON_DEPTH, check_tree, json_depth, loads_strict

__all__ = [
    "FLATTENED",
    "NOT_WRITTEN",
    "OMIT_DEFAULT",
    "UNKNOWN_KEYS",
    "Meta",
    "convert",
    "decode",
    "decode_fields",
    "encode",
    "forbid_unknown_keys",
]

T = TypeVar("T")

OMIT_DEFAULT = {"codec": "omit_default"}
"""field metadata: not written while the field holds its default"""
NOT_WRITTEN = {"codec": "not_written"}
"""field metadata: in the program only, neither written nor read"""
UNKNOWN_KEYS = {"codec": "unknown_keys"}
"""field metadata: the dict that keeps a newer writer's keys this record does not know"""
FLATTENED = {"codec": "flattened"}
"""field metadata: an optional record written as keys of this record's object (present when any of them is)"""
#: most characters of a value an error message shows (a hostile field can be megabytes)
_SHOWN_CHARS = 80


def forbid_unknown_keys(cls: type[T]) -> type[T]:
    """Class decorator: a key the record does not declare is an error, not ignored."""
    cls.__codec_forbids_unknown_keys__ = True  # type: ignore[attr-defined]
    return cls


# ------------------------------------------------------------------------------------------------ records


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    type: Any
    default: Any
    """``dataclasses.MISSING`` for a required field"""
    role: str | None
    """its metadata's ``codec`` entry"""


@dataclasses.dataclass(frozen=True)
class _Spec:
    """What the codec needs of one record class, worked out once."""

    fields: tuple[_Field, ...]
    """every field a document holds (``NOT_WRITTEN`` and ``UNKNOWN_KEYS`` ones apart), in order"""
    unknown: str | None
    """the ``UNKNOWN_KEYS`` field"""
    forbids: bool
    own_checks: bool
    """the class has a ``__post_init__``"""
    custom: bool
    """read key by key here, not by msgspec alone: the record or one inside it keeps, forbids or skips keys"""


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


@functools.cache
def _spec(cls: type) -> _Spec:
    fields, unknown, skips = [], None, False
    for f in dataclasses.fields(cls):
        role = f.metadata.get("codec")
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if role in (NOT_WRITTEN["codec"], UNKNOWN_KEYS["codec"]):
            unknown = f.name if role == UNKNOWN_KEYS["codec"] else unknown
            skips = True
        else:
            fields.append(_Field(f.name, _hints(cls)[f.name], default, role))
    forbids = getattr(cls, "__codec_forbids_unknown_keys__", False)
    custom = (
        skips
        or forbids
        or any(
            f.role == FLATTENED["codec"] or any(_spec(r).custom for r in _records_in(f.type) if r is not cls)
            for f in fields
        )
    )
    return _Spec(tuple(fields), unknown, forbids, hasattr(cls, "__post_init__"), custom)


def _records_in(tp: Any) -> list[type]:
    """The record classes an annotation can hold, at any depth (a tagged base's subclasses included)."""
    tp = _strip(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return [tp]
    if _tagged_base(tp):
        return list(tp.__subclasses__())
    return [r for arg in typing.get_args(tp) for r in _records_in(arg)]


def _strip(tp: Any) -> Any:
    """``Annotated[T, ...]`` -> T."""
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _optional_of(tp: Any) -> Any:
    """``X | None`` -> X (annotations of the records are at most optional, never other unions)."""
    inner = _strip(tp)
    if typing.get_origin(inner) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(inner) if a is not type(None))
    return tp


def _tagged_base(tp: Any) -> bool:
    return (
        isinstance(tp, type)
        and not dataclasses.is_dataclass(tp)
        and isinstance(getattr(tp, "tag_field", None), str)
    )


@functools.cache
def _tags(base: type) -> dict[Any, type]:
    """tag value -> the dataclass subclass of a tagged base that carries it."""
    return {
        tag: sub
        for sub in base.__subclasses__()
        for tag in typing.get_args(_strip(_hints(sub)[base.tag_field]))
    }


def _dec_hook(tp: type, obj: Any) -> Any:
    if not _tagged_base(tp):
        raise ValueError(f"a {tp.__name__} is not read from a document")
    sub = _tags(tp).get(obj.get(tp.tag_field)) if isinstance(obj, dict) else None
    if sub is None:
        tag = obj.get(tp.tag_field) if isinstance(obj, dict) else obj
        raise ValueError(f"{tp.tag_field} {_shown(tag)} is not one of {', '.join(map(str, _tags(tp)))}")
    try:
        return msgspec.convert(obj, sub, dec_hook=_dec_hook)
    except msgspec.ValidationError as exc:
        raise _Nested(_from_msgspec(exc, [])) from None


# ------------------------------------------------------------------------------------------------ writing

_SCALARS = (int, float, bool, type(None))


def encode(value: Any) -> Any:
    """``value`` (a record, or a tuple, list or dict of them) as plain JSON data: objects in field order, lists,
    enums as their values; the field metadata of the module docstring applied."""
    if dataclasses.is_dataclass(value):
        spec = _spec(type(value))
        data: dict[str, Any] = {}
        for f in spec.fields:
            item = getattr(value, f.name)
            if f.role == OMIT_DEFAULT["codec"] and item == f.default:
                continue
            if f.role == FLATTENED["codec"]:
                data.update(encode(item) if item is not None else {})
            else:
                data[f.name] = item if type(item) in _SCALARS or type(item) is str else encode(item)
        if spec.unknown is not None:
            data.update(encode(getattr(value, spec.unknown)))
        return data
    if isinstance(value, (tuple, list)):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {k: encode(v) for k, v in value.items()}
    if isinstance(value, enum.Enum):
        return value.value
    return str(value) if isinstance(value, str) else value  # a str subclass carrying more: its text


# ------------------------------------------------------------------------------------------------ reading


class _Invalid(Exception):
    """Internal: a failure at a path (field names, indexes, dict keys) and what kind: ``msgspec`` (its words),
    ``missing`` (the field), ``type`` (not an object or list where one is needed), ``own`` (a record's check)."""

    def __init__(self, path: list, kind: str, text: str = "", cause: BaseException | None = None) -> None:
        super().__init__(text)
        self.path, self.kind, self.text, self.cause = path, kind, text, cause


class _Nested(ValueError):
    """Internal: a failure inside a tagged record, carried out of msgspec's ``dec_hook``."""

    def __init__(self, invalid: _Invalid) -> None:
        super().__init__(invalid.text)
        self.invalid = invalid


def decode(cls: Any, raw: bytes | str, *, where: str, fix: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The ``cls`` (a record, or any annotation: ``tuple[RankEntry, ...]``) of the JSON text ``raw``.

    Args:
        where: how messages name the document (a file's path).
        fix: what the user can do, appended to every message (``"regenerate it with batchplan plan"``).

    Raises:
        ConfigError: one line naming ``where``, the path in the document, the rule and the fix.
    """
    return _decode(cls, raw, _reader(cls), where=where, fix=fix, max_depth=max_depth)


def decode_fields(
    cls: type, raw: bytes | str, *, where: str, fix: str, without: tuple[str, ...]
) -> dict[str, Any]:
    """The fields of the record ``cls`` in the JSON text ``raw`` but ``without`` (absent or ignored there), each
    read and checked as :func:`decode` would, the absent ones at their defaults; the record itself is not
    constructed, so its own checks across fields are the caller's (a reader of part of a large document).

    Raises:
        ConfigError: as :func:`decode`.
    """
    read = functools.partial(_read_record, cls, raw=True, construct=False, without=without)
    return _decode(cls, raw, read, where=where, fix=fix, max_depth=MAX_JSON_DEPTH)


def convert(cls: Any, data: Any, *, where: str, fix: str = "") -> Any:
    """The ``cls`` of JSON-like ``data`` already in memory (dicts, lists, str, int, float, bool, None), held
    to the rules of :func:`decode` (``planner.jsonio.check_tree`` for the text)."""
    check_tree(data, where)
    try:
        return _converter(cls)(data)
    except (msgspec.ValidationError, _Invalid) as exc:
        raise _explained(cls, exc, data, where, fix) from None


def _decode(
    cls: Any, raw: bytes | str, read: Callable[[bytes], Any], *, where: str, fix: str, max_depth: int
) -> Any:
    data = raw.encode() if isinstance(raw, str) else raw
    try:
        if not _plainly_clean(data):  # a control character, a surrogate, ...: the strict parser names it
            _strict_load(
                data, where, fix, max_depth
            )  # raises where something is wrong; else the text was clean
        return read(data)
    except (msgspec.ValidationError, _Invalid) as exc:  # first: a ValidationError is a DecodeError too
        raise _explained(cls, exc, _strict_load(data, where, fix, max_depth), where, fix) from None
    except (
        RecursionError,
        msgspec.DecodeError,
    ):  # too deep, not JSON or not strict: the strict parser says which
        _strict_load(data, where, fix, max_depth)
        raise ConfigError(f"{where} is not valid JSON ({fix})") from None


def _strict_load(data: bytes, where: str, fix: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    loaded = loads_strict(data, source=where, fix=fix, max_depth=max_depth)
    check_tree(loaded, where)
    return loaded


#: every byte but those that can start a control character or a lone surrogate inside a JSON string: a
#: backslash (``\n``, ``\u001b``, ``\ud800``), DEL, and the lead byte of a C1 control's UTF-8 form
_NOT_SUSPECT = bytes(b for b in range(256) if b not in (0x5C, 0x7F, 0xC2))
_SAFE_ESCAPES = frozenset(b'"/\\')


def _plainly_clean(data: bytes) -> bool:
    """True when no string of the JSON text ``data`` can hold a control character or lone surrogate; False when
    one may (the strict parser then decides, and names it). ``bytes.translate`` finds the few suspect bytes
    (a 33 MB plan in tens of milliseconds); only those are looked at."""
    suspects = data.translate(None, delete=_NOT_SUSPECT)
    if not suspects:
        return True
    if 0x7F in suspects:
        return False
    at = data.find(b"\xc2")
    while at >= 0:
        if at + 1 < len(data) and 0x80 <= data[at + 1] <= 0x9F:
            return False
        at = data.find(b"\xc2", at + 1)
    at = data.find(b"\\")
    while at >= 0:
        escaped = data[at + 1] if at + 1 < len(data) else 0
        if escaped == ord("u"):
            digits = data[at + 2 : at + 6].lower()
            if digits[:2] == b"00" and (digits[2:3] in (b"0", b"1", b"8", b"9") or digits[2:] == b"7f"):
                return False
            if digits[:1] == b"d" and digits[1:2] in (b"8", b"9", b"a", b"b", b"c", b"d", b"e", b"f"):
                return False  # a surrogate: paired or not, the strict parser decides
        elif escaped not in _SAFE_ESCAPES:  # \b \f \n \r \t are control characters
            return False
        at = data.find(b"\\", at + 2)
    return True


@functools.cache
def _reader(tp: Any) -> Callable[[bytes], Any]:
    """bytes -> value of ``tp``: msgspec alone where it can, key by key where a record needs it."""
    return _build(tp, raw=True)


@functools.cache
def _converter(tp: Any) -> Callable[[Any], Any]:
    """data -> value of ``tp`` (as :func:`_reader`, from data in memory)."""
    return _build(tp, raw=False)


_RAW_OBJECT = msgspec.json.Decoder(dict[str, msgspec.Raw])
_RAW_ARRAY = msgspec.json.Decoder(list[msgspec.Raw])


def _build(tp: Any, *, raw: bool) -> Callable[[Any], Any]:
    if not any(_spec(r).custom for r in _records_in(tp)):
        if raw:
            return msgspec.json.Decoder(tp, dec_hook=_dec_hook).decode
        return functools.partial(msgspec.convert, type=tp, dec_hook=_dec_hook)
    inner, optional = _strip(_optional_of(tp)), _optional_of(tp) is not tp
    origin, args = typing.get_origin(inner), typing.get_args(inner)
    if dataclasses.is_dataclass(inner):
        read: Callable[[Any], Any] = functools.partial(_read_record, inner, raw=raw)
    elif origin is tuple and args[1:] == (Ellipsis,):
        item = _build(args[0], raw=raw)
        read = lambda v: tuple(_at(i, item, x) for i, x in enumerate(_items(v, raw, list)))  # noqa: E731
    elif origin is dict:
        item = _build(args[1], raw=raw)
        read = lambda v: {k: _at(_Key(k), item, x) for k, x in _items(v, raw, dict).items()}  # noqa: E731
    else:
        raise TypeError(
            f"the codec cannot read {tp!r}: a record that keeps, forbids or skips keys may sit only in a "
            "record, an optional, a tuple or a dict"
        )
    if not optional:
        return read
    return lambda v: None if (bytes(v).strip() == b"null" if raw else v is None) else read(v)


def _items(value: Any, raw: bool, kind: type) -> Any:
    """The items of a JSON object (``kind`` dict) or array (list), raw values still text where ``raw``."""
    try:
        items = (_RAW_OBJECT if kind is dict else _RAW_ARRAY).decode(value) if raw else value
    except msgspec.ValidationError:
        raise _Invalid([], "type") from None
    if not isinstance(items, kind if raw else (kind, tuple) if kind is list else kind):
        raise _Invalid([], "type")
    return items


def _at(segment: Any, read: Callable[[Any], Any], value: Any) -> Any:
    """``read(value)``, a failure's path prefixed with ``segment``."""
    try:
        return read(value)
    except _Invalid as exc:
        exc.path.insert(0, segment)
        raise
    except msgspec.ValidationError as exc:
        raise _from_msgspec(exc, [segment]) from None


def _read_record(
    cls: type, value: Any, *, raw: bool, construct: bool = True, without: tuple[str, ...] = ()
) -> Any:
    spec = _spec(cls)
    items = _items(value, raw, dict)
    flat = {
        f.name: {g.name for g in _spec(_records_in(f.type)[0]).fields}
        for f in spec.fields
        if f.role == FLATTENED["codec"]
    }
    known = {f.name for f in spec.fields}.union(*flat.values())
    unknown = [k for k in items if k not in known and k not in without]
    if unknown and spec.forbids:
        raise _Invalid([], "own", f"has unknown fields {sorted(unknown)} (known: {sorted(known)})")
    values: dict[str, Any] = {}
    for f in spec.fields:
        if f.name in without:
            continue
        if f.name in flat:
            own = {k: v for k, v in items.items() if k in flat[f.name]}
            if own:  # its keys sit in this object: a failure's path is this object's
                sub = _records_in(f.type)[0]
                values[f.name] = _read_record(sub, _raw_object(own) if raw else own, raw=raw)
        elif f.name in items:
            values[f.name] = _at(f.name, _reader(f.type) if raw else _converter(f.type), items[f.name])
        elif f.default is dataclasses.MISSING:
            raise _Invalid([], "missing", f.name)
        elif not construct:
            values[f.name] = f.default
    if spec.unknown is not None and unknown:
        values[spec.unknown] = {k: _unknown_value(k, items[k], raw=raw) for k in unknown}
    if not construct:
        return values
    try:
        return cls(**values)
    except (ConfigError, ValueError) as exc:
        raise _Invalid([], "own", str(exc), exc) from None


def _raw_object(items: dict[str, msgspec.Raw]) -> bytes:
    return b"{" + b",".join(msgspec.json.encode(k) + b":" + bytes(v) for k, v in items.items()) + b"}"


def _unknown_value(key: str, value: Any, *, raw: bool) -> Any:
    """A newer writer's value, plain JSON within the nesting limit (the types bound the depth of the rest)."""
    if raw and json_depth(bytes(value)) > MAX_JSON_DEPTH // 2:
        raise _Invalid([key], "own", f"is nested more than {MAX_JSON_DEPTH // 2} levels deep, over the limit")
    return msgspec.json.decode(value) if raw else value


_PATH = re.compile(r" - at `\$(.*)`$")
_SEGMENT = re.compile(r"\.([A-Za-z_]\w*)|\[(\d+)\]|\[\.\.\.\]")
_MISSING = re.compile(r"Object missing required field `(\w+)`")


def _from_msgspec(exc: msgspec.ValidationError, prefix: list) -> _Invalid:
    """msgspec's error (``Expected `int` >= 1 - at `$.ranks[0].batch```) as a path and its words."""
    text, path = str(exc), list(prefix)
    found = _PATH.search(text)
    if found:
        text = text[: found.start()]
        for name, index in (m.groups() for m in _SEGMENT.finditer(found.group(1))):
            path.append(
                name if name else int(index) if index else ...
            )  # ...: a dict's value, its key unknown
    cause = exc.__cause__
    if isinstance(cause, _Nested):
        return _Invalid(
            path + cause.invalid.path, cause.invalid.kind, cause.invalid.text, cause.invalid.cause
        )
    if isinstance(cause, ValueError):
        return _Invalid(path, "own", text, cause)
    missing = _MISSING.match(text)
    return _Invalid(path, "missing", missing.group(1)) if missing else _Invalid(path, "msgspec", text)


# ------------------------------------------------------------------------------------------------ messages


class _Key(str):
    """A dict key on a path (shown ``['key']``), where a plain str is a field name (shown ``.name``)."""


def _explained(cls: Any, exc: BaseException, document: Any, where: str, fix: str) -> ConfigError:
    """One ConfigError for a failure of reading ``cls`` from ``document``: the path made whole, then the words of
    the record's own check, of the innermost field described above the failure, or msgspec's, in ours."""
    invalid = exc if isinstance(exc, _Invalid) else _from_msgspec(exc, [])  # type: ignore[arg-type]
    path, hints, values, owner = _walk(cls, document, invalid.path)
    at = _join(where, _path_text(path))
    if invalid.kind == "own" and invalid.cause is None:
        return ConfigError(_with_fix(f"{at} {invalid.text}", fix))
    if invalid.kind == "own":  # the record's words, on its values as written where it speaks for them
        record = _strip(_optional_of(hints[-1]))
        written = _own_words(record, values[-1]) if dataclasses.is_dataclass(record) else None
        return _own_error(written or invalid.cause, where, path, fix)
    if invalid.kind == "missing":
        return ConfigError(_with_fix(f"{at} lacks the field '{invalid.text}'", fix))
    if owner is not None and (own := _own_words(owner[0], values[owner[1]])) is not None:
        return _own_error(own, where, path[: owner[1]], fix)
    cut = next((i for i in range(len(path), -1, -1) if _described(hints[i])), None)
    if cut is not None:
        return ConfigError(
            _with_fix(
                f"{_join(where, _path_text(path[:cut]))} must {_described(hints[cut])}, got "
                f"{_shown(values[cut])}",
                fix,
            )
        )
    return ConfigError(_with_fix(f"{at} {_rule(invalid, hints[-1])}, got {_shown(values[-1])}", fix))


def _walk(cls: Any, document: Any, segments: list) -> tuple[list, list, list, tuple[type, int] | None]:
    """Follow ``segments`` through the annotation and the document: the path (a dict's keys filled in), the
    annotation and the value at each step (the root's first), and (class, step) of the innermost record the
    failure lies in a field of, where that record speaks for its fields (``JobSpec``)."""
    path, hints, values, owner = [], [cls], [document], None
    for segment in segments:
        tp, value = _strip(_optional_of(hints[-1])), values[-1]
        if _tagged_base(tp):
            tp = _tags(tp).get(value.get(tp.tag_field)) if isinstance(value, dict) else None
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            speaks = _spec(tp).own_checks and not any(_records_in(f.type) for f in _spec(tp).fields)
            owner = (tp, len(values) - 1) if speaks else None
            tp = _hints(tp).get(segment) or next(
                (
                    _hints(r)[segment]
                    for f in _spec(tp).fields
                    if f.role == FLATTENED["codec"]
                    for r in _records_in(f.type)
                    if segment in _hints(r)
                ),
                Any,
            )
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
            segment = _Key(_failing_key(value, tp) if segment is ... else segment)
        elif typing.get_origin(tp) is tuple:
            args = typing.get_args(tp)
            tp = args[0] if args[1:] == (Ellipsis,) else args[segment] if segment < len(args) else Any
        else:
            tp = Any
        path.append(segment)
        hints.append(tp)
        values.append(value[segment] if isinstance(value, dict | list) and segment in _range(value) else None)
    return path, hints, values, owner


def _range(value: Any) -> Any:
    return value if isinstance(value, dict) else range(len(value))


def _failing_key(mapping: Any, value_type: Any) -> str:
    """The first key of ``mapping`` whose value ``value_type`` refuses (msgspec names a dict's value ``[...]``)."""
    for key, item in mapping.items() if isinstance(mapping, dict) else ():
        try:
            _converter(value_type)(item)
        except (msgspec.ValidationError, _Invalid):
            return key
    return "..."


def _own_words(cls: type, data: Any) -> BaseException | None:
    """What the record's own check says of ``data`` (its fields as found, lists as tuples), or None."""
    if not isinstance(data, dict):
        return None
    known = {f.name for f in _spec(cls).fields}
    try:
        cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in known})
    except (ConfigError, ValueError) as exc:
        return exc
    except Exception:  # noqa: BLE001  its check tripped on the wrong kind of value: the codec's words then
        return None
    return None


def _own_error(cause: BaseException, where: str, record_path: list, fix: str) -> ConfigError:
    """A record's own check's error, the record at ``record_path``; the document's fix added where the check's
    words end without one of their own."""
    at = _path_text(record_path)
    text = (
        cause.render(lambda name: f"{at}.{name}" if at else name)
        if isinstance(cause, FieldError)
        else str(cause)
    )
    text = text if text.endswith(")") else _with_fix(text, fix)
    return ConfigError(
        f"{where}: {text}" if isinstance(cause, FieldError) or not at else f"{_join(where, at)}: {text}"
    )


def _described(tp: Any) -> str | None:
    """The description of an annotation, or of what an optional holds."""
    for candidate in (tp, _optional_of(tp)):
        while typing.get_origin(candidate) is typing.Annotated:
            args = typing.get_args(candidate)
            found = next((m.description for m in args[1:] if isinstance(m, Meta) and m.description), None)
            if found:
                return found
            candidate = args[0]
    return None


_EXPECTED = re.compile(r"Expected `([^`]+)`(?:, got `[^`]+`)?(.*)$")
_NAMES = {"object": "dict", "array": "list", "float": "int/float"}


def _rule(invalid: _Invalid, tp: Any) -> str:
    """msgspec's words for what a value must be, in ours: ``must be dict/null``, ``must be >= 1``."""
    if invalid.kind == "type":
        return f"must be {'list' if typing.get_origin(_strip(_optional_of(tp))) is tuple else 'dict'}"
    if invalid.text.startswith("Invalid enum value"):
        inner = _strip(_optional_of(tp))
        values = (
            [m.value for m in inner]
            if isinstance(inner, type) and issubclass(inner, enum.Enum)
            else typing.get_args(inner)
        )
        return f"must be one of {', '.join(map(str, values))}"
    found = _EXPECTED.match(invalid.text)
    if found is None:
        return f"is invalid ({invalid.text.replace('`', '')})"
    kinds, rest = found.groups()
    rest = re.sub(r"(?<=[<>=] )(-?\d+)\.0\b|, got .*$", lambda m: m.group(1) or "", rest).strip()
    if rest.startswith("matching regex"):
        return f"must match {rest.removeprefix('matching regex ')}"
    if rest:  # a bound or a length: `int` >= 1, `array` of length <= 64
        return f"must be {rest}"
    return "must be " + "/".join(_NAMES.get(k, k) for k in kinds.split(" | "))


def _join(where: str, at: str) -> str:
    return f"{where}{at}" if at.startswith("[") or not at else f"{where}: {at}"


def _with_fix(message: str, fix: str) -> str:
    return f"{message} ({fix})" if fix else message


def _path_text(path: list) -> str:
    """``ranks[3].speed_factor``, ``profiles['ab12'].memory_fit``."""
    text = ""
    for segment in path:
        if isinstance(segment, int):
            text += f"[{segment}]"
        elif isinstance(segment, _Key):
            text += f"[{str(segment)!r}]"
        else:
            text += f".{segment}" if text else str(segment)
    return text


def _shown(value: Any) -> str:
    """A value for an error message: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else f"{text[: _SHOWN_CHARS - 3]}..."
