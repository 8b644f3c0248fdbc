"""From records to encoded batches, shared by ``tokenize`` and ``count`` so both see the same documents.

Every record read is counted as exactly one of: written (encoded), empty (skipped, as datatrove does; so is a text
that encodes to no token, which only ``no_eos`` allows) or rejected (handed to the caller's ``reject``); blank lines
are counted apart.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import Counter, deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, fields
from queue import Full, Queue
from typing import Any, Generic, TypeVar

import numpy as np
import orjson

from tokenization.errors import TokenizationError, UsageError
from tokenization.formats.contents import Contents
from tokenization.inputs.sources import DEFAULT_MAX_RECORD_BYTES, DocumentReader, Record
from tokenization.options import Options, option
from tokenization.progress import Progress, ProgressMode
from tokenization.records import ContentsSum, HistogramRow, InputFile, RankCounts, Rejected, TokenizerFacts
from tokenization.rendering import renderer
from tokenization.rendering.renderer import Renderer
from tokenization.storage.files import open_fs
from tokenization.tokenizer.cutting import NO_EXACT_CUT, NoExactCut
from tokenization.tokenizer.encoding import Encoded, Encoder, Prepared
from tokenization.tokenizer.engines import EngineChoice
from tokenization.tokenizer.fast_engine import DEFAULT_MEMORY_BUDGET_MB
from tokenization.tokenizer.loading import token_of
from tokenization.tokenizer.policy import SpecialTextPolicy

BATCH_BYTES = 1 << 22  # UTF-8 bytes a batch: a fast engine's group (``encoding.FAST_GROUP_CHARS``) at most
HISTOGRAM_BUCKETS = 48  # powers of two: [1, 2), [2, 4), ... up to 2**47 tokens
# Batches in the engine at once, on threads of their own: while one waits on the Python that frames its ids or on
# its slowest text, the other keeps the cores busy (Mistral-7B, 212 MB on 2 cores: 6.1 s, where one at a time took
# 8.3 s). A record larger than a batch is a batch that goes alone, so a huge document is never encoded beside another.
ENCODING_AT_ONCE = 2
READ_AHEAD_CHARS = 1 << 20  # characters a chunk of records read ahead; a few chunks wait at most
# An input of fewer bytes is read and encoded on the caller's thread: the hand-offs between threads (a few wake-ups,
# each up to milliseconds on a busy machine) cost more than they overlap, ~8 ms a file of 100,000 one-line files.
SMALL_INPUT_BYTES = 1 << 16
UTF8_SLICE_CHARS = 1 << 20  # characters of a text encoded at a time to count its UTF-8 bytes: <= 4 MB at once
DEFAULT_MAX_REJECTS = 1000  # records: a rank fails as soon as it has rejected more than this
DEFAULT_MAX_REJECT_FRACTION = 0.01  # of the records read: checked when the rank has read them all
TOP_REASONS = 3  # reject reasons named in an error
T = TypeVar("T")

log = logging.getLogger(__name__)


def _names(listed: str | None) -> list[str]:
    """``"a, b"`` as ``["a", "b"]``."""
    return [name.strip() for name in (listed or "").split(",") if name.strip()]


class TooManyRejects(TokenizationError):
    """A rank rejected more records than its limits allow, or wrote none of the records it read."""


@dataclass(frozen=True, kw_only=True)
class DocumentOptions(Options):
    """Reading and encoding: the same for tokenize, count and build, so all three see the same documents."""

    tokenizer: str = option(
        help="tokenizer.json, SentencePiece tokenizer.model or OpenAI .tiktoken file, a folder holding one, an fsspec "
        "URL or a hub name",
        title="Tokenizer",
    )
    text_key: str = option("text", help="field holding the text; dotted for a nested field", title="Text field")
    id_key: str = option("id", help="field holding the document id, named in quarantine records", title="Id field")
    eos_token: str | None = option(
        None,
        title="EOS token",
        help="token appended to every document (default: the tokenizer's own end-of-text token, from its "
        "tokenizer_config.json, its SentencePiece model, its post-processor or its vocabulary)",
    )
    no_eos: bool = option(False, help="append no end-of-text token (conflicts with --eos-token)", title="No EOS")
    special_text: SpecialTextPolicy = option(
        "text",
        flag="--special-tokens-in-text",
        title="Special-token text in documents",
        help="literal special-token text in a document, such as '<|endoftext|>': encode it as plain text, or as "
        "the special token (datatrove's behaviour); occurrences are counted either way",
    )
    max_rejects: int | None = option(
        DEFAULT_MAX_REJECTS,
        minimum=0,
        title="Most rejected records",
        help="fail as soon as more records than this are rejected (quarantined with their reason)",
    )
    max_reject_fraction: float | None = option(
        DEFAULT_MAX_REJECT_FRACTION,
        minimum=0,
        maximum=1,
        title="Largest rejected share",
        help="fail when more than this share of the records read is rejected",
    )
    max_record_bytes: int = option(
        DEFAULT_MAX_RECORD_BYTES,
        minimum=1,
        title="Largest record (bytes)",
        help="a line or parquet row of more bytes is rejected as record_too_large, and a line is never held whole "
        "(64 MiB: a 50 MB document passes, and a line that inflates to gigabytes cannot exhaust a worker's memory)",
    )
    engine: EngineChoice = option(
        "auto",
        title="Encoding engine",
        help="auto: the fast exact engine where it can represent the tokenizer, self-checked against HF; "
        "hf: HF tokenizers only",
    )
    memory_budget_mb: int = option(
        DEFAULT_MEMORY_BUDGET_MB,
        minimum=256,
        title="Memory budget of a rank (MB)",
        help="resident memory a rank's process stays within: the fast engine drops its cache of words seen (which "
        "grows with text that does not repeat its words) before it would pass this, and reloads; the ids never "
        "change",
    )
    threads: int | None = option(
        None,
        minimum=1,
        title="Encoding threads",
        help="threads encoding each rank (default: every core the process may use); with several ranks on one "
        "machine at once, give cores / ranks",
    )
    template: str | None = option(
        None,
        title="Record template",
        help="render each record into its text: {field} placeholders (dotted for nested fields; {{ and }} for "
        "braces), such as '{prompt}\\n\\n{response}'; default: the text field alone",
    )
    loss_fields: str | None = option(
        None,
        title="Fields with loss",
        help="comma-separated fields of the template whose text carries loss; everything else, template text "
        "included, carries none (default: every token carries loss)",
    )
    messages_key: str | None = option(
        None, title="Messages field", help="field holding chat messages, a list of {role, content}"
    )
    chat_template: str | None = option(
        None,
        title="Chat template",
        help="Jinja2 chat template that renders the messages (sandboxed), or a tokenizer_config.json whose "
        "chat_template is used; a path or fsspec URL",
    )
    loss_roles: str = option(
        "assistant", title="Roles with loss", help="comma-separated roles whose message content carries loss"
    )
    loss_on_turn_end: bool = option(
        True,
        flag="--no-loss-on-turn-end",
        title="Loss on the end of a turn",
        help="the chat template's text after a content with loss, up to and including its first special token "
        "(<|eot_id|>, <|im_end|>), carries loss, so that a model learns to end its turn; off: only the contents",
        flag_help="only the message contents carry loss, not the template's text that ends a turn (default: it "
        "does, so that a model learns to end its turn)",
    )
    render_steps: int = option(
        renderer.Limits.steps,
        minimum=1,
        title="Render step limit",
        help="loop steps, calls and filters a chat template may take for one record (each of its two renders; "
        "a million take 0.2 to 1.5 s, a chat tens a message): a bound on time that, unlike a clock, gives the "
        "same bytes on any machine; a record over it is quarantined as chat_template_too_many_steps",
    )
    render_max_chars: int = option(
        renderer.Limits.chars,
        minimum=1,
        title="Render size limit (characters)",
        help="characters a chat template may build for one record (its output and all it builds on the way), on "
        "top of 8 for each character of the record's message contents; a record over it is quarantined as "
        "chat_template_output_too_large",
    )
    batch_size: int = option(10_000, minimum=1, param=False, help="documents an encode batch holds at most")
    batch_bytes: int = option(BATCH_BYTES, minimum=1, cli=False, param=False, help="text bytes a batch holds")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.no_eos and self.eos_token is not None:
            raise UsageError(f"no_eos conflicts with eos_token {self.eos_token!r}: give one of them")
        if self.template and self.messages_key:  # (a form's empty field counts as not given)
            raise UsageError("give a template or messages_key (chat records), not both")
        if self.loss_fields and not self.template:
            raise UsageError("loss_fields needs a template: the fields whose text carries loss are the template's")
        if bool(self.messages_key) != bool(self.chat_template):
            raise UsageError("messages_key and chat_template go together: the messages, and how to render them")
        if self.template:
            renderer.field_template(self.template, _names(self.loss_fields))  # a bad template fails here

    @property
    def renders_loss(self) -> bool:
        """Whether records are rendered with loss spans: loss fields, or chat roles."""
        return bool(self.loss_fields or self.messages_key)

    def renderer(self, encoder: Encoder) -> renderer.Renderer | None:
        """How a record becomes its text, when it is not one field; reading a chat template checks it, and that
        ``encoder`` can encode its special tokens exactly."""
        if self.template:
            return renderer.field_template(self.template, _names(self.loss_fields))
        if not self.chat_template or not self.messages_key:  # (given together, as made configs check)
            return None
        fs, path = open_fs(self.chat_template, self.storage_options)
        try:
            source = fs.cat_file(path).decode("utf-8")
        except (FileNotFoundError, UnicodeDecodeError) as exc:
            raise UsageError(f"chat_template {self.chat_template}: {exc}") from None
        if problem := encoder.special_split_problem():
            raise UsageError(f"chat_template {self.chat_template}: {problem}")
        return renderer.chat_template(
            source,
            self.chat_template,
            self.messages_key,
            _names(self.loss_roles),
            special_tokens=encoder.special_tokens,
            limits=renderer.Limits(self.render_steps, self.render_max_chars),
            loss_on_turn_end=self.loss_on_turn_end,
            framed_bos="".join(token_of(encoder.tokenizer, i) for i in encoder.bos_ids),
        )

    def reader(self, files: Sequence[InputFile], rendering: Renderer | None, keep_data: bool = False) -> DocumentReader:
        """A reader of ``files`` as these options read them (keys, record limit, storage), ``rendering`` records
        when they are rendered (``renderer``)."""
        return DocumentReader(
            files, self.text_key, self.id_key, keep_data, rendering, self.max_record_bytes, self.storage_options
        )

    @property
    def source(self) -> str:
        """Where a document's text comes from, for error messages."""
        if self.template:
            return f"template {self.template!r}"
        if self.messages_key:
            return f"messages key {self.messages_key!r}"
        return f"text key {self.text_key!r}"

    def encoder(self, known: TokenizerFacts | None = None) -> Encoder:
        """The encoder these options describe; loading it checks the tokenizer and the EOS before any data (or, with
        what a build's plan ``known`` of them, that the tokenizer is that plan's)."""
        return Encoder(
            self.tokenizer,
            eos_token=self.eos_token,
            special_text=self.special_text,
            engine=self.engine,
            threads=self.threads,
            no_eos=self.no_eos,
            known=known,
            memory_budget_mb=self.memory_budget_mb,
            storage_options=self.storage_options,
        )


