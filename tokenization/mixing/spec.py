"""A mixture's spec, read and checked where it is given (a file, a DAG param), before anything runs: its sources,
their names, inputs, weights and repetition bounds, its budget; the schema the DAG's trigger form checks it with."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import os
import posixpath
import re
from typing import Any

from tokenization.errors import UsageError
from tokenization.formats.names import SOURCE_NAME
from tokenization.mixing import apportioned
from tokenization.records import Mixture, MixtureSource, RecordError
from tokenization.storage.folder import StorageOptions, file_at
from tokenization.wording import counted

MAX_SOURCES = 256  # a document's source is one byte in the ``.ds.source`` sidecar
# A budget's and a repetition's bounds: the merge holds every use of a document in memory (16 bytes each), so a
# source repeated without end, or a budget past any corpus, would only fail after every rank tokenized. 10^15
# tokens is ten times the largest corpora, and stays within float64's exact integers (2^53), which the shares
# apportion in; a thousand uses of each document is past any schedule that repeats a small source.
MAX_TOKENS = 10**15
MAX_REPETITION = 1000
MAX_DEPTH = 3  # a mixture's mapping, its list of sources, a source's mapping: its values are numbers and strings
TOO_DEEP = (
    "nested deeper than a mixture: a mapping of 'tokens' and 'sources', a list of mappings of numbers and strings"
)
NAME = re.compile(SOURCE_NAME)  # a source's name: in file names, metadata, reports and logs
MIXTURE_SCHEMA = {  # the DAG's trigger form validates a mixture with it; ``read_mixture`` checks the rest
    "type": "object",
    "required": ["sources"],
    "additionalProperties": False,
    "properties": {
        "tokens": {
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": MAX_TOKENS,
            "description": "the budget, EOS included",
        },
        "sources": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_SOURCES,
            "items": {
                "type": "object",
                "required": ["name", "input", "weight"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "pattern": f"^{NAME.pattern}$"},
                    "input": {"type": "string", "minLength": 1},
                    "weight": {"type": "number", "exclusiveMinimum": 0},
                    "max_repetition": {"type": "number", "minimum": 1, "maximum": MAX_REPETITION},
                    "text_key": {"type": ["string", "null"]},
                    "template": {"type": ["string", "null"]},
                },
            },
        },
    },
}


class MixtureError(UsageError):
    """A spec that is not a mixture, or one that cannot be made whatever the sources hold: refused where it is read."""


def read_mixture(data: object, where: str) -> Mixture:
    """The mixture ``data`` (a JSON object, from a file or a DAG param) describes, checked; ``where`` it came from
    is named by every error."""
    if not isinstance(data, dict) or not isinstance(data.get("sources"), list):
        raise MixtureError(f"{where}: a mixture is a mapping with a list of 'sources' (and 'tokens')")
    if _too_deep(data):
        raise MixtureError(f"{where}: {TOO_DEEP}")
    _no_strangers(data, Mixture, where)
    for k, source in enumerate(data["sources"]):
        if isinstance(source, dict):
            _no_strangers(source, MixtureSource, f"{where}: sources[{k}]")
    given = {"tokens": None, **_whole_tokens(data, where)}  # its optional fields said: a record reads every field
    given["sources"] = [{"max_repetition": 1, **s} if isinstance(s, dict) else s for s in data["sources"]]
    try:
        mixture = Mixture.from_json(given, where)
    except RecordError as exc:
        raise MixtureError(str(exc)) from None
    if not mixture.sources:
        raise MixtureError(f"{where}: no sources: a mixture names at least one")
    if len(mixture.sources) > MAX_SOURCES:
        raise MixtureError(f"{where}: {len(mixture.sources)} sources, more than the {MAX_SOURCES} a mixture may have")
    if mixture.tokens is not None and mixture.tokens < 1:
        raise MixtureError(f"{where}: tokens is {mixture.tokens}: a budget is at least 1 token")
    if mixture.tokens is not None and mixture.tokens > MAX_TOKENS:
        raise MixtureError(f"{where}: tokens is {mixture.tokens:,}: a budget is at most {MAX_TOKENS:,} tokens (10^15)")
    names: set[str] = set()
    for source in mixture.sources:
        at = f"{where}: source {source.name!r}"
        if not NAME.fullmatch(source.name):
            raise MixtureError(f"{at}: a name is letters, digits, '_', '.' or '-' (at most 64), starting with one")
        if source.name in names:
            raise MixtureError(f"{at}: named twice; each source has a name of its own")
        names.add(source.name)
        if not (math.isfinite(source.weight) and source.weight > 0):
            raise MixtureError(f"{at}: weight {source.weight} is not a positive number")
        if not (math.isfinite(source.max_repetition) and source.max_repetition >= 1):
            raise MixtureError(f"{at}: max_repetition {source.max_repetition} is below 1 (1: never repeat)")
        if source.max_repetition > MAX_REPETITION:
            raise MixtureError(
                f"{at}: max_repetition {source.max_repetition:g} is above {MAX_REPETITION:,}, the most a source's "
                "documents may be used"
            )
        if not source.input:
            raise MixtureError(f"{at}: no input")
    _check_shares(mixture, where)
    return mixture


def _too_deep(data: dict[str, Any]) -> bool:
    """Whether ``data`` holds a list or a mapping below a source's fields (looked at without recursion: a spec may
    be nested past Python's stack, or hold itself, through a YAML alias)."""
    stack: list[tuple[object, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                return True
            stack.extend((item, depth + 1) for item in (value.values() if isinstance(value, dict) else value))
    return False


def _whole_tokens(data: dict[str, Any], where: str) -> dict[str, Any]:
    """``data`` with its budget an integer when it is a whole number written as a float (``5e4``, ``50000.0``:
    JSON and YAML read an exponent as a float); any other fraction is refused."""
    tokens = data.get("tokens")
    if not isinstance(tokens, float):
        return data
    if not tokens.is_integer():
        raise MixtureError(f"{where}: tokens is {tokens:g}: a budget is a whole number of tokens")
    return {**data, "tokens": int(tokens)}


def _check_shares(mixture: Mixture, where: str) -> None:
    """Every source's share is a positive number, and, given a budget, at least one token of it: a source whose
    share rounds to nothing would be left out of its own mixture."""
    try:
        shares = mixture.shares
    except OverflowError:
        raise MixtureError(f"{where}: the weights add up past the largest number: scale them down") from None
    for source, share in zip(mixture.sources, shares, strict=True):
        if not share > 0:
            raise MixtureError(f"{where}: source {source.name!r}: weight {source.weight:g} is 0 of the weights' sum")
    if mixture.tokens is None:
        return
    for source, target in zip(mixture.sources, apportioned(mixture.tokens, shares), strict=True):
        if not target:
            raise MixtureError(
                f"{where}: source {source.name!r}: its share (weight {source.weight:g}) of a budget of "
                f"{counted(mixture.tokens, 'token')} rounds to 0 tokens: raise tokens or its weight"
            )


def _no_strangers(given: dict[str, Any], kind: type, where: str) -> None:
    """Refuse a key that is no field of ``kind``, with the field it was likely meant to be."""
    known = [f.name for f in dataclasses.fields(kind)]
    for key in given:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (its fields: {', '.join(known)})"
            raise MixtureError(
                f"{where}: {key!r} is not a field of a mixture{' source' * (kind is MixtureSource)}{hint}"
            )


def load_mixture_file(path: str, storage_options: StorageOptions | None = None) -> dict[str, Any]:
    """A mixture file's object, at a path or fsspec URL (opened with ``storage_options``): JSON (``.json``, read as
    JSON reads it) or YAML, its numbers read as YAML 1.2 reads them (``1e-3`` is a number; JSON is YAML too); an
    error names the file. A source's relative ``input`` is made relative to the file's folder, so that a spec means
    the same files wherever it is run from."""
    import yaml  # a mixture file is the only YAML the project reads

    holder, name = file_at(path, storage_options)
    try:
        with holder.open(name, "rb") as file:
            text = file.read().decode("utf-8")
        data = json.loads(text) if path.endswith(".json") else yaml.load(text, Loader=_loader())  # a SafeLoader
    except json.JSONDecodeError as exc:
        raise MixtureError(f"{path}: not JSON: line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except yaml.MarkedYAMLError as exc:  # its own text spans lines and quotes the file
        mark = exc.problem_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise MixtureError(f"{path}: not YAML or JSON: {at}{exc.problem}") from None
    except yaml.reader.ReaderError as exc:  # a character YAML refuses (a NUL): its own text spans two lines
        raise MixtureError(f"{path}: not YAML or JSON: {_refused_character(text, exc)}") from None
    except RecursionError:
        raise MixtureError(f"{path}: {TOO_DEEP}") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise MixtureError(f"{path}: cannot be read as a mixture ({type(exc).__name__}: {exc})") from None
    read_mixture(data, path)  # its errors name the file
    folder = holder.url if "://" in path else os.path.dirname(os.path.abspath(path))
    return {
        **_whole_tokens(data, path),
        "sources": [{**s, "input": _located(s["input"], folder)} for s in data["sources"]],
    }


def _located(given: str, folder: str) -> str:
    """A source's input as the spec in ``folder`` (a local folder or a URL) means it: a relative path from that
    folder (its ``..`` folded away, as a path is read); a URL, an absolute path or one from the home folder as
    given."""
    if "://" in given or given.startswith(("/", "~")):
        return given
    scheme, _, rest = folder.rpartition("://")
    joined = posixpath.normpath(posixpath.join(rest, given)) if scheme else os.path.normpath(os.path.join(rest, given))
    return f"{scheme}://" * bool(scheme) + joined + "/" * given.endswith("/")  # a folder's "/" kept


def _refused_character(text: str, exc: Exception) -> str:
    """Where the character YAML's reader refused is, and which (``yaml.reader.ReaderError``), in one line."""
    position, character, reason = (getattr(exc, name) for name in ("position", "character", "reason"))
    line = text.count("\n", 0, position) + 1
    column = position - (text.rfind("\n", 0, position) + 1) + 1
    code = character if isinstance(character, int) else ord(character)
    return f"line {line}, column {column}: the character U+{code:04X}: {reason}"


@functools.cache
def _loader() -> type:
    """A safe YAML loader whose floats are YAML 1.2's: an exponent needs neither a dot nor a sign (YAML 1.1 reads
    ``1e-3`` and ``5e4`` as strings); its other scalars are PyYAML's (``1_000`` is an integer)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    float_tag = "tag:yaml.org,2002:float"
    Loader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != float_tag]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    Loader.add_implicit_resolver(float_tag, YAML_FLOAT, list("-+0123456789."))
    return Loader


YAML_FLOAT = re.compile(
    r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
