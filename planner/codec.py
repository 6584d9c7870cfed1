"""The one codec of batchplan's documents: every record declared once, as a frozen dataclass, and read from and
written to strict JSON here (msgspec). The codec knows no record type; a record says everything about itself:

- its fields' types: ``int``, ``float`` (an integer is accepted), ``str``, ``bool``, ``None`` (optional),
  tuples, dicts with string keys, ``Literal`` and ``Enum`` choices, other records, ``Any`` (plain JSON);
- bounds and patterns in ``Annotated[T, Meta(ge=..., le=..., pattern=...)]``; ``Meta(description=...)``
  completes "<field> must ..." in an error message where the type alone would say too little
  (``"be a share of the profiled speed in (0, 1]"``, ``"map names to strings"``);
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

__all__ = ["FLATTENED", "NOT_WRITTEN", "OMIT_DEFAULT", "UNKNOWN_KEYS", "Meta", "convert", "decode", "decode_fields",
           "encode", "forbid_unknown_keys"]

T = TypeVar("T")

OMIT_DEFAULT = {"codec": "omit_default"}
"""field metadata: not written while the field holds its default"""
NOT_WRITTEN = {"codec": "not_written"}
"""field metadata: in the program only, neither written nor read"""
UNKNOWN_KEYS = {"codec": "unknown_keys"}
"""field metadata: the dict that keeps a newer writer's keys this record does not know"""
FLATTENED = {"codec": "flattened"}
"""field metadata: an optional record written as keys of this record's object (present when any of them is)"""

_FORBID = "__codec_forbids_unknown_keys__"
#: most characters of a value an error message shows (a hostile field can be megabytes)
_SHOWN_CHARS = 80


def forbid_unknown_keys(cls: type[T]) -> type[T]:
    """Class decorator: a key the record does not declare is an error, not ignored."""
    setattr(cls, _FORBID, True)
    return cls


# ------------------------------------------------------------------------------------------------ encoding


def encode(record: Any) -> Any:
    """``record`` (a dataclass, or a tuple, list or dict of them) as plain JSON data: dicts in field order,
    lists, enums as their values; the field metadata of the module docstring applied."""
    return _fix_by_value(record, msgspec.to_builtins(record, enc_hook=_enc_hook))


def _fix_by_value(value: Any, data: Any) -> Any:
    """The fixer of ``value``'s own type, where its annotation is not known (the top of :func:`encode`)."""
    if dataclasses.is_dataclass(value):
        return _fixer(type(value))(value, data)
    if isinstance(value, (tuple, list)):
        return [_fix_by_value(v, d) for v, d in zip(value, data, strict=True)]
    if isinstance(value, dict):
        return {k: _fix_by_value(value[k], d) for k, d in data.items()}
    return data


def _enc_hook(value: Any) -> Any:
    if isinstance(value, str):  # a str subclass carrying more (planner.allocate.advice.Advice): its text
        return str(value)
    raise TypeError(f"{type(value).__name__} is not part of a document")


Fixer = Callable[[Any, Any], Any]
"""(value, what ``to_builtins`` made of it) -> the JSON data of it: tuples as lists, the metadata applied"""


def _keep(value: Any, data: Any) -> Any:
    return data


def _plain(data: Any) -> Any:
    """Tuples as lists, at any depth (data of an ``Any`` field)."""
    if isinstance(data, (tuple, list)):
        return [_plain(v) for v in data]
    if isinstance(data, dict):
        return {k: _plain(v) for k, v in data.items()}
    return data


@functools.cache
def _fixer(tp: Any) -> Fixer:
    inner = _strip(tp)
    origin, args = typing.get_origin(inner), typing.get_args(inner)
    if isinstance(inner, type) and dataclasses.is_dataclass(inner):
        return functools.partial(_fix_record, inner)
    if _tagged_base(inner):
        return lambda value, data: _fixer(type(value))(value, data)
    if inner is Any:
        return lambda value, data: _plain(data)
    if origin in (typing.Union, types.UnionType):
        members = [(m, _fixer(m)) for m in args if m is not type(None)]
        if all(f is _keep for _, f in members):
            return _keep
        return lambda value, data: data if value is None else _fixer(type(value) if dataclasses.is_dataclass(value)
                                                                     else _union_member(members, value))(value, data)
    if origin in (tuple, list):
        items = [_fixer(a) for a in args if a is not Ellipsis]
        if all(f is _keep for f in items):
            return lambda value, data: list(data)
        if len(args) == 2 and args[1] is Ellipsis:
            item = items[0]
            return lambda value, data: [item(v, d) for v, d in zip(value, data, strict=True)]
        return lambda value, data: [f(v, d) for f, v, d in zip(items, value, data, strict=True)]
    if origin is dict:
        item = _fixer(args[1])
        if item is _keep:
            return _keep
        return lambda value, data: {k: item(value[k], d) for k, d in data.items()}
    return _keep


