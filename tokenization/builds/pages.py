"""The project's HTML pages (the build report, the Airflow plugin's "Corpus builds" page) from Jinja2 templates.

Autoescape is on, so a value from a manifest or a run id never becomes markup. Both pages include one stylesheet,
``templates/style.css``, inline: the report must stay a single self-contained file, and the builds page's
Content-Security-Policy allows inline styles and nothing from outside. The filters write figures for people:
``64,522``, ``23.9 kB``, ``1 min 12 s``, ``2026-11-30 02:00 UTC``, paths that wrap at their slashes, and an en
dash where there is no value.
"""

from __future__ import annotations

import functools
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from markupsafe import Markup

from tokenization.wording import counted

if TYPE_CHECKING:
    from jinja2 import Environment

MISSING = "–"


def integer(value: int | None) -> str:
    """``64522`` as ``64,522``."""
    return MISSING if value is None else f"{value:,}"


def number(value: float | None, digits: int = 1, unit: str = "") -> str:
    """A rate with thousands separators, ``digits`` decimals and its unit: ``1,041,839 tokens/s``; below 1, two
    significant digits (``0.0034 MB/s``), so a slow or tiny build does not read as zero."""
    if value is None:
        return MISSING
    text = f"{value:.2g}" if 0 < abs(value) < 1 else f"{value:,.{digits}f}"
    return f"{text} {unit}".rstrip()


def percent(value: float | None) -> str:
    return MISSING if value is None else f"{value:.1%}"


def size(value: float | None) -> str:
    """Bytes in decimal units, as the MB/s of the rates: ``512 B``, ``23.9 kB``, ``1.2 GB``."""
    if value is None:
        return MISSING
    units = ["B", "kB", "MB", "GB", "TB"]
    unit = units.pop(0)
    while value >= 1000 and units:
        value, unit = value / 1000, units.pop(0)
    if unit == "B":
        return f"{value} B"
    return f"{value:.1f} {unit}" if value < 100 else f"{value:,.0f} {unit}"


def duration(seconds: float | None) -> str:
    """``0.06 s``, ``3.4 s``, ``1 min 12 s``, ``2 h 5 min``."""
    if seconds is None:
        return MISSING
    if seconds < 1:
        return f"{seconds:.2f} s"
    if seconds < 59.95:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


def date(value: datetime | str | None) -> str:
    """A datetime or an ISO 8601 string in UTC to the minute: ``2026-11-30 02:00 UTC`` (naive times are UTC)."""
    if value is None:
        return MISSING
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))  # Python 3.10 does not read "Z"
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def path(value: object) -> str:
    """A path or URL that may wrap after each slash (escaped, then ``<wbr>``), so a long one fits its column."""
    return MISSING if value is None else Markup("/<wbr>").join(str(value).split("/"))


def _finalize(value: object) -> object:
    """Whatever a template prints: ``None`` as the en dash of ``MISSING``, never as ``None``."""
    return MISSING if value is None else value


@functools.cache
def environment() -> Environment:
    """The pages' Jinja2 environment, made when a page is first rendered: importing Jinja2 costs 0.05-0.1 s of CPU,
    which a build's plan and its workers (the fork server imports what they use) go without."""
    from jinja2 import Environment, PackageLoader, StrictUndefined

    from tokenization.builds.compiled_pages import CompiledOnce

    made = Environment(
        loader=PackageLoader("tokenization", "templates"),
        bytecode_cache=CompiledOnce(),
        autoescape=True,
        undefined=StrictUndefined,  # a misspelt name in a template fails the render, not the reader
        finalize=_finalize,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    made.filters.update(
        counted=lambda value, noun, plural=None: MISSING if value is None else counted(value, noun, plural),
        integer=integer,
        number=number,
        percent=percent,
        size=size,
        duration=duration,
        date=date,
        path=path,
    )
    return made


def render(template_name: str, **context: Any) -> str:
    """One page of ``tokenization/templates``, as text."""
    return environment().get_template(template_name).render(**context)
