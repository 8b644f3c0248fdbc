"""Stage configs are the one source of every option: its default, its checks, its help text and its title.

A config is a frozen, keyword-only dataclass whose fields are made with :func:`option`. The command line derives
its arguments from the fields (:func:`add_arguments`), the Airflow plugin derives the DAG's Params from them
(:func:`json_schema`), and every instance checks itself when made (:class:`Options`), however it was made, naming
the field. A config composed of several option groups (documents, rank files) inherits them, so an option shared
by two stages is written once.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field
from functools import cache
from typing import Any, Literal, TypeVar

from tokenization.errors import UsageError
from tokenization.storage.folder import Folder
from tokenization.storage.locations import malformed_url

NONE_WORDS = ("none", "null", "unlimited")  # what the command line takes for "no value" in an optional number
INT64 = (-(2**63), 2**63 - 1)  # every integer option's range
# The options that name a place, as every config names them, whose URLs must be well formed.
LOCATIONS = {"input", "inputs", "output", "cache", "local_working_dir", "merge_working_dir", "tokenizer"}
LOCATIONS |= {"chat_template", "stats_out", "annotate", "choice"}


@dataclass(frozen=True)
class Spec:
    """What a field is for, beyond its type and default."""

    help: str
    title: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    flag: str | None = None  # the command line's name when it is not --{name}; "" makes it positional
    flag_help: str | None = None  # the command line's help for a flag that turns an option off (--no-shuffle)
    cli: bool = True  # offered on the command line
    param: bool = True  # offered as a DAG param
    read: Callable[[str], Any] | None = None  # how the command line reads its value from its text (a file, say)
    schema: dict[str, Any] | None = None  # its JSON schema, when its type says too little (an object's fields)


def option(default: Any = MISSING, *, help: str, **spec: Any) -> Any:
    """A config field with its help text, title, bounds and where it is offered (see :class:`Spec`)."""
    metadata = {"option": Spec(help=help, **spec)}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Kind:
    """A field's type as the command line and JSON schema need it."""

    base: type  # str, int, float, bool, list or dict
    optional: bool  # None is allowed
    choices: tuple[Any, ...] | None  # a Literal's values