def _union_member(members: list, value: Any) -> Any:
    return next((m for m, _ in members if _kind_fits(m, value if not isinstance(value, tuple) else list(value))), Any)


def _fix_record(cls: type, value: Any, data: dict) -> dict:
    spec = _spec(cls)
    for name in spec.dropped:
        data.pop(name, None)
    for name, default in spec.omitted:
        if getattr(value, name) == default:
            data.pop(name, None)
    for f in spec.fields:
        fix = _fixer(f.type)
        if fix is not _keep and f.name in data:
            data[f.name] = fix(getattr(value, f.name), data[f.name])
    if spec.flattened:
        flat: dict = {}
        for name, item in data.items():
            if name in spec.flattened:
                flat.update(item or {})
            else:
                flat[name] = item
        data.clear()
        data.update(flat)
    if spec.unknown_field is not None:
        data.update(_plain(data.pop(spec.unknown_field) or {}))
    return data


# ------------------------------------------------------------------------------------------------ records


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    type: Any
    required: bool


@dataclasses.dataclass(frozen=True)
class _Spec:
    """What the codec needs of one record class, worked out once."""

    fields: tuple[_Field, ...]
    """the fields read from and written to documents"""
    dropped: tuple[str, ...]
    """NOT_WRITTEN fields"""
    omitted: tuple[tuple[str, Any], ...]
    """OMIT_DEFAULT fields and their defaults"""
    unknown_field: str | None
    flattened: dict[str, type]
    """FLATTENED fields and their record classes"""
    forbids_unknown: bool
    own_checks: bool
    """the class has a ``__post_init__``"""
    custom: bool
    """read key by key here, not by msgspec alone: the record or one inside it has keys to keep, forbid or skip"""


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


@functools.cache
def _spec(cls: type) -> _Spec:
    hints = _hints(cls)
    fields, dropped, omitted, unknown, flattened = [], [], [], None, {}
    for f in dataclasses.fields(cls):
        role = f.metadata.get("codec")
        if role == NOT_WRITTEN["codec"]:
            dropped.append(f.name)
            continue
        if role == UNKNOWN_KEYS["codec"]:
            unknown = f.name
            continue
        if role == OMIT_DEFAULT["codec"]:
            omitted.append((f.name, f.default if f.default is not dataclasses.MISSING else f.default_factory()))
        if role == FLATTENED["codec"]:
            flattened[f.name] = next(iter(_records_in(hints[f.name])))
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        fields.append(_Field(f.name, hints[f.name], required))
    forbids = bool(getattr(cls, _FORBID, False))
    custom = bool(dropped or unknown or forbids or flattened) or any(
        _spec(r).custom for f in fields for r in _records_in(f.type) if r is not cls)
    return _Spec(fields=tuple(fields), dropped=tuple(dropped), omitted=tuple(omitted), unknown_field=unknown,
                 flattened=flattened, forbids_unknown=forbids, own_checks=hasattr(cls, "__post_init__"), custom=custom)


def _records_in(tp: Any) -> list[type]:
    """The record classes a type annotation can hold, at any depth (tagged bases' subclasses included)."""
    found: list[type] = []
    stack = [tp]
    while stack:
        current = _strip(stack.pop())
        if isinstance(current, type) and dataclasses.is_dataclass(current):
            found.append(current)
        elif _tagged_base(current):
            found.extend(current.__subclasses__())
        else:
            stack.extend(typing.get_args(current))
    return found


def _strip(tp: Any) -> Any:
    """``Annotated[T, ...]`` -> T."""
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _tagged_base(tp: Any) -> bool:
    return isinstance(tp, type) and not dataclasses.is_dataclass(tp) and isinstance(getattr(tp, "tag_field", None), str)


