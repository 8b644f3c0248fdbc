"""This project's version: what every manifest records, and what building the package reads (``pyproject.toml``,
``tool.hatch.version``), so that a stage names it without reading package metadata (~20 ms of a stage's start)."""

__version__ = "0.1.0"
