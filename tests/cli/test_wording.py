"""Counts read as a person writes them: "1 file", "2 files", in the summary, the CLI's lines, logs and pages."""

from __future__ import annotations

from tokenization.builds.pages import environment
from tokenization.wording import counted


def test_one_is_singular_and_every_other_count_plural() -> None:
    assert counted(1, "file") == "1 file"
    assert [counted(n, "file") for n in (0, 2, 1234)] == ["0 files", "2 files", "1,234 files"]
    assert counted(1, "index entry", "index entries") == "1 index entry"
    assert counted(3, "index entry", "index entries") == "3 index entries"


def test_the_pages_count_the_same_way() -> None:
    template = environment().from_string(
        '{{ 1 | counted("file") }}; {{ 4 | counted("file") }}; {{ none | counted("file") }}'
    )
    assert template.render() == "1 file; 4 files; –"
