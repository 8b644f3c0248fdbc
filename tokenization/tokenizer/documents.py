"""From records to encoded batches, shared by ``tokenize`` and ``count`` so both see the same documents.

Every record read is counted as exactly one of: written (encoded), empty (skipped, as datatrove does; so is a text
that encodes to no token, which only ``no_eos`` allows) or rejected (handed to the caller's ``reject``); blank lines
are counted apart.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
from collections import deque
from collections.abc import Callable, Generator, Iterable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass

import numpy as np

from tokenization.errors import UsageError
from tokenization.inputs.reader import DEFAULT_MAX_RECORD_BYTES, DocumentReader, Record
from tokenization.options import Options, option
from tokenization.progress import Progress, ProgressMode
from tokenization.records import InputFile, Rejected, TokenizerFacts
from tokenization.rendering import renderer
from tokenization.rendering.renderer import Renderer
from tokenization.storage.folder import file_at
from tokenization.tokenizer.counts import DEFAULT_MAX_REJECT_FRACTION, DEFAULT_MAX_REJECTS, Counts
from tokenization.tokenizer.cutting import NO_EXACT_CUT, PIECE_CHARS, NoExactCut
from tokenization.tokenizer.encoding import Encoded, Encoder, Prepared
from tokenization.tokenizer.engines import EngineChoice
from tokenization.tokenizer.fast_engine import DEFAULT_MEMORY_BUDGET_MB
from tokenization.tokenizer.loading import token_of
from tokenization.tokenizer.pipeline import ENCODING_AT_ONCE, ReadAhead, ReadInline, Threads
from tokenization.tokenizer.policy import SpecialTextPolicy

BATCH_BYTES = 1 << 22  # UTF-8 bytes a batch: a fast engine's group (``encoding.FAST_GROUP_CHARS``) at most
READ_AHEAD_CHARS = 1 << 20  # characters a chunk of records read ahead; a few chunks wait at most
# An input of fewer bytes is read and encoded on the caller's thread: the hand-offs between threads (a few wake-ups,
# each up to milliseconds on a busy machine) cost more than they overlap, ~8 ms a file of 100,000 one-line files.
SMALL_INPUT_BYTES = 1 << 16
UTF8_SLICE_CHARS = 1 << 20  # characters of a text encoded at a time to count its UTF-8 bytes: <= 4 MB at once

log = logging.getLogger(__name__)


def _names(listed: str | None) -> list[str]:
    """``"a, b"`` as ``["a", "b"]``."""
    return [name.strip() for name in (listed or "").split(",") if name.strip()]


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
        folder, name = file_at(self.chat_template, self.storage_options)
        try:
            source = folder.read(name).decode("utf-8")
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
    read_next: Callable[[], None] | None = None,
    then: Callable[[], None] | None = None,
    primed: Primed | None = None,
) -> Generator[Batch, None, None]:
    """Encode the reader's documents in batches bounded by ``options.batch_size`` documents and
    ``options.batch_bytes`` bytes of text, with loss bytes when ``save_loss``.

    Three things overlap: a thread reads, decompresses and parses the input; another encodes one batch while the
    caller writes the previous one and prepares the next (``Encoder.prepare``). gigatoken releases the GIL while it
    encodes (measured: a Python thread spinning beside ``encode_batch`` got as much CPU as beside two threads
    hashing in C, 22-28% on a loaded 2-core machine); loading it (~0.1 s, GPT-2) and HF's tokenizer holds the GIL.
    The reading and encoding threads are ``threads``, when a caller that encodes many files gives them, else threads
    of its own. Such a caller may give the reader's read-ahead (``read_ahead``), started already; ``read_next``,
    called as soon as that read-ahead has read its input to its end (its last records may wait yet), where it starts
    its next file's reading; and ``then``, called once the last batch is in the engine, where it hands the engine
    that file's first batch (``prime``), which it gives here as ``primed`` (with ``counts=primed.counts``) on the
    file's turn. Progress: see ``tokenization.progress``; a ``Progress`` given is advanced (a rank's, over all its
    files), not closed."""
    shown = progress if isinstance(progress, Progress) else Progress(desc, reader.total_bytes, "B", progress)
    shown_bytes = 0  # of the reader's, shown so far

    def show(done_bytes: int, docs: int, tokens: int) -> None:
        nonlocal shown_bytes
        shown.advance(done_bytes - shown_bytes, docs=docs, tokens=tokens)
        shown_bytes = done_bytes

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
        room = ENCODING_AT_ONCE * options.batch_bytes  # characters in the engine at once; a bigger batch goes alone
        items = ahead or read_ahead(reader, threads)
        small = isinstance(items, ReadInline)  # read and encoded on this thread: no hand-off to wait for
        batches = primed.batches if primed else _record_batches(items, counts, options, reject)
        pending = primed.pending if primed else deque()  # batches in the engine, with their characters
        try:
            if primed is not None:
                if counts is not primed.counts:
                    raise ValueError("a primed file's batches are counted in its own counts: give counts=primed.counts")
                primed.rejects.to(reject)  # may find too many: its batch in the engine ends below all the same
                if primed.error is not None:
                    raise primed.error
            for records in batches:
                records, ready = _prepared(records, encoder, counts, reject, save_loss)  # while the engine encodes
                if small:  # the batches before
                    yield done(_encoded(encoder, records, ready))
                    continue
                chars = sum(map(len, ready.texts))
                while pending and sum(c for _, c in pending) + chars > room:
                    yield done(pending.popleft()[0].result())
                pending.append((encoding.submit(_encoded, encoder, records, ready), chars))
                if read_next is not None and items.read_all:
                    read_next()
                    read_next = None
            if read_next is not None:
                read_next()
            if then is not None:
                then()
            while pending:
                yield done(pending.popleft()[0].result())
        finally:  # stopped early: the batches in the engine end here, not during the next file's
            wait([future for future, _ in pending])
            batches.close()  # and the reading: an error's traceback keeps this frame, and would keep it going
        counts.blank_lines += reader.blank_lines
        show(reader.total_bytes, 0, 0)


class HeldRejects:
    """A file's rejects, held until ``to`` says where they go (its quarantine, opened on its turn), then handed on:
    those of a batch read before the file's turn (``prime``)."""

    def __init__(self) -> None:
        self.held: list[Rejected] = []
        self.sink: Callable[[Rejected], None] | None = None

    def __call__(self, item: Rejected) -> None:
        if self.sink is None:
            self.held.append(item)
        else:
            self.sink(item)

    def to(self, sink: Callable[[Rejected], None]) -> None:
        self.sink = sink
        for item in self.held:
            sink(item)
        self.held.clear()