@functools.cache
def _tags(base: type) -> dict[Any, type]:
    """tag value -> dataclass subclass of a tagged base."""
    out = {}
    for sub in base.__subclasses__():
        literal = typing.get_args(_strip(_hints(sub)[base.tag_field]))
        for value in literal:
            out[value] = sub
    return out


def _dec_hook(tp: type, obj: Any) -> Any:
    if _tagged_base(tp):
        if not isinstance(obj, dict):
            raise ValueError(f"must be an object, got {_shown(obj)}")
        tag = obj.get(tp.tag_field)
        sub = _tags(tp).get(tag)
        if sub is None:
            raise ValueError(f"{tp.tag_field} {_shown(tag)} is not one of {', '.join(map(str, _tags(tp)))}")
        try:
            return msgspec.convert(obj, sub, dec_hook=_dec_hook)
        except msgspec.ValidationError as exc:
            raise _Nested(_from_msgspec(exc, [])) from None
    raise ValueError(f"a {tp.__name__} is not read from a document")


class _Nested(ValueError):
    """Internal: a failure inside a tagged record, carried out of msgspec's ``dec_hook`` (which adds the path
    to the record)."""

    def __init__(self, invalid: _Invalid) -> None:
        super().__init__(invalid.message)
        self.invalid = invalid


# ------------------------------------------------------------------------------------------------ decoding


class _Invalid(Exception):
    """Internal: a failure at a path (segments: field names, indexes, dict keys) with what is wrong."""

    def __init__(self, path: list, message: str, cause: BaseException | None = None, kind: str = "msgspec") -> None:
        super().__init__(message)
        self.path = path
        self.message = message
        self.cause = cause
        self.kind = kind


