"""The records' codec: a record kind is a frozen dataclass with a ``format`` tag
(``corpus-tokenization/{kind}/{version}``); ``to_json`` writes it, ``from_json`` reads it back and checks the tag and
the type of every field, so that a damaged or foreign record is one ``RecordError`` naming the file and the field,
never a ``KeyError`` deep inside a stage:

- a record of this version's format must hold every field, and nothing else (a flipped bit in a key is caught);
- a record of an older format this project wrote is read with the defaults of the fields it did not have yet;
- a newer or a foreign format is refused: read it with the version that wrote it.

Nested records (a manifest's output entries, its counts) carry no tag of their own; a record that is also a file
of its own (a merge output entry is its checkpoint) carries one there. A field whose JSON name differs from its
Python name says so in its metadata (``json_name``); a field added where its absence must keep meaning what it
meant (a plan's digest is of its JSON) is written only when it is not None (``unless_none``).

An open record (``OpenRecord``: a stage's params) names the keys its readers use, typed, and keeps every other key
as it read it: a key it does not name is no error, and a field its JSON did not hold reads as its default and is
not written back, so that a record an older version wrote is written back byte for byte (a plan's digest is of its
JSON).

A decoded record is read, never changed: the same bytes give every reader the one record (``_Decoded``), so its
lists and dicts, at any depth, refuse any change (a ``TypeError``); a reader builds what it needs of them anew.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import types
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Literal,
    NoReturn,
    TypeVar,
    Union,
    cast,
    get_args,
    get_origin,
    get_type_hints,
)

import orjson

from tokenization.errors import TokenizationError
from tokenization.storage.folder import Condition, Folder, PutMode

PROJECT = "corpus-tokenization"


JSON_TYPES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "an object"}
_PLAIN = frozenset((int, float, str, bool))  # read as they are, when of their hint's own type


class RecordError(TokenizationError, ValueError):
    """A record (a manifest, a completion marker, a build record) that cannot be read as one: truncated, not a JSON
    object, of another format, or a field missing, unknown or of the wrong type. One line names the file and the
    field, never a traceback."""

    def __init__(self, path: str, what: str, kind: str = "manifest"):
        super().__init__(f"{path}: not a valid {kind}: {what}")


R = TypeVar("R", bound="Record")


def _refused(self: object, *args: object, **kwargs: object) -> NoReturn:
    raise TypeError(f"a decoded record's {type(self).__name__} cannot be changed: it may be shared (``_Decoded``)")


if TYPE_CHECKING:  # to a type checker, what they are read as
    _FrozenList = list
    _FrozenDict = dict
else:

    class _FrozenList(list):
        """A decoded record's list: a list to every reader (orjson writes it as one), which nothing can change. The
        same bytes decode to one record, shared by every caller while it is kept (``_Decoded``): a change one made
        would be every other's, and no longer what the file holds."""

        __slots__ = ()
        append = extend = insert = pop = remove = clear = sort = reverse = _refused
        __setitem__ = __delitem__ = __iadd__ = __imul__ = _refused

        def __reduce__(self) -> tuple[type, tuple[list]]:  # a copy or a pickle, made whole
            return _FrozenList, (list(self),)

    class _FrozenDict(dict):
        """A decoded record's dict (``_FrozenList``'s reasons)."""

        __slots__ = ()
        __setitem__ = __delitem__ = __ior__ = setdefault = update = pop = popitem = clear = _refused

        def __reduce__(self) -> tuple[type, tuple[dict]]:
            return _FrozenDict, (dict(self),)


def _frozen(value: Any) -> Any:
    """A JSON value as read (an open record's extra keys, an ``Any`` field), its arrays and objects frozen."""
    if type(value) is list:
        return _FrozenList([_frozen(v) for v in value])
    if type(value) is dict:
        return _FrozenDict({k: _frozen(v) for k, v in value.items()})
    return value


def json_name(name: str) -> dict[str, Any]:
    """Field metadata: the field is called ``name`` in JSON."""
    return {"json_name": name}


def unless_none() -> dict[str, Any]:
    """Field metadata: the field is left out of the JSON while it is None, and read as None when absent."""
    return {"unless_none": True}


