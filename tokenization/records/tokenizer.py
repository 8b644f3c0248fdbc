"""Records of the tokenizer: what a run used, what a plan pinned, and the facts a merge or a context shuffle
checks its inputs against."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenization.records.codec import Record, unless_none


@dataclass(frozen=True, kw_only=True)
class TokenizerInfo(Record):
    """The tokenizer as a stage used it: what decides the ids, and how it was encoded."""

    name: str
    sha256: str  # of its tokenizer.json: for a converted file, of the conversion
    vocab_size: int
    token_size: int
    format: str = "tokenizer.json"  # of the file given: "sentencepiece" and "tiktoken" are converted to tokenizer.json
    eos_token: str | None
    eos_id: int | None
    eos_source: str | None = None
    bos_ids: list[int] = field(default_factory=list)
    special_text: str = "text"
    engine: str = "hf"
    engine_note: str | None = None
    self_checked_docs: int = 0
    load_seconds: float | None = None
    # HF's tokenizer was not loaded but taken as the process held it (its plan's, or an earlier rank's): loading it
    # cost this stage nothing; None: loaded, or never needed
    tokenizer_held: bool | None = field(default=None, metadata=unless_none())
    memory_budget_mb: int | None = None  # the resident memory the fast engine kept its process within
    engine_reloads: int = 0  # times it dropped its cache to stay within it
    engine_reload_seconds: float = 0.0


@dataclass(frozen=True, kw_only=True)
class TokenizerFacts(Record):
    """What loading a tokenizer (the file of this ``sha256``) told a build's plan, with the build's EOS settings:
    a rank of the build takes them from the plan, and loads the tokenizer itself only when it encodes a file."""

    sha256: str
    vocab_size: int
    special_tokens: list[str] = field(repr=False)  # out of a plan's log line: some tokenizers have hundreds
    eos_token: str | None
    eos_id: int | None
    eos_source: str | None
    bos_ids: list[int]
    tail_ids: list[int]


@dataclass(frozen=True, kw_only=True)
class MergeTokenizer(Record):
    name: str
    sha256: str | None
    token_size: int


@dataclass(frozen=True, kw_only=True)
class PadToken(Record):
    """The token that pads packed windows (loss 0): the tokenizer's pad token, else its EOS."""

    id: int
    token: str | None  # its text, when the task was told it


@dataclass(frozen=True, kw_only=True)
class PlannedTokenizer(Record):
    sha256: str
    eos_token: str | None


@dataclass(frozen=True, kw_only=True)
class BuildTokenizer(Record):
    name: str
    sha256: str
    eos: str | None
