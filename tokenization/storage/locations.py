"""Where a deployment lets builds read and write: URL prefixes, local folders and ``s3://`` buckets.

Whoever may trigger a build chooses its ``input``, ``output`` and ``tokenizer``. Without a limit, ``output=/etc``
is written to, ``input`` reads any file the worker can, and an ``http://`` output makes the builds page fetch an
internal URL and serve its body from Airflow's origin. A location is allowed when, normalized (``..`` resolved,
symlinks followed for local paths), it lies inside one of the prefixes. ``http(s)://`` and every other scheme are
never allowed, whatever the prefixes say. A folder's files are checked one by one too (``check_files``): a
symlinked file inside an allowed folder can point anywhere the worker can read.

Whatever the deployment allows, a build's output never overlaps its input (``check_disjoint``): the next build on
that input would read this one's files as documents.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tokenization.errors import TokenizationError

ALLOWED_SCHEMES = ("s3",)  # besides local paths
SETTING = "TOKENIZATION_ALLOWED_LOCATIONS"  # the deployment's prefixes: commas or new lines between them
SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
SCHEME_WITHOUT_SLASHES = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]+):(?!//)")  # s3:/b/x, s3:b/x, gs:/
LOCAL_SCHEMES = ("file", "local")  # fsspec's names for local paths
GLOB_CHARS = "*?["  # a path holding one of these is a glob (fsspec's test)
TOKENIZER_CONFIG = "tokenizer_config.json"  # read beside a tokenizer file for its EOS and pad tokens
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", TOKENIZER_CONFIG)  # what a build may read of a tokenizer folder


class LocationError(TokenizationError, ValueError):
    """A location is not allowed; the message names the param, the location and the allowed prefixes."""


def normalize(url: str) -> str:
    """``s3://bucket/key`` with ``.`` and ``..`` resolved, or an absolute local path with symlinks followed;
    a location of another scheme, or one that climbs out of its bucket, raises."""
    match = SCHEME.match(url)
    if match is not None and match.group(1) != "file" and match.group(1).lower() not in ALLOWED_SCHEMES:
        raise LocationError(
            f"{url}: {match.group(1).lower()}:// is not a storage this deployment reads or writes (local or s3://)"
        )
    return resolve(url)


def resolve(url: str) -> str:
    """A local path or a URL of any scheme as one spelling of the place it names: an absolute local path with
    symlinks followed, or ``scheme://bucket/key`` with ``.`` and ``..`` resolved (climbing out of the bucket
    raises)."""
    match = SCHEME.match(url)
    if match is None or match.group(1) == "file":
        path = url[len("file://") :] if match else url
        return os.path.realpath(os.path.abspath(os.path.expanduser(path)))
    scheme = match.group(1).lower()
    bucket, _, key = url[match.end() :].partition("/")
    parts: list[str] = []
    for part in key.split("/"):
        if part == "..":
            if not parts:
                raise LocationError(f"{url}: climbs out of its bucket")
            parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    return posixpath.join(f"{scheme}://{bucket}", *parts) if parts else f"{scheme}://{bucket}"


def split_protocol(url: str) -> tuple[str | None, str]:
    """A URL's protocol (``s3``; None for a plain path) and the rest, as fsspec's ``split_protocol`` reads them (a
    single letter before ``://`` is a Windows drive), without importing fsspec."""
    if "://" in url:
        protocol, path = url.split("://", 1)
        if len(protocol) > 1:
            return protocol, path
    if url.startswith("data:"):
        return "data", url[len("data:") :]
    return None, url


def intended_url(location: str) -> str | None:
    """The URL meant by a location that starts with a storage's name and a colon but not ``://`` (``s3:/b/x``,
    ``s3:b/x``), which fsspec takes for a local path (``./s3:/b/x``) and a build would write there; None for
    anything else. ``file:/x``, which fsspec reads as ``/x`` but this project's own path checks do not, means
    ``file:///x``. fsspec's ``data:`` URLs hold no slashes."""
    match = SCHEME_WITHOUT_SLASHES.match(location)
    if match is None or (scheme := match.group(1).lower()) == "data":
        return None
    import fsspec  # only for a location that reads like a URL: a plain path's command starts without it

    if scheme not in fsspec.available_protocols():
        return None
    rest = location[match.end() :]
    return f"{scheme}://{rest if scheme in LOCAL_SCHEMES else rest.lstrip('/')}"


def malformed_url(location: str) -> str | None:
    """What is wrong with a location that reads like a URL missing a slash (``intended_url``), saying what to
    write instead; None for any other."""
    meant = intended_url(location)
    if meant is None:
        return None
    return (
        f"{location!r} is no URL, a scheme being followed by '://' (fsspec would take it for a local path): write "
        f"{meant}, or ./{location} for a local path"
    )


def glob_folder(path: str) -> str:
    """The folder a glob searches, its part before the segment of the first wildcard; a plain path is its own."""
    first = min((i for i in map(path.find, GLOB_CHARS) if i >= 0), default=None)
    return path if first is None else path[:first].rsplit("/", 1)[0]


def _within(location: str, prefix: str) -> bool:
    """Whether a resolved location is ``prefix`` or lies under it, compared by whole path segments."""
    return location == prefix or location.startswith(prefix.rstrip("/") + "/")


def inside(location: str, folder: str) -> bool:
    """Whether ``location`` is ``folder`` or lies under it, each resolved (``resolve``)."""
    return _within(resolve(location), resolve(folder))


def check_disjoint(inputs: Sequence[str], output: str, what: str = "output") -> None:
    """Refuse an output (or another place a build writes, ``what``: its cache) that is an input, lies inside one
    or holds one (a glob counts as the folder it searches): the next build on that input would read this build's
    manifests, markers and token files as documents."""
    out = resolve(output)
    for spec in inputs:
        folder = resolve(spec if os.path.exists(spec) else glob_folder(spec))  # a real `data [v2]` is no glob
        if _within(out, folder) or _within(folder, out):
            relation = "is" if out == folder else "is inside" if _within(out, folder) else "contains"
            raise LocationError(
                f"{what} {_shown(output, out)} {relation} input {_shown(spec, folder)}: a build on that input would "
                f"read this build's own files as documents; choose {'an' if what[:1] in 'aeiou' else 'a'} {what} "
                "outside every input"
            )


def _shown(given: str, resolved: str) -> str:
    return given if given.rstrip("/") == resolved else f"{given} ({resolved})"


def tokenizer_files(location: str) -> list[str]:
    """The local files a tokenizer param makes a build read: the tokenizer file (``tokenizer.json``, else
    ``tokenizer.model``, in a folder) and the ``tokenizer_config.json`` beside it, so each is checked after its own
    symlinks are resolved. A URL is its own file: object stores have no symlinks."""
    match = SCHEME.match(location)
    if match is not None and match.group(1) != "file":
        return [location]
    path = os.path.expanduser(location[len("file://") :] if match else location)
    if os.path.isdir(path):
        return [os.path.join(path, name) for name in TOKENIZER_FILES]
    return [path, os.path.join(os.path.dirname(path), TOKENIZER_CONFIG)]


@dataclass(frozen=True)
class AllowedLocations:
    """The prefixes inside which builds may read and write."""

    prefixes: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> AllowedLocations:
        """Prefixes separated by commas or new lines, as the deployment setting holds them."""
        return cls(tuple(normalize(p.strip()) for p in re.split(r"[,\n]", text) if p.strip()))

    @classmethod
    def from_env(cls, defaults: Iterable[str]) -> AllowedLocations:
        """The deployment setting ``TOKENIZATION_ALLOWED_LOCATIONS``, or, unset, the ``defaults`` alone."""
        return cls.parse(os.environ.get(SETTING) or ",".join(defaults))

    def allows(self, url: str) -> bool:
        try:
            location = normalize(url)
        except LocationError:
            return False
        return any(_within(location, p) for p in self.prefixes)

    def check(self, param: str, url: str) -> None:
        """Raise :class:`LocationError` naming ``param`` unless ``url`` is inside an allowed prefix."""
        try:
            normalize(url)
        except LocationError as exc:
            raise LocationError(f"param {param}: {exc}") from None
        if not self.allows(url):
            raise LocationError(f"param {param}: {url} is outside {self._described()}")

    def check_files(self, param: str, urls: Iterable[str]) -> None:
        """Refuse the files of ``param`` that resolve outside every prefix, in one error naming the first and
        counting them. Each local file costs a ``realpath`` (an ``lstat`` a path segment)."""
        outside = [url for url in urls if not self.allows(url)]
        if outside:
            first, more = outside[0], len(outside) - 1
            target = resolve(first)
            leads = f"{first} resolves to {target}," if target != first else f"{first} is"
            also = f"; {more} more of its files are too" if more else ""
            raise LocationError(
                f"param {param}: {leads} outside {self._described()}{also}: remove the links, or allow where they lead"
            )

    def _described(self) -> str:
        return (
            f"the locations this deployment allows ({', '.join(self.prefixes) or 'none'}; the deployment setting "
            f"{SETTING} lists them)"
        )