class Record:
    """A record kind (mixed into a frozen dataclass). ``KIND`` and ``VERSION`` make its format tag (every older
    version is read); ``UNTAGGED`` says whether files written before the kind had a tag are read (as version 0);
    ``LABEL`` is what a message calls it."""

    KIND: ClassVar[str | None] = None  # None: a part of other records, with no tag and no file of its own
    VERSION: ClassVar[int] = 1
    UNTAGGED: ClassVar[bool] = False
    LABEL: ClassVar[str] = "manifest"

    @classmethod
    def format_tag(cls) -> str:
        return f"{PROJECT}/{cls.KIND}/{cls.VERSION}"

    def to_json(self) -> dict[str, Any]:
        data = _encode(self)
        return {"format": self.format_tag(), **data} if self.KIND else data

    def dumps(self) -> bytes:
        """The record's bytes: indented, keys sorted, so equal records are equal files."""
        return orjson.dumps(self.to_json(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)

    @classmethod
    def from_json(cls: type[R], data: object, path: str) -> R:
        """The record in ``data`` (read from ``path``, which messages name), checked."""
        if not isinstance(data, dict):
            raise RecordError(path, f"the file is {shown(data)}, not an object", cls.LABEL)
        strict = cls.KIND is None or _version(cls, data, path) == cls.VERSION
        fields_of = {k: v for k, v in data.items() if k != "format"} if cls.KIND else data
        return _decode_record(cls, fields_of, _Reading(path, cls.LABEL, strict), "")

    @classmethod
    def loads(cls: type[R], data: bytes, path: str, parsed: object = None, digest: bytes | None = None) -> R:
        """The record in ``data`` (``parsed`` and ``digest``: its JSON and ``decoded``'s digest, when the caller
        has them); a large one read again with the same bytes is the one decoded then (``_Decoded``)."""
        if digest is None:
            found, digest = decoded((cls,), data)
            if found is not None:
                return found
        if parsed is None:
            try:
                parsed = orjson.loads(data)
            except orjson.JSONDecodeError as exc:
                raise RecordError(path, f"not JSON ({exc})", cls.LABEL) from None
        record = cls.from_json(parsed, path)
        if digest is not None:
            _decoded.put(digest, record)
        return record

    @classmethod
    def read(cls: type[R], folder: Folder, name: str, label: str | None = None) -> R | None:
        """The record ``name`` of ``folder`` (``label``: the location messages name; by default its URL), or None
        when there is no such file."""
        try:
            return cls.loads(folder.read(name), label or folder.url_of(name))
        except FileNotFoundError:
            return None

    def write(self, folder: Folder, name: str, mode: Condition = PutMode.OVERWRITE) -> None:
        """Write the record whole as ``name`` of ``folder``, under ``mode`` (``Folder.put``)."""
        folder.put(name, self.dumps(), mode)


DECODED_BYTES = 1 << 16  # records this large are kept decoded, by their bytes: a plan of 100,000 files is ~0.5 s
DECODED_KEPT = 8  # records kept decoded, the least recently read dropped first


class _Decoded:
    """The last large records decoded, by the sha256 of their bytes (not the bytes: a plan of 100,000 files is
    21 MB of them). A build's process reads its claim (its plan, every input file's row) and its ranks' manifests
    several times, each time checked afresh (a replaced run folder is refused): the same bytes decode to the same
    record, which is immutable (its lists and dicts too: ``_FrozenList``), so only the read and the hash are
    repeated. Other bytes are decoded, and checked, as the first were."""

    def __init__(self) -> None:
        self._records: OrderedDict[bytes, Record] = OrderedDict()
        self._lock = threading.Lock()  # a stage's threads read records too

    def get(self, digest: bytes) -> Record | None:
        with self._lock:
            found = self._records.get(digest)
            if found is not None:
                self._records.move_to_end(digest)
            return found

    def put(self, digest: bytes, record: Record) -> None:
        with self._lock:
            self._records[digest] = record
            while len(self._records) > DECODED_KEPT:
                self._records.popitem(last=False)


_decoded = _Decoded()


def decoded(kinds: tuple[type[R], ...], data: bytes) -> tuple[R | None, bytes | None]:
    """The record of one of ``kinds`` decoded lately from these very bytes, while it is kept (``_Decoded``), or
    None; and the bytes' digest, for ``Record.loads`` to keep what it decodes (None: too small to be kept)."""
    digest = hashlib.sha256(data).digest() if len(data) >= DECODED_BYTES else None
    found = None if digest is None else _decoded.get(digest)
    return (cast(R, found) if type(found) in kinds else None), digest


P = TypeVar("P", bound="OpenRecord")
OPEN = {"open": True}  # the metadata of an open record's own fields, which are not keys of its JSON


@dataclass(frozen=True, kw_only=True)
class OpenRecord(Record):
    """A record whose JSON holds keys beyond its typed fields (a stage's params: every option of its config, as the
    version that wrote it had them). Each field is a key some reader uses, with a default; ``extra`` holds every
    other key as read, and ``absent`` the fields the JSON did not hold, which are written back only once they hold
    another value than their default: a record read is written back exactly as it was read."""

    extra: dict[str, Any] = field(default_factory=dict, metadata=OPEN)
    absent: frozenset[str] = field(default=frozenset(), metadata=OPEN)

    def __post_init__(self) -> None:
        named = {_name(f) for f in _typed(type(self))}
        if clash := sorted(named & set(self.extra)):
            raise ValueError(f"{clash[0]} is a field, not an extra key")
        if unknown := sorted(self.absent - {f.name for f in _typed(type(self))}):
            raise ValueError(f"{unknown[0]} is not a field that can be absent")

    @classmethod
    def of(cls: type[P], values: Mapping[str, Any]) -> P:
        """The record of these values (a config's params, by name): the fields it names, the rest as ``extra``."""
        typed = {_name(f): f.name for f in _typed(cls)}
        return cls(
            **{typed[k]: v for k, v in values.items() if k in typed},
            extra={k: v for k, v in values.items() if k not in typed},
            absent=frozenset(name for key, name in typed.items() if key not in values),
        )


def _typed(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    """A record's fields that are keys of its JSON (all but an open record's own)."""
    return tuple(f for f in dataclasses.fields(cls) if not f.metadata.get("open"))


@dataclass(frozen=True)
class _Key:
    """What reading one field needs, worked out once a class (a plan of 100,000 files decodes 400,000 fields)."""

    name: str
    key: str  # its JSON name
    hint: Any
    unless_none: bool
    has_default: bool
    direct: frozenset[type]  # the JSON types it reads as they are (``_direct``)


@cache
def _keys(cls: type) -> tuple[tuple[_Key, ...], frozenset[str]]:
    """A record class's fields as read, and their JSON names."""
    hints = _hints(cls)
    keys = tuple(
        _Key(
            f.name,
            _name(f),
            hints[f.name],
            bool(f.metadata.get("unless_none")),
            _has_default(f),
            _direct(hints[f.name]),
        )
        for f in _typed(cls)
    )
    return keys, frozenset(k.key for k in keys)


def _direct(hint: Any) -> frozenset[type]:
    """The JSON types that a field of ``hint`` reads as they are, with no check but their type: its own plain type
    (an int where an int is read), or, of a union, each plain one and null where it may be null (most of a
    manifest's values, decoded without a call)."""
    if hint in _PLAIN:
        return frozenset((hint,))
    origin, args, _ = _shape(hint)
    if origin in (Union, types.UnionType):
        return frozenset(arg for arg in args if arg in _PLAIN or arg is type(None))
    return frozenset()


@cache
def _shape(hint: Any) -> tuple[Any, tuple[Any, ...], bool]:
    """A hint's origin, its arguments, and whether it names a record class."""
    return get_origin(hint), get_args(hint), isinstance(hint, type) and dataclasses.is_dataclass(hint)


@dataclass(frozen=True)
class _Reading:
    path: str
    label: str
    strict: bool  # this version's format: every field present, no other

    def error(self, at: At, what: str) -> RecordError:
        return RecordError(self.path, f"{_where(at) or 'the file'} {what}", self.label)


At = str | tuple[Any, str, Any]  # a place in a record: its parent's, and a field (".") or an item ("[]", "{}") there


def _where(at: At) -> str:
    """A place as messages name it (``counts.rejected["x"]``), worked out only for a message: a marker's 85 values
    each made its name, a string, before it was decoded (a third of its time)."""
    if isinstance(at, str):
        return at
    parent, kind, piece = at
    head = _where(parent)
    if kind == ".":
        return f"{head}.{piece}" if head else piece
    return f"{head}[{piece if kind == '[]' else orjson.dumps(piece).decode()}]"


def _version(cls: type[Record], data: dict[str, Any], path: str) -> int:
    tag = data.get("format")
    family = f"{PROJECT}/{cls.KIND}"
    if tag is None and cls.UNTAGGED:
        return 0
    if not isinstance(tag, str) or not tag.startswith(family + "/") or not tag[len(family) + 1 :].isdigit():
        raise RecordError(path, f"format {shown(tag)}, not {family}/N", cls.LABEL)
    version = int(tag[len(family) + 1 :])
    if version > cls.VERSION:
        raise RecordError(
            path,
            f"format {tag} is newer than this version of {PROJECT} reads ({cls.format_tag()}): upgrade to read it",
            cls.LABEL,
        )
    return version


@cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _name(f: dataclasses.Field[Any]) -> str:
    return f.metadata.get("json_name", f.name)


def _decode_record(cls: type, data: dict[str, Any], reading: _Reading, at: At) -> Any:
    keys, known = _keys(cls)
    values: dict[str, Any] = {}
    is_open = issubclass(cls, OpenRecord)
    absent = set()
    for f in keys:
        if f.key in data:
            value = data[f.key]
            values[f.name] = value if type(value) in f.direct else _decode(f.hint, value, reading, (at, ".", f.key))
        elif f.unless_none:
            values[f.name] = None
        elif is_open and f.has_default:
            absent.add(f.name)  # an open record's field that the version which wrote it did not have
        elif reading.strict or not f.has_default:
            raise reading.error((at, ".", f.key), "is missing")
    if is_open:
        values |= {"extra": _frozen({k: v for k, v in data.items() if k not in known}), "absent": frozenset(absent)}
    elif reading.strict and (unknown := set(data) - known):
        first = min(unknown)
        raise reading.error((at, ".", first), "is not a field of this format")
    try:
        return cls(**values)
    except ValueError as exc:  # the record's own check of its values (``__post_init__``)
        raise reading.error(at, str(exc)) from None


def _decode(hint: Any, value: object, reading: _Reading, at: At) -> Any:
    if (kind := type(value)) is hint and kind in _PLAIN:  # most values: an int or a string where one is read
        return value
    origin, args, is_record = _shape(hint)
    if origin in (Union, types.UnionType):
        options = [arg for arg in args if arg is not type(None)]
        if value is None and len(options) < len(args):
            return None
        # the option of the value's JSON kind (an object, a string...), so that its own error is the one told
        fitting = [option for option in options if _fits(option, value)] or options[-1:]
        return _decode(fitting[0], value, reading, at)
    if hint is Any:
        return _frozen(value)
    if origin is Literal:
        if value not in args:
            raise reading.error(at, f"is {shown(value)}, not one of {', '.join(map(shown, args))}")
        return value
    if is_record:  # a record's class (a hint is never an instance)
        if not isinstance(value, dict):
            raise reading.error(at, f"is {shown(value)}, not an object")
        return _decode_record(hint, value, reading, at)
    if origin is list:
        if not isinstance(value, list):
            raise reading.error(at, f"is {shown(value)}, not an array")
        (item,) = args
        return _FrozenList([_decode(item, v, reading, (at, "[]", i)) for i, v in enumerate(value)])
    if origin is dict:
        if not isinstance(value, dict):
            raise reading.error(at, f"is {shown(value)}, not an object")
        _, item = args
        return _FrozenDict({k: _decode(item, v, reading, (at, "{}", k)) for k, v in value.items()})
    expected = (int, float) if hint is float else hint
    if not isinstance(value, expected) or (isinstance(value, bool) and hint is not bool):
        raise reading.error(at, f"is {shown(value)}, not {JSON_TYPES[hint]}")
    return value


def _fits(hint: Any, value: object) -> bool:
    """Whether ``value`` is of the JSON kind that ``hint`` reads (its fields unchecked)."""
    origin, args, is_record = _shape(hint)
    if hint is Any:
        return True
    if origin is Literal:
        return value in args
    if is_record or origin is dict or hint is dict:
        return isinstance(value, dict)
    if origin is list:
        return isinstance(value, list)
    return isinstance(value, (int, float) if hint is float else hint) and not (
        isinstance(value, bool) and hint is not bool
    )


def _encode(value: object) -> Any:
    kind: type = type(value)
    if kind in _LEAVES:
        return value
    if isinstance(value, OpenRecord):
        return _encode(value.extra) | {
            _name(f): _encode(getattr(value, f.name))
            for f in _typed(type(value))
            if not (f.name in value.absent and getattr(value, f.name) == _default(f))
        }
    if hasattr(kind, "__dataclass_fields__"):  # a record (dataclasses.is_dataclass, less its checks)
        written = {}
        for name, key, unless_none in _written(kind):
            field_value = getattr(value, name)
            if field_value is None and unless_none:
                continue
            written[key] = field_value if type(field_value) in _LEAVES else _encode(field_value)  # a leaf: no call
        return written
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    return value


_LEAVES = frozenset({str, int, float, bool, type(None)})  # written as they are


@cache
def _written(cls: type) -> tuple[tuple[str, str, bool], ...]:
    """A record class's fields as written: name, JSON name, and whether it is left out while None."""
    return tuple((f.name, _name(f), bool(f.metadata.get("unless_none"))) for f in dataclasses.fields(cls))


def _has_default(f: dataclasses.Field[Any]) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _default(f: dataclasses.Field[Any]) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def shown(value: object) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= 40 else text[:40] + "…"