def decode(cls: Any, raw: bytes | str, *, where: str, fix: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The ``cls`` (a record, or any annotation: ``tuple[RankEntry, ...]``) of the JSON text ``raw``.

    Args:
        where: how messages name the document (a file's path).
        fix: what the user can do, appended to every message (``"regenerate it with batchplan plan"``).

    Raises:
        ConfigError: one line naming ``where``, the path in the document, the rule and the fix.
    """
    return _decode(cls, raw, _reader(cls), where=where, fix=fix, max_depth=max_depth)


def decode_fields(cls: type, raw: bytes | str, *, where: str, fix: str, without: tuple[str, ...]) -> dict[str, Any]:
    """The fields of the record ``cls`` in the JSON text ``raw``, all but ``without`` (absent or ignored there),
    each read and checked as :func:`decode` would; the record itself is not constructed, so its own checks
    across fields are the caller's (a reader of part of a large document).

    Raises:
        ConfigError: as :func:`decode`.
    """
    read = functools.partial(_read_record, cls, raw=True, construct=False, without=without)
    return _decode(cls, raw, read, where=where, fix=fix, max_depth=MAX_JSON_DEPTH)


def _decode(cls: Any, raw: bytes | str, read: Callable[[bytes], Any], *, where: str, fix: str, max_depth: int) -> Any:
    data = raw.encode() if isinstance(raw, str) else raw
    try:
        if not _plainly_clean(data):  # a control character, a surrogate, ...: the strict parser names it
            _strict_load(data, where, fix, max_depth)  # raises where something is wrong; else the text was clean
        return read(data)
    except RecursionError:  # msgspec's guard against deep nesting: the strict parser names the depth
        _strict_load(data, where, fix, max_depth)
        raise ConfigError(f"{where} is nested too deeply ({fix})") from None
    except msgspec.DecodeError:  # not JSON, or not as strict as ours: the strict parser says which
        _strict_load(data, where, fix, max_depth)
        raise ConfigError(f"{where} is not valid JSON ({fix})") from None
    except (msgspec.ValidationError, _Invalid) as exc:
        raise _explained(cls, exc, lambda: _strict_load(data, where, fix, max_depth), where, fix) from None


def convert(cls: Any, data: Any, *, where: str, fix: str = "") -> Any:
    """The ``cls`` of JSON-like ``data`` already in memory (dicts, lists, str, int, float, bool, None), held
    to the rules of :func:`decode` (``planner.jsonio.check_tree`` for the text)."""
    check_tree(data, where)
    return _convert_document(cls, data, where, fix)


def _convert_document(cls: Any, data: Any, where: str, fix: str) -> Any:
    try:
        return _converter(cls)(data)
    except (msgspec.ValidationError, _Invalid) as exc:
        raise _explained(cls, exc, lambda: data, where, fix) from None


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
            digits = data[at + 2:at + 6].lower()
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


def _build(tp: Any, *, raw: bool) -> Callable[[Any], Any]:
    if not _needs_custom(tp):
        if raw:
            return msgspec.json.Decoder(tp, dec_hook=_dec_hook).decode
        return functools.partial(msgspec.convert, type=tp, dec_hook=_dec_hook)
    inner = _strip(tp)
    origin, args = typing.get_origin(inner), typing.get_args(inner)
    if isinstance(inner, type) and dataclasses.is_dataclass(inner):
        return functools.partial(_read_record, inner, raw=raw)
    if origin in (typing.Union, types.UnionType) and type(None) in args and len(args) == 2:
        other = _build(next(a for a in args if a is not type(None)), raw=raw)
        return _optional(other, raw=raw)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return functools.partial(_read_sequence, _build(args[0], raw=raw), raw=raw)
    if origin is dict:
        return functools.partial(_read_mapping, _build(args[1], raw=raw), raw=raw)
    raise TypeError(f"the codec cannot read {tp!r}: a record that keeps, forbids or skips keys may sit only in a "
                    "record, an optional, a tuple or a dict")


def _needs_custom(tp: Any) -> bool:
    return any(_spec(r).custom for r in _records_in(tp))


_RAW_OBJECT = msgspec.json.Decoder(dict[str, msgspec.Raw])
_RAW_ARRAY = msgspec.json.Decoder(list[msgspec.Raw])


def _raw_object(items: dict[str, msgspec.Raw]) -> bytes:
    """JSON text of an object of raw values (a flattened record's keys, to read as the record)."""
    return b"{" + b",".join(msgspec.json.encode(k) + b":" + bytes(v) for k, v in items.items()) + b"}"


def _optional(inner: Callable[[Any], Any], *, raw: bool) -> Callable[[Any], Any]:
    def read(value: Any) -> Any:
        if (bytes(value).strip() == b"null") if raw else value is None:
            return None
        return inner(value)

    return read


def _read_sequence(item: Callable[[Any], Any], value: Any, *, raw: bool) -> tuple:
    items = _RAW_ARRAY.decode(value) if raw else value
    if not isinstance(items, (list, tuple)):
        raise _Invalid([], "", kind="type")
    return tuple(_at(i, item, v) for i, v in enumerate(items))


def _read_mapping(item: Callable[[Any], Any], value: Any, *, raw: bool) -> dict:
    items = _RAW_OBJECT.decode(value) if raw else value
    if not isinstance(items, dict):
        raise _Invalid([], "", kind="type")
    return {k: _at(_Key(k), item, v) for k, v in items.items()}


def _at(segment: Any, read: Callable[[Any], Any], value: Any) -> Any:
    """``read(value)``, a failure's path prefixed with ``segment``."""
    try:
        return read(value)
    except _Invalid as exc:
        exc.path.insert(0, segment)
        raise
    except msgspec.ValidationError as exc:
        raise _from_msgspec(exc, [segment]) from None


def _read_record(cls: type, value: Any, *, raw: bool, construct: bool = True, without: tuple[str, ...] = ()) -> Any:
    spec = _spec(cls)
    if raw:
        try:
            items = _RAW_OBJECT.decode(value)
        except msgspec.ValidationError:
            raise _Invalid([], "", kind="type") from None
    else:
        if not isinstance(value, dict):
            raise _Invalid([], "", kind="type")
        items = value
    known = {f.name: f for f in spec.fields if f.name not in spec.flattened and f.name not in without}
    nested = {name: {f.name for f in _spec(sub).fields} for name, sub in spec.flattened.items()}
    unknown = [k for k in items if k not in known and k not in without and not any(k in n for n in nested.values())]
    if unknown and spec.forbids_unknown:
        raise _Invalid([], f"has unknown fields {sorted(unknown)} (known: {sorted(known)})", kind="own")
    for f in known.values():
        if f.required and f.name not in items:
            raise _Invalid([], f.name, kind="missing")
    values = {f.name: _at(f.name, _reader(f.type) if raw else _converter(f.type), items[f.name])
              for f in known.values() if f.name in items}
    for name, names in nested.items():
        own = {k: v for k, v in items.items() if k in names}
        if own:  # its keys sit in this object: a failure's path is this object's
            values[name] = _read_record(spec.flattened[name], own if not raw else _raw_object(own), raw=raw)
    if spec.unknown_field is not None and unknown:
        values[spec.unknown_field] = {k: _unknown_value(k, items[k], raw=raw) for k in unknown}
    if not construct:  # the absent fields at their defaults, as the record would hold them
        defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                    for f in dataclasses.fields(cls) if f.name not in values and f.name not in without
                    and (f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING)}
        return {**defaults, **values}
    try:
        return cls(**values)
    except (ConfigError, ValueError) as exc:
        raise _Invalid([], str(exc), cause=exc, kind="own") from None


def _unknown_value(key: str, value: Any, *, raw: bool) -> Any:
    """A newer writer's value, plain JSON within the nesting limit (the types bound the depth of the rest)."""
    if not raw:
        return value
    if json_depth(bytes(value)) > MAX_JSON_DEPTH // 2:
        raise _Invalid([key], f"is nested more than {MAX_JSON_DEPTH // 2} levels deep, over the limit", kind="own")
    return msgspec.json.decode(value)


_PATH = re.compile(r" - at `\$(.*)`$")
_SEGMENT = re.compile(r"\.([A-Za-z_]\w*)|\[(\d+)\]|\[\.\.\.\]")


def _from_msgspec(exc: msgspec.ValidationError, prefix: list) -> _Invalid:
    """msgspec's error (``Expected `int` >= 1 - at `$.ranks[0].batch```) as a path and a message."""
    text = str(exc)
    found = _PATH.search(text)
    path = list(prefix)
    if found:
        text = text[:found.start()]
        for name, index in (m.groups() for m in _SEGMENT.finditer(found.group(1))):
            path.append(name if name else int(index) if index else ...)  # ...: a dict's value, key unknown yet
    cause = exc.__cause__ if isinstance(exc.__cause__, ValueError) else None
    if isinstance(cause, _Nested):
        inner = cause.invalid
        return _Invalid(path + inner.path, inner.message, inner.cause, inner.kind)
    if cause is not None:
        return _Invalid(path, text, cause=cause, kind="own")
    missing = _MISSING.match(text)
    if missing:
        return _Invalid(path, missing.group(1), kind="missing")
    return _Invalid(path, text)


_MISSING = re.compile(r"Object missing required field `(\w+)`")


# ------------------------------------------------------------------------------------------------ messages


class _Key(str):
    """A dict key on a path (shown ``['key']``), where a plain str is a field name (shown ``.name``)."""


def _explained(cls: Any, exc: BaseException, load: Callable[[], Any], where: str, fix: str) -> ConfigError:
    """One ConfigError for a failure of reading ``cls``: the path made whole from the document (``load()``
    gives it, parsed strictly), then the words of the record's own check or of the rule broken."""
    invalid = exc if isinstance(exc, _Invalid) else _from_msgspec(exc, [])  # type: ignore[arg-type]
    document = load()
    path, tp, value, owner = _walk(cls, document, invalid.path)
    at = _join(where, _path_text(path))
    if invalid.kind == "own":
        if invalid.cause is not None:  # the record's words, on its values as written where it speaks for them
            record = _strip(_member_for(tp, value))
            as_written = (_own_words(record, value) if isinstance(record, type) and dataclasses.is_dataclass(record)
                          and _speaks_for_its_fields(record) else None)
            return _own_error(as_written or invalid.cause, where, path, fix)
        return ConfigError(_with_fix(f"{at} {invalid.message}", fix))
    if invalid.kind == "missing":
        return ConfigError(_with_fix(f"{at} lacks the field '{invalid.message}'", fix))
    if owner is not None:  # a record of plain fields with its own rules: its words for a value of the wrong kind
        own = _own_words(owner[0], owner[1])
        if own is not None:
            return _own_error(own, where, owner[2], fix)
    if _described(tp) is None:  # the innermost described field above the failure speaks, at its own path
        for cut in range(len(path) - 1, 0, -1):
            _, above, above_value, _ = _walk(cls, document, path[:cut])
            if _described(above) is not None:
                path, tp, value = path[:cut], above, above_value
                break
    return ConfigError(_with_fix(f"{_join(where, _path_text(path))} {_rule(tp, value, invalid.message)}", fix))


def _join(where: str, at: str) -> str:
    return f"{where}: {at}" if at else where


def _with_fix(message: str, fix: str) -> str:
    return f"{message} ({fix})" if fix else message


def _own_error(cause: BaseException, where: str, record_path: list, fix: str) -> ConfigError:
    """A record's own check's error, the record at ``record_path`` in the document; the document's fix added
    where the check's words end without one of their own."""
    at = _path_text(record_path)
    if isinstance(cause, FieldError):
        text = cause.render(lambda name: f"{at}.{name}" if at else name)
        return ConfigError(f"{where}: {text}" if text.endswith(")") else f"{where}: {_with_fix(text, fix)}")
    text = str(cause) if str(cause).endswith(")") else _with_fix(str(cause), fix)
    return ConfigError(f"{_join(where, at)}: {text}")


def _own_words(cls: type, data: Any) -> BaseException | None:
    """What the record's own check says of ``data`` (its fields as found, lists as tuples), or None."""
    known = {f.name for f in _spec(cls).fields}
    if not isinstance(data, dict):
        return None
    try:
        cls(**{k: _as_tuples(v) for k, v in data.items() if k in known})
    except (ConfigError, ValueError) as exc:
        return exc
    except Exception:  # noqa: BLE001  its check tripped on the wrong kind of value: the codec's words then
        return None
    return None


def _as_tuples(value: Any) -> Any:
    return tuple(_as_tuples(v) for v in value) if isinstance(value, list) else value


def _speaks_for_its_fields(cls: type) -> bool:
    """A record of plain fields (no record inside) with its own check (``JobSpec``): a value of the wrong kind
    in one of its fields is named in its words."""
    spec = _spec(cls)
    return spec.own_checks and not any(_records_in(f.type) for f in spec.fields)


def _walk(cls: Any, document: Any, segments: list) -> tuple[list, Any, Any, tuple | None]:
    """Follow ``segments`` through the annotation and the document: (the path, a dict's keys filled in; the
    annotation there; the value there; (class, data, path) of the record the failure lies in a field of,
    where that record speaks for its fields)."""
    tp, value, path, owner = cls, document, [], None
    for segment in segments:
        inner = _strip(_member_for(tp, value))
        origin, args = typing.get_origin(inner), typing.get_args(inner)
        if isinstance(inner, type) and dataclasses.is_dataclass(inner):
            owner = (inner, value, list(path)) if _speaks_for_its_fields(inner) else None
            tp = _hints(inner).get(segment) or next(
                (_hints(sub)[segment] for sub in _spec(inner).flattened.values() if segment in _hints(sub)), Any)
        elif _tagged_base(inner):
            sub = _tags(inner).get(value.get(inner.tag_field)) if isinstance(value, dict) else None
            tp = _hints(sub).get(segment, Any) if sub is not None else Any
        elif origin is dict:
            tp = args[1]
            segment = _Key(_failing_key(value, tp) if segment is ... else segment)
        elif origin in (tuple, list):
            tp = args[0] if len(args) == 1 or args[-1] is Ellipsis else (
                args[segment] if isinstance(segment, int) and segment < len(args) else Any)
        else:
            tp = Any
        path.append(segment)
        value = _child(value, segment)
    return path, _member_for(tp, value), value, owner


def _child(value: Any, segment: Any) -> Any:
    try:
        return value[segment]
    except (KeyError, IndexError, TypeError):
        return None


def _failing_key(mapping: Any, value_type: Any) -> str:
    """The first key of ``mapping`` whose value ``value_type`` refuses (msgspec names a dict's value ``[...]``)."""
    for key, item in (mapping.items() if isinstance(mapping, dict) else ()):
        try:
            _converter(value_type)(item)
        except (msgspec.ValidationError, _Invalid):
            return key
    return "..."


def _member_for(tp: Any, value: Any) -> Any:
    """Of a union, the member the value's JSON kind fits (the annotation itself where none does, where it is
    described as a whole, or where it is no union)."""
    inner = _strip(tp)
    if typing.get_origin(inner) not in (typing.Union, types.UnionType) or _described(tp):
        return tp
    return next((m for m in typing.get_args(inner) if _kind_fits(m, value)), tp)


def _kind_fits(tp: Any, value: Any) -> bool:
    """Whether ``value``'s JSON kind is one ``tp`` holds (bounds aside)."""
    inner = _strip(tp)
    origin = typing.get_origin(inner)
    if origin in (typing.Union, types.UnionType):
        return any(_kind_fits(m, value) for m in typing.get_args(inner))
    if inner is Any:
        return True
    if value is None:
        return inner is type(None)
    if isinstance(value, bool):
        return inner is bool
    if isinstance(value, int):
        return inner in (int, float)
    if isinstance(value, float):
        return inner is float
    if isinstance(value, str):
        return inner is str or origin is typing.Literal or (isinstance(inner, type) and issubclass(inner, enum.Enum))
    if isinstance(value, list):
        return origin in (tuple, list)
    if isinstance(value, dict):
        return origin is dict or (isinstance(inner, type) and (dataclasses.is_dataclass(inner) or _tagged_base(inner)))
    return False


def _metas(tp: Any) -> list[Meta]:
    out = []
    while typing.get_origin(tp) is typing.Annotated:
        args = typing.get_args(tp)
        out.extend(a for a in args[1:] if isinstance(a, Meta))
        tp = args[0]
    return out


def _described(tp: Any) -> str | None:
    return next((m.description for m in _metas(tp) if m.description), None)


def _rule(tp: Any, value: Any, msgspec_text: str) -> str:
    """``must ..., got ...``: what the annotation ``tp`` asks of the value found there."""
    got = f"got {_shown(value)}"
    description = _described(tp)
    if description is not None:
        return f"must {description}, {got}"
    inner = _strip(tp)
    if not _kind_fits(inner, value):
        return f"must be {_kinds(tp)}, {got}"
    if typing.get_origin(inner) is typing.Literal or (isinstance(inner, type) and issubclass(inner, enum.Enum)):
        return f"must be one of {_choices(inner)}, {got}"
    bounds = _bounds(tp)
    if bounds:
        return f"must be {bounds}, {got}"
    return f"is invalid ({msgspec_text.replace('`', '')}), {got}" if msgspec_text else f"is invalid, {got}"


def _bounds(tp: Any) -> str:
    parts = []
    for meta in _metas(tp):
        if meta.ge is not None and meta.le is not None:
            parts.append(f"in {_number(meta.ge)}..{_number(meta.le)}")
        else:
            parts.extend(f"{symbol} {_number(getattr(meta, name))}"
                         for name, symbol in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
                         if getattr(meta, name) is not None)
        if meta.max_length is not None:
            parts.append(f"at most {meta.max_length} long")
        if meta.min_length is not None:
            parts.append(f"at least {meta.min_length} long")
        if meta.pattern is not None:
            parts.append(f"matching {meta.pattern}")
    return " and ".join(parts)


def _number(bound: float) -> str:
    return f"{bound:g}" if isinstance(bound, float) else str(bound)


def _choices(inner: Any) -> str:
    if isinstance(inner, type) and issubclass(inner, enum.Enum):
        return ", ".join(str(m.value) for m in inner)
    return ", ".join(str(a) for a in typing.get_args(inner))


_KIND_NAMES = {int: "int", float: "int/float", str: "str", bool: "bool", type(None): "null"}


def _kinds(tp: Any) -> str:
    """How a message names what an annotation holds: ``dict/null``, ``list``, ``int/float``."""
    inner = _strip(tp)
    origin = typing.get_origin(inner)
    if origin in (typing.Union, types.UnionType):
        names = [_kinds(a) for a in typing.get_args(inner)]
        return "/".join(dict.fromkeys(n for name in names for n in name.split("/")))
    if inner in _KIND_NAMES:
        return _KIND_NAMES[inner]
    if origin in (tuple, list):
        return "list"
    if origin is dict or (isinstance(inner, type) and (dataclasses.is_dataclass(inner) or _tagged_base(inner))):
        return "dict"
    if origin is typing.Literal or (isinstance(inner, type) and issubclass(inner, enum.Enum)):
        return f"one of {_choices(inner)}"
    return "JSON"


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
    return text if len(text) <= _SHOWN_CHARS else f"{text[:_SHOWN_CHARS - 3]}..."
