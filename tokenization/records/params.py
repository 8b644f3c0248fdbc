"""The params a stage records (its config's options, the storage options aside) and those a build's plan and record
hold: open records (``codec.OpenRecord``) whose fields are the options some reader takes, typed; every other option
is kept as the version that wrote it had it, so that an older record is read and written back unchanged (a plan's
digest is of its JSON)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenization.records.codec import OpenRecord


@dataclass(frozen=True, kw_only=True)
class StageParams(OpenRecord):
    """A stage's params, of which no reader takes an option by name (the token counter's); the base of the others."""


@dataclass(frozen=True, kw_only=True)
class RankParams(StageParams):
    """A rank's (``stages.tokenize``): its files' prefix, the chunks it cut, the buckets it scattered its documents
    into, and whether it wrote loss files."""

    save_filename: str | None = None
    shuffle_chunk_size: int | None = None
    num_buckets: int | None = None
    save_loss: bool = False


@dataclass(frozen=True, kw_only=True)
class MergeParams(StageParams):
    """The merge's: the chunks it cut (its mixture, when it has one, is kept as the version that wrote it had it: a
    spec before the merge took the typed mixture)."""

    shuffle_chunk_size: int | None = None


@dataclass(frozen=True, kw_only=True)
class ContextParams(StageParams):
    """A context shuffle's: the tokens of each window it cut (every version records them)."""

    context_window: int | None = None


@dataclass(frozen=True, kw_only=True)
class BuildParams(OpenRecord):
    """A build's (``builds.config.BuildConfig``), as its record holds them, and its plan less those that decide no
    byte: the mixture's spec, how ranks share the input, the output format, the chunks, how records were rendered,
    and the window."""

    mixture: dict[str, Any] | None = None
    split_input_mb: int | None = None
    output_format: str | None = None
    shuffle_chunk_size: int | None = None
    template: str | None = None
    messages_key: str | None = None
    context_window: int | None = None

    @property
    def renders_records(self) -> bool:
        """Whether records were rendered (by a template, or as chat messages) before they were encoded."""
        return bool(self.template or self.messages_key)
