"""Where a deployment lets builds read and write: URL prefixes, local folders and ``s3://`` buckets.

Whoever may trigger a build chooses its ``input``, ``output`` and ``tokenizer``. Without a limit, ``output=/etc``
is written to, ``input`` reads any file the worker can, and an ``http://`` output makes the builds page fetch an
internal URL and serve its body from Airflow's origin. A location is allowed when, normalized (``..`` resolved,
symlinks followed for local paths), it lies inside one of the prefixes. ``http(s)://`` and every other scheme are
never allowed, whatever the prefixes say.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass

ALLOWED_SCHEMES = ("s3",)  # besides local paths
SETTING = "TOKENIZATION_ALLOWED_LOCATIONS"  # the deployment's prefixes: commas or new lines between them
SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


class LocationError(ValueError):
    """A location is not allowed; the message names the param, the location and the allowed prefixes."""


def normalize(url: str) -> str:
    """``s3://bucket/key`` with ``.`` and ``..`` resolved, or an absolute local path with symlinks followed;
    a location of another scheme, or one that climbs out of its bucket, raises."""
    match = SCHEME.match(url)
    if match is None or match.group(1) == "file":
        path = url[len("file://") :] if match else url
        return os.path.realpath(os.path.abspath(os.path.expanduser(path)))
    scheme = match.group(1).lower()
    if scheme not in ALLOWED_SCHEMES:
        raise LocationError(f"{url}: {scheme}:// is not a storage this deployment reads or writes (local or s3://)")
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
        return any(location == p or location.startswith(p.rstrip("/") + "/") for p in self.prefixes)

    def check(self, param: str, url: str) -> None:
        """Raise :class:`LocationError` naming ``param`` unless ``url`` is inside an allowed prefix."""
        try:
            normalize(url)
        except LocationError as exc:
            raise LocationError(f"param {param}: {exc}") from None
        if not self.allows(url):
            raise LocationError(
                f"param {param}: {url} is outside the locations this deployment allows "
                f"({', '.join(self.prefixes) or 'none'}; the deployment setting {SETTING} lists them)"
            )
