"""Counts in words for people: ``1 file``, ``2 files``, ``1,234 files``, in summaries, logs, reports and pages."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1 (``plural``, else ``noun`` + "s"), with thousands separators."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