@dataclass
class Counts:
    """What happened to every record this rank read: docs_read = docs_written + empty + sum(rejected)."""

    docs_read: int = 0
    docs_written: int = 0
    empty: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    blank_lines: int = 0
    text_bytes: int = 0
    tokens: int = 0
    tokens_written: int = 0
    tokens_dropped: int = 0
    loss_tokens: int = 0  # tokens that carry loss, when loss bytes are computed
    partial_chunk_tokens: int = 0
    longest: int = 0  # tokens in the longest document
    special_token_literals: Counter[str] = field(default_factory=Counter)
    length_buckets: np.ndarray = field(default_factory=lambda: np.zeros(HISTOGRAM_BUCKETS, dtype=np.int64))
    contents: Contents = field(default_factory=Contents)  # of the documents written (``formats.contents``)

    @classmethod
    def of(cls, record: RankCounts) -> Counts:
        """The counts a record holds (a cached file's), to add up with others."""
        buckets = np.zeros(HISTOGRAM_BUCKETS, dtype=np.int64)
        for row in record.length_histogram:
            buckets[row.min_tokens.bit_length() - 1] = row.docs
        own = {"rejected", "special_token_literals", "length_buckets", "loss_tokens", "contents"}
        kept = {f.name for f in fields(cls)} - own
        return cls(
            **{name: getattr(record, name) for name in kept},
            loss_tokens=record.loss_tokens or 0,
            contents=record.contents_in.value if record.contents_in else Contents(),
            rejected=Counter(record.rejected),
            special_token_literals=Counter(record.special_token_literals),
            length_buckets=buckets,
        )

    def add(self, other: Counts) -> None:
        """Add another file's counts to these: a rank's are the sum of its files'."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, Counter):
                mine.update(theirs)
            else:
                setattr(self, f.name, max(mine, theirs) if f.name == "longest" else mine + theirs)

    def add_lengths(self, lengths: np.ndarray) -> None:
        """Count documents of these token lengths in power-of-two buckets: [1, 2), [2, 4), ..."""
        lengths = lengths[lengths > 0]
        if len(lengths):
            self.longest = max(self.longest, int(lengths.max()))
            buckets = np.minimum(np.log2(np.maximum(lengths, 1)).astype(int), HISTOGRAM_BUCKETS - 1)
            np.add.at(self.length_buckets, buckets, 1)

    def record(self) -> RankCounts:
        """The counts as a manifest records them."""
        data = asdict(self)
        del data["length_buckets"], data["contents"]
        return RankCounts(
            **data
            | {
                "contents_in": ContentsSum.of(self.contents),
                "length_histogram": histogram_rows(self.length_buckets),
                "rejected": dict(sorted(self.rejected.items())),
                "rejected_total": sum(self.rejected.values()),
                "special_token_literals": dict(sorted(self.special_token_literals.items())),
                "special_token_literals_total": sum(self.special_token_literals.values()),
            }
        )


def histogram_rows(buckets: np.ndarray) -> list[HistogramRow]:
    """The buckets from the first to the last non-empty one."""
    nonzero = np.flatnonzero(buckets)
    if not len(nonzero):
        return []
    return [
        HistogramRow(min_tokens=2**k, max_tokens=2 ** (k + 1) - 1, docs=int(buckets[k]))
        for k in range(nonzero[0], nonzero[-1] + 1)
    ]


class RejectTally:
    """Counts rejected records by reason, failing the pass as soon as there are more than ``max_rejects``; once
    every record is read, ``check`` fails it if the reject fraction is too high or if records were read but none
    written (a wrong text key rejects them all; such a rank must never look complete). ``before``: the tally of
    the files read before this one, whose rejects count towards the limit too."""

    def __init__(
        self,
        where: str,
        source: str,
        max_rejects: int | None = DEFAULT_MAX_REJECTS,
        max_fraction: float | None = DEFAULT_MAX_REJECT_FRACTION,
        before: RejectTally | None = None,
    ):
        self.where, self.source = where, source
        self.max_rejects, self.max_fraction = max_rejects, max_fraction
        self.before = before
        self.reasons: Counter[str] = Counter()
        self.first: dict[str, Rejected] = {}

    def __call__(self, item: Rejected) -> None:
        self.reasons[item.reason] += 1
        self.first.setdefault(item.reason, item)
        rejected = self.total
        if self.max_rejects is not None and rejected > self.max_rejects:
            raise TooManyRejects(
                f"{self.where}: {rejected} rejected records exceed max_rejects={self.max_rejects}; "
                f"latest: {item.file} line {item.line}: {item.reason}; by reason: {self._reasons()}; "
                f"{self.source}{self._keys_hint()}"
            )

    @property
    def total(self) -> int:
        return sum(self.reasons.values()) + (self.before.total if self.before else 0)

    def next_file(self) -> RejectTally:
        """The tally of the next file: its rejects are added to these by ``add`` once the file is done."""
        return RejectTally(self.where, self.source, self.max_rejects, self.max_fraction, before=self)

    def add(self, other: RejectTally) -> None:
        self.reasons.update(other.reasons)
        for reason, item in other.first.items():
            self.first.setdefault(reason, item)

    def check(self, counts: Counts) -> None:
        """The limits that need the whole pass (``counts``): some document written, and the reject fraction."""
        c = counts
        rejected = self.total
        if c.docs_read and not c.docs_written:
            what = f"{rejected} rejected ({self._reasons()})" if rejected else f"all {c.empty} were empty"
            raise TooManyRejects(
                f"{self.where}: read {c.docs_read} records but wrote none: {what}; {self.source}{self._keys_hint()}"
            )
        if self.max_fraction is not None and c.docs_read and rejected / c.docs_read > self.max_fraction:
            raise TooManyRejects(
                f"{self.where}: {rejected} of {c.docs_read} records rejected ({rejected / c.docs_read:.2%}), above "
                f"max_reject_fraction={self.max_fraction}: {self._reasons()}{self._keys_hint()}"
            )

    def _all(self) -> tuple[Counter[str], dict[str, Rejected]]:
        """The reasons and first examples of this file and of those before it."""
        if self.before is None:
            return self.reasons, self.first
        reasons, first = self.before._all()
        return reasons + self.reasons, self.first | first  # the earliest example of a reason first

    def _reasons(self) -> str:
        reasons, first = self._all()
        top = reasons.most_common(TOP_REASONS)
        example = first[top[0][0]]
        return f"{', '.join(f'{reason} {n}' for reason, n in top)}; first: {example.file} line {example.line}"

    def _keys_hint(self) -> str:
        """The fields a record had when a field was missing: usually the one the user meant is among them."""
        missing = next((item for reason, item in self._all()[1].items() if reason.startswith("missing_")), None)
        if missing is None:
            return ""
        try:
            record = orjson.loads(missing.raw)
        except orjson.JSONDecodeError:
            return ""
        if not isinstance(record, dict):
            return ""
        return f"; its records have the fields {', '.join(record)}"


@dataclass
class Batch:
    """Records in input order, empty ones included; ``encoded`` covers the non-empty ones, in the same order."""

    records: list[Record]
    encoded: Encoded

    def token_counts(self) -> np.ndarray:
        """Tokens per record, 0 for an empty one (the stage writes nothing for it, nor for one of no token)."""
        counts = np.zeros(len(self.records), dtype=np.int64)
        counts[[i for i, r in enumerate(self.records) if r.text]] = self.encoded.lengths
        return counts


def encoded_batches(
    reader: DocumentReader,
    *,
    encoder: Encoder,
    counts: Counts,
    options: DocumentOptions,
    reject: Callable[[Rejected], None],
    desc: str,
    save_loss: bool = False,
    progress: ProgressMode | Progress = None,
    threads: Threads | None = None,
    ahead: ReadAhead[Record | Rejected] | None = None,
    then: Callable[[], None] | None = None,
) -> Generator[Batch, None, None]:
    """Encode the reader's documents in batches bounded by ``options.batch_size`` documents and
    ``options.batch_bytes`` bytes of text, with loss bytes when ``save_loss``.

    Three things overlap: a thread reads, decompresses and parses the input; another encodes one batch (the engine
    releases the GIL) while the caller writes the previous one and prepares the next (``Encoder.prepare``). Those
    two are ``threads``, when a caller that encodes many files gives them, else threads of its own. Such a caller
    may give the reader's read-ahead (``read_ahead``), started already, and ``then``, called once the reader is
    read to its end while the last batches still encode: there it starts its next file's reading, so that no file
    waits for its first batch to be read. Progress: see ``tokenization.progress``; a ``Progress`` given is advanced
    (a rank's, over all its files), not closed."""
    shown = progress if isinstance(progress, Progress) else Progress(desc, reader.total_bytes, "B", progress)
    shown_bytes = 0  # of the reader's, shown so far

    def show(done_bytes: int, docs: int, tokens: int) -> None:
        nonlocal shown_bytes
        shown.advance(done_bytes - shown_bytes, docs=docs, tokens=tokens)
        shown_bytes = done_bytes

    def prepared(records: list[Record]) -> tuple[list[Record], Prepared]:
        """The batch's records and their texts ready for the engine. A document that cannot be cut into bounded
        pieces is quarantined and the rest prepared again (it is usually the batch's last, the one that filled it).
        """
        while True:
            texts = [r for r in records if r.text]
            ranges = [r.no_loss_ranges for r in texts] if save_loss else None
            specials = [r.special_spans for r in texts]
            try:
                return records, encoder.prepare([r.text for r in texts], ranges, specials)
            except NoExactCut as exc:
                uncut = texts[exc.doc]
                log.warning("%s line %d: quarantined as %s: %s", uncut.file, uncut.line, NO_EXACT_CUT, exc)
                counts.rejected[NO_EXACT_CUT] += 1
                reject(Rejected(uncut.file, uncut.line, NO_EXACT_CUT, uncut.text))  # its text, not its line: gone
                records = [r for r in records if r is not uncut]

    def encode(records: list[Record], batch: Prepared) -> Batch:
        return Batch(records, encoder.encode_prepared(batch))

    def done(batch: Batch) -> Batch:  # on the caller's thread, which owns ``counts`` and the encoder's counters
        encoder.count_checked(batch.encoded)
        written = int(np.count_nonzero(batch.encoded.lengths))  # a text of no token (with no EOS) is empty
        counts.docs_written += written
        counts.empty += len(batch.encoded.lengths) - written
        counts.tokens += len(batch.encoded.tokens)
        if batch.encoded.loss is not None:
            counts.loss_tokens += int(np.count_nonzero(batch.encoded.loss))
        counts.add_lengths(batch.encoded.lengths)
        counts.special_token_literals.update(batch.encoded.special_literals)
        show(items.mark, len(batch.encoded.lengths), len(batch.encoded.tokens))
        return batch

    with contextlib.ExitStack() as own:
        if shown is not progress:
            own.enter_context(shown)
        threads = threads or own.enter_context(Threads())
        encoding = threads.encode
        pending: deque[tuple[Future[Any], int]] = deque()  # batches in the engine, with their characters
        room = ENCODING_AT_ONCE * options.batch_bytes  # characters in the engine at once; a bigger batch goes alone
        items = ahead or read_ahead(reader, threads)
        small = isinstance(items, ReadInline)  # read and encoded on this thread: no hand-off to wait for
        try:
            for records in _record_batches(items, counts, options, reject):
                records, ready = prepared(records)  # while the engine encodes the batches before
                if small:
                    yield done(encode(records, ready))
                    continue
                chars = sum(map(len, ready.texts))
                while pending and sum(c for _, c in pending) + chars > room:
                    yield done(pending.popleft()[0].result())
                pending.append((encoding.submit(encode, records, ready), chars))
            if then is not None:
                then()
            while pending:
                yield done(pending.popleft()[0].result())
        finally:  # stopped early: the batches in the engine end here, not during the next file's
            wait([future for future, _ in pending])
        counts.blank_lines += reader.blank_lines
        show(reader.total_bytes, 0, 0)


def read_ahead(reader: DocumentReader, threads: Threads) -> ReadAhead[Record | Rejected]:
    """The reader's items as ``encoded_batches`` reads them: ahead, on the threads' reading thread, or on the
    caller's for an input too small to pay for the hand-offs (``SMALL_INPUT_BYTES``)."""
    small = reader.total_bytes < SMALL_INPUT_BYTES
    return (ReadInline if small else ReadAhead)(
        reader, _text_length, chunk=READ_AHEAD_CHARS, where=lambda: reader.bytes_read, thread=threads.read
    )


def _record_batches(
    items: Iterable[Record | Rejected], counts: Counts, options: DocumentOptions, reject: Callable[[Rejected], None]
) -> Iterator[list[Record]]:
    """Group records into batches, counting each record read and handing each rejected one to ``reject``."""
    records: list[Record] = []
    size = 0
    for item in items:
        counts.docs_read += 1
        if isinstance(item, Rejected):
            counts.rejected[item.reason] += 1
            reject(item)
            continue
        if not item.text:
            counts.empty += 1
        text_bytes = utf8_length(item.text)
        counts.text_bytes += text_bytes
        if text_bytes >= options.batch_bytes and records:  # a record larger than a batch is a batch of its own,
            yield records  # whose tokens are framed in place (``encoding.framed``): a huge one is never held twice
            records, size = [], 0
        records.append(item)
        size += text_bytes
        if len(records) >= options.batch_size or size >= options.batch_bytes:
            yield records
            records, size = [], 0
    if records:
        yield records


def _text_length(item: Record | Rejected) -> int:
    return len(item.text) + 1 if isinstance(item, Record) else 1


def utf8_length(text: str) -> int:
    """The text's UTF-8 bytes, never holding a second copy of it whole (50 MB more for a 50 MB document)."""
    if text.isascii():
        return len(text)
    if len(text) <= UTF8_SLICE_CHARS:  # one slice: without the generator's calls
        return len(text.encode("utf-8"))
    return sum(len(text[k : k + UTF8_SLICE_CHARS].encode("utf-8")) for k in range(0, len(text), UTF8_SLICE_CHARS))


class Threads:
    """The threads that read and encode, one each, kept for as long as ``with`` holds them: a pass over a rank's
    files reads and encodes them all on the same two. A thread of its own for each file would leave each file's
    memory in an allocator arena of its own (glibc keeps up to eight arenas a core): 100 MB more for seven files."""

    def __init__(self) -> None:
        self.read = ThreadPoolExecutor(1, thread_name_prefix="read")
        self.encode = ThreadPoolExecutor(ENCODING_AT_ONCE, thread_name_prefix="encode")

    def __enter__(self) -> Threads:
        return self

    def __exit__(self, *exc: object) -> None:
        self.read.shutdown()
        self.encode.shutdown()


class ReadAhead(Generic[T]):
    """``items``, produced ahead on the ``thread`` given (else one of its own) in chunks of ``chunk`` (by
    ``size``), at most ``depth`` of them waiting, so that reading overlaps with the caller's work and memory stays
    bounded. The producer's errors are raised where they are consumed; stopping early stops the producer. ``mark``
    is what ``where()`` said when the chunk being consumed was read (the reader's byte position, for progress that
    does not run ahead of the work)."""

    def __init__(
        self,
        items: Iterable[T],
        size: Callable[[T], int] = lambda _: 1,
        chunk: int = 256,
        depth: int = 4,
        where: Callable[[], int] = lambda: 0,
        thread: ThreadPoolExecutor | None = None,
    ):
        self.items, self.size, self.chunk, self.where, self.thread = items, size, chunk, where, thread
        self.queue: Queue[Any] = Queue(depth)
        self.stop = threading.Event()
        self.mark = 0
        self._producing: Future[None] | None = None

    def start(self) -> None:
        """Start producing on the ``thread`` given, before the items are iterated (which would start it): a caller
        that never iterates them must ``close`` it."""
        if self.thread is None:
            raise ValueError("a read-ahead started before it is iterated needs a thread that outlives it")
        if self._producing is None:
            self._producing = self.thread.submit(self._produce)

    def close(self) -> None:
        """Stop producing, and wait for the producer to end (its errors reach the queue, never this)."""
        self.stop.set()
        if self._producing is not None:
            self._producing.result()

    def _put(self, item: object) -> bool:
        """Queue ``item`` once there is room; False when the consumer stopped, or is gone with the main thread (a
        Ctrl-C can leave its iterator unclosed, and the interpreter would wait for this thread forever)."""
        while not self.stop.is_set() and threading.main_thread().is_alive():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except Full:
                continue
        return False

    def _produce(self) -> None:
        group: list[Any] = []
        filled = 0
        try:
            for item in self.items:
                group.append(item)
                filled += self.size(item)
                if filled >= self.chunk:
                    if not self._put((group, self.where())):
                        return
                    group, filled = [], 0
            self._put((group, self.where())) and self._put(_END)
        except BaseException as exc:  # the items before it first, then the error, which the consumer raises
            self._put((group, self.where())) and self._put(exc)

    def __iter__(self) -> Iterator[T]:
        with contextlib.ExitStack() as own:
            if self._producing is None:
                thread = self.thread or own.enter_context(ThreadPoolExecutor(1, thread_name_prefix="read"))
                self._producing = thread.submit(self._produce)
            try:
                while (got := self.queue.get()) is not _END:
                    if isinstance(got, BaseException):
                        raise got
                    group, self.mark = got
                    yield from group
            finally:
                self.close()


_END = object()


class ReadInline(ReadAhead[Any]):
    """``items`` as ``ReadAhead`` gives them, read on the caller's thread as they are consumed (``thread`` unused):
    for an input too small to pay for a thread's hand-offs."""

    def start(self) -> None:
        """Nothing to start: its items are read as they are consumed."""

    def __iter__(self) -> Iterator[T]:
        for item in self.items:
            self.mark = self.where()
            yield item