@dataclass(frozen=True, kw_only=True)
class Options:
    """The base of every config: checks bounds and choices when an instance is made; carries storage options."""

    storage_options: Mapping[str, Any] = option(
        {}, cli=False, param=False, help="per protocol, the filesystem's keyword arguments: {'s3': {'key': ...}}"
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # a pathlib.Path is taken for its string, as everywhere in Python
            value = getattr(self, f.name)
            if isinstance(value, list):
                object.__setattr__(self, f.name, [os.fspath(v) if isinstance(v, os.PathLike) else v for v in value])
            elif isinstance(value, os.PathLike):
                object.__setattr__(self, f.name, os.fspath(value))
        check(self)

    def folder(self, url: str) -> Folder:
        """``url`` as a Folder opened with this config's storage options."""
        return Folder(url, self.storage_options)


@cache
def fields_of(cls: type) -> tuple[tuple[dataclasses.Field[Any], Spec, Kind], ...]:
    """The option fields of a config class: its option groups' in the order the class lists them (the stages'
    order), then its own, each in definition order."""
    hints = _hints(cls)
    depth = {c: i for i, c in enumerate(cls.__mro__)}
    found = [f for f in dataclasses.fields(cls) if "option" in f.metadata]
    found.sort(key=lambda f: depth[owner] if (owner := _defining_class(cls, f.name)) is not cls else len(depth))
    return tuple((f, f.metadata["option"], kind_of(hints[f.name])) for f in found)


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def kind_of(hint: Any) -> Kind:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (inner,) = [a for a in args if a is not type(None)]
        return dataclasses.replace(kind_of(inner), optional=True)
    if typing.get_origin(hint) is Literal:
        return Kind(type(args[0]), False, args)
    return Kind(typing.get_origin(hint) or hint, False, None)


def check(config: Options) -> None:
    """Raise :class:`UsageError` naming the first field of the wrong type, out of its bounds or choices, a number
    that is not finite, or a location that reads like a URL missing a slash."""
    cls: type = type(config)  # as a type, which mypy knows to be hashable (a dataclass's type[...] it doubts)
    for f, spec, kind in fields_of(cls):
        value = getattr(config, f.name)
        if value is None:
            if not kind.optional:
                raise UsageError(f"{f.name} is required")
            continue
        if not _of_kind(value, kind):  # a function: value stays Any to the checks below, which its kind decides
            raise UsageError(f"{f.name} must be {_article(kind.base)}, got {value!r}")
        if kind.choices and value not in kind.choices:
            raise UsageError(f"{f.name} must be one of {', '.join(map(str, kind.choices))}, got {value!r}")
        if kind.base is str and not value:
            raise UsageError(f"{f.name} must not be empty")
        if kind.base is float and not math.isfinite(value):  # nan passes every bound: it would turn a limit off
            raise UsageError(f"{f.name} must be a finite number, got {value}")
        minimum, maximum = bounds(spec, kind)
        if minimum is not None and value < minimum:
            raise UsageError(f"{f.name} must be at least {_number(minimum)}, got {value}")
        if maximum is not None and value > maximum:
            raise UsageError(f"{f.name} must be at most {_number(maximum)}, got {value}")
        if f.name in LOCATIONS:
            for location in value if isinstance(value, list) else [value]:
                if wrong := malformed_url(location):
                    raise UsageError(f"{f.name} {wrong}")


def _of_kind(value: object, kind: Kind) -> bool:
    """Whether a field's value has its type: a float field takes an int too, and only a bool field takes a bool."""
    accepted = (int, float) if kind.base is float else kind.base
    return isinstance(value, accepted) and not (isinstance(value, bool) and kind.base is not bool)


def bounds(spec: Spec, kind: Kind) -> tuple[float | None, float | None]:
    """A field's bounds: its own, within a signed 64-bit integer's range for an integer, which every record
    (orjson), JSON reader and DAG Param holds."""
    if kind.base is not int:
        return spec.minimum, spec.maximum
    low, high = INT64
    return (
        low if spec.minimum is None else max(low, spec.minimum),
        high if spec.maximum is None else min(high, spec.maximum),
    )


def _number(bound: float) -> str:
    return f"{bound:g}" if isinstance(bound, float) else str(bound)  # 9223372036854775807, not 9.22337e+18


def _article(base: type) -> str:
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false"}.get(base, base.__name__)


def json_schema(f: dataclasses.Field[Any], spec: Spec, kind: Kind) -> dict[str, Any]:
    """A field's JSON schema, as Airflow's Params validate the trigger form and the run's conf."""
    if spec.schema is not None:
        return {**spec.schema, "type": ["null", spec.schema["type"]]} if kind.optional else spec.schema
    names = {str: "string", int: "integer", float: "number", bool: "boolean"}
    schema: dict[str, Any] = {"enum": list(kind.choices)} if kind.choices else {"type": names[kind.base]}
    if kind.optional:
        schema = {"enum": [None, *kind.choices]} if kind.choices else {"type": ["null", names[kind.base]]}
    if kind.base is str and not kind.choices:
        schema["minLength"] = 1
    schema |= {k: v for k, v in zip(("minimum", "maximum"), bounds(spec, kind), strict=True) if v is not None}
    return schema


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """One argument a field that the command line offers, in a group per option group, help with its default."""
    groups: dict[type, argparse.ArgumentParser | argparse._ArgumentGroup] = {}
    depth = {c: i for i, c in enumerate(cls.__mro__)}  # the command's own options first, then its groups'
    offered = [(f, spec, kind, _defining_class(cls, f.name)) for f, spec, kind in fields_of(cls) if spec.cli]
    for f, spec, kind, owner in sorted(offered, key=lambda item: depth[item[3]]):
        if owner not in groups:  # the command's own options stay in the parser's first group
            groups[owner] = parser if owner is cls else parser.add_argument_group(_title(owner))
        _add(groups[owner], f, spec, kind)


def _add(
    group: argparse.ArgumentParser | argparse._ArgumentGroup, f: dataclasses.Field[Any], spec: Spec, kind: Kind
) -> None:
    help_text = (spec.flag_help or spec.help) + _default_note(f, kind)
    if spec.flag == "":
        nargs = "+" if kind.base is list else "?" if kind.optional else None
        group.add_argument(f.name, nargs=nargs, metavar=f.name.upper().rstrip("S"), help=help_text)
        return
    flag = spec.flag or f"--{f.name.replace('_', '-')}"
    if kind.base is bool:
        action = "store_false" if f.default is True else "store_true"
        group.add_argument(flag, dest=f.name, action=action, default=f.default, help=help_text)
        return
    required = f.default is MISSING and f.default_factory is MISSING
    default = None if required else f.default
    metavar = None if kind.choices else "FILE" if spec.read else kind.base.__name__.upper()
    group.add_argument(
        flag,
        dest=f.name,
        type=_reader(spec.read) if spec.read else _parser(kind),
        choices=kind.choices,
        default=default,
        required=required,
        metavar=metavar,
        help=help_text,
    )


def _reader(read: Callable[[str], Any]) -> Callable[[str], Any]:
    """``read`` as argparse calls a type, its error's own line kept (argparse words a ValueError its own way)."""

    def parse(text: str) -> Any:
        try:
            return read(text)
        except UsageError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _parser(kind: Kind) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        if kind.optional and text.lower() in NONE_WORDS:
            return None
        return kind.base(text)

    parse.__name__ = kind.base.__name__  # argparse names the type in its error: "invalid int value: 'x'"
    return parse


def _default_note(f: dataclasses.Field[Any], kind: Kind) -> str:
    if kind.base is bool or f.default in (MISSING, None):
        return ""
    none = f"; {NONE_WORDS[-1]} for no limit" if kind.optional else ""
    return f" (default: {f.default:,}{none})" if kind.base is int else f" (default: {f.default}{none})"


def _defining_class(cls: type, name: str) -> type:
    for base in reversed(cls.__mro__):
        if name in getattr(base, "__annotations__", {}):
            return base
    return cls


def _title(owner: type) -> str:
    return (owner.__doc__ or owner.__name__).strip().splitlines()[0].rstrip(".")


def section(cls: type, name: str) -> str | None:
    """The option group a field of ``cls`` belongs to, as a short heading (``Reading and encoding``); None for the
    class's own fields."""
    owner = _defining_class(cls, name)
    return None if owner is cls else _title(owner).split(":")[0]


def params(config: Options) -> dict[str, Any]:
    """The config as manifests record it: every field but the storage options, which may hold credentials."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name != "storage_options"}


C = TypeVar("C", bound="Options")


def from_arguments(cls: type[C], args: argparse.Namespace, **extra: Any) -> C:
    """A config from parsed arguments (their dests are its field names) and ``extra`` fields."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in vars(args).items() if k in names}, **extra)
