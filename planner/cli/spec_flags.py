"""Command-line flags derived from a typed spec (``JobSpec``, preflight's ``Thresholds``): one flag per field.

The spec is the one spelling of the configuration: each flag's default is the field's default, its choices
the field's ``Literal`` values, its type the field's type, and without a help line of the CLI's its help is
the field's docstring. What only the command line knows is said here, per field, in a ``FlagForm``: a flag
name that is not the field's with dashes, a parser for text argparse cannot convert, a mutually exclusive
group, the help a user reads. A field added to the spec is a flag without any change here; its name in an
error message is its flag (``flag_name``, used by ``JobFieldError.render``).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import functools
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class FlagForm:
    """How one spec field is spelt on the command line, where the field alone cannot say it."""

    flag: str | None = None
    """the flag without ``--`` when it is not the field's name with dashes"""
    help: str | None = None
    """what ``--help`` says (without the default, which is added); default: the field's docstring"""
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None
    """text → value, for a field argparse cannot convert (a shape ``3,224,224``); errors are ConfigErrors"""
    exclusive: str | None = None
    """fields with the same name here are mutually exclusive flags"""
    planning_only: bool = False
    """shapes a plan over many GPUs, not one GPU's profile (``batchplan profile`` refuses it)"""
    required: bool = False


def flag_name(field: str, forms: Mapping[str, FlagForm]) -> str:
    """The flag that sets ``field``: ``--`` and the form's name, or the field's name with dashes."""
    form = forms.get(field)
    return "--" + (form.flag if form is not None and form.flag else field.replace("_", "-"))


@functools.cache
def field_docstrings(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass (the string literal after its annotation), one line."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for here, after in zip(body, body[1:], strict=False):
        if (
            isinstance(here, ast.AnnAssign)
            and isinstance(here.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            text = " ".join(after.value.value.split())
            docs[here.target.id] = re.sub(r"``([^`]*)``", r"\1", text)
    return docs


def _argparse_options(hint: Any, default: Any) -> dict[str, Any]:
    """argparse's ``type``/``choices``/``action`` for a field of type ``hint`` (``X | None`` is ``X``)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        hint = rest[0] if len(rest) == 1 else hint
    if typing.get_origin(hint) is typing.Literal:
        return {"choices": typing.get_args(hint)}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"choices": tuple(member.value for member in hint)}
    if hint is bool:
        return {"action": argparse.BooleanOptionalAction if default else "store_true"}
    if hint in (int, float, str):
        return {"type": hint}
    raise TypeError(f"no command-line form for a field of type {hint!r}: give its FlagForm a parse")


def _help(cls: type, field: str, form: FlagForm, default: Any) -> str:
    text = form.help or field_docstrings(cls).get(field, field.replace("_", " "))
    if default is not None and not isinstance(default, bool):
        text += f" (default {default.value if isinstance(default, enum.Enum) else default})"
    return text.replace("%", "%%")  # argparse formats help with %


class _Refused(argparse.Action):
    """A flag this command does not take: refused with the reason (rather than accepted and ignored)."""

    def __init__(self, option_strings, dest, reason: str = "", **kwargs) -> None:
        kwargs.pop("choices", None)
        kwargs.pop("type", None)
        super().__init__(option_strings, dest, nargs=None, **kwargs)
        self.reason = reason

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(self.reason.format(flag=option_string))


def _accept(form: FlagForm) -> str | None:
    return None


def add_spec_flags(
    group: argparse._ArgumentGroup,
    cls: type,
    forms: Mapping[str, FlagForm],
    *,
    refuse: Callable[[FlagForm], str | None] = _accept,
    required: Mapping[str, bool] | None = None,
) -> None:
    """One flag per field of the dataclass ``cls`` into ``group``, each with ``dest`` the field's name.

    Args:
        forms: the command-line forms of the fields that need one.
        refuse: for a field's form, why this command refuses the flag (``{flag}`` is replaced), or None.
        required: overrides of ``FlagForm.required`` for this command.
    """
    hints = typing.get_type_hints(cls)
    exclusive: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for spec_field in dataclasses.fields(cls):
        name = spec_field.name
        form = forms.get(name, FlagForm())
        default = None if spec_field.default is dataclasses.MISSING else spec_field.default
        target: Any = group
        if form.exclusive is not None:
            if form.exclusive not in exclusive:
                exclusive[form.exclusive] = group.add_mutually_exclusive_group()
            target = exclusive[form.exclusive]
        options = {"type": str} if form.parse is not None else _argparse_options(hints[name], default)
        reason = refuse(form)
        if reason is not None:
            target.add_argument(
                flag_name(name, forms),
                dest=name,
                default=default,
                action=_Refused,
                reason=reason,
                help=argparse.SUPPRESS,
            )
            continue
        is_required = (required or {}).get(name, form.required)
        flag = flag_name(name, forms)
        if options.get("action") is None and "choices" not in options:
            options["metavar"] = form.metavar or flag.removeprefix("--").replace("-", "_").upper()
        target.add_argument(
            flag,
            dest=name,
            default=default,
            required=is_required,
            help=_help(cls, name, form, default),
            **options,
        )


def spec_from_args(cls: type, forms: Mapping[str, FlagForm], args: argparse.Namespace) -> Any:
    """The ``cls`` the parsed flags spell (fields parsed by their form's ``parse``; validated by ``cls``)."""
    values = {}
    for spec_field in dataclasses.fields(cls):
        value = getattr(args, spec_field.name)
        form = forms.get(spec_field.name)
        if form is not None and form.parse is not None and isinstance(value, str):
            value = form.parse(value)
        values[spec_field.name] = value
    return cls(**values)


def spec_argv(spec: Any, forms: Mapping[str, FlagForm]) -> list[str]:
    """The flags that spell ``spec`` (the inverse of ``spec_from_args``): each field that differs from its default,
    a required one always; a tuple as ``a,b,c`` (``--input-shape``), an enum by its value, a flag without a value
    for a true ``store_true`` field, ``--no-...`` for a false field whose default is true."""
    argv: list[str] = []
    for spec_field in dataclasses.fields(spec):
        value = getattr(spec, spec_field.name)
        default = None if spec_field.default is dataclasses.MISSING else spec_field.default
        if spec_field.default is not dataclasses.MISSING and value == default:
            continue
        flag = flag_name(spec_field.name, forms)
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag.removeprefix("--"))
            continue
        if value is None:
            continue  # a default that is not None set back to None has no flag: not produced by the CLI
        if isinstance(value, tuple):
            text = ",".join(str(v) for v in value)
        else:
            text = str(value.value if isinstance(value, enum.Enum) else value)
        argv.append(f"{flag}={text}" if text.startswith("-") else flag)
        if not text.startswith("-"):
            argv.append(text)
    return argv