@dataclass
class Primed:
    """A file's first batch, in the engine before the file's turn (``prime``): the file's batches of records from
    the next on, its counts and rejects so far, and what reading or preparing that first batch raised (raised on
    the file's turn, as it would have been then)."""

    batches: Generator[list[Record], None, None]
    pending: deque[tuple[Future[Batch], int]]
    counts: Counts
    rejects: HeldRejects
    error: Exception | None = None

    def close(self) -> None:
        """Drop it, never taken on (the try failed before the file's turn): its batch out of the engine first."""
        wait([future for future, _ in self.pending])
        self.batches.close()


def prime(
    items: ReadAhead[Record | Rejected],
    *,
    encoder: Encoder,
    options: DocumentOptions,
    save_loss: bool,
    threads: Threads,
) -> Primed | None:
    """Read and prepare a file's first batch from ``items`` (a read-ahead on ``threads``, started), and hand it to
    the engine while the file before it still encodes: the engine no longer waits, at each file's end, for that file
    to be written and the next one's first batch to be read and prepared (10-25 ms a file on 2 cores: the bench's
    GPT-2 rank of 7 files, 42 MB, ran 2-6% faster). The engine then holds one batch more than ``ENCODING_AT_ONCE``
    at most. None for an input read on the caller's thread (``ReadInline``), which has no hand-off to save."""
    if isinstance(items, ReadInline):
        return None
    counts, rejects = Counts(), HeldRejects()
    batches = _record_batches(items, counts, options, rejects)
    primed = Primed(batches, deque(), counts, rejects)
    try:
        if (records := next(batches, None)) is not None:
            records, ready = _prepared(records, encoder, counts, rejects, save_loss)
            chars = sum(map(len, ready.texts))
            primed.pending.append((threads.encode.submit(_encoded, encoder, records, ready), chars))
    except Exception as exc:  # the file's own error, raised on its turn
        primed.error = exc
    return primed


def _prepared(
    records: list[Record], encoder: Encoder, counts: Counts, reject: Callable[[Rejected], None], save_loss: bool
) -> tuple[list[Record], Prepared]:
    """The batch's records and their texts ready for the engine. A document that cannot be cut into bounded pieces
    is quarantined and the rest prepared again (it is usually the batch's last, the one that filled it)."""
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


def _encoded(encoder: Encoder, records: list[Record], batch: Prepared) -> Batch:
    return Batch(records, encoder.encode_prepared(batch))


def read_ahead(reader: DocumentReader, threads: Threads) -> ReadAhead[Record | Rejected]:
    """The reader's items as ``encoded_batches`` reads them: ahead, on the threads' reading thread, or on the
    caller's for an input too small to pay for the hand-offs (``SMALL_INPUT_BYTES``)."""
    small = reader.total_bytes < SMALL_INPUT_BYTES
    return (ReadInline if small else ReadAhead)(
        reader, _text_length, chunk=READ_AHEAD_CHARS, where=lambda: reader.bytes_read, thread=threads.read
    )


def _record_batches(
    items: Iterable[Record | Rejected], counts: Counts, options: DocumentOptions, reject: Callable[[Rejected], None]
) -> Generator[list[Record], None, None]:
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
            yield records  # whose tokens are framed in place (``framing.framed``): a huge one is never held twice
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
    """The text's UTF-8 bytes, never holding a second copy of it whole (50 MB more for a 50 MB document). A text
    that is encoded whole (at most ``cutting.PIECE_CHARS``) is made UTF-8 once, into the copy that CPython keeps
    with a str (``PyUnicode_AsUTF8AndSize``): the engines take a str's UTF-8 from there (gigatoken and HF both read
    it so), and no longer encode it again, as they did after this had encoded it for its length alone (~30 ms of
    the bench's 42 MB GPT-2 rank, with the GIL held both times)."""
    if text.isascii():
        return len(text)
    if len(text) <= PIECE_CHARS:
        _utf8_of(text, ctypes.byref(size := ctypes.c_ssize_t()))
        return size.value
    return sum(len(text[k : k + UTF8_SLICE_CHARS].encode("utf-8")) for k in range(0, len(text), UTF8_SLICE_CHARS))


_utf8_of = ctypes.pythonapi.PyUnicode_AsUTF8AndSize  # the str's UTF-8 (made and kept with it on the first call)
_utf8_of.restype = ctypes.c_void_p  # its address, not a bytes copy
_utf8_of.argtypes = (ctypes.py_object, ctypes.POINTER(ctypes.c_ssize_t))
