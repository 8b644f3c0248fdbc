"""datatrove's token-file family: ``X.ds``, ``X.ds.index``, ``X.ds.loss`` and ``X.ds.metadata``.

All binaries are little-endian and headerless, byte-compatible with datatrove 0.10.1 and nanotron:

* ``X.ds``: token ids, uint16 (``token_size`` 2) or uint32 (``token_size`` 4);
* ``X.ds.index``: uint64 exclusive end offset (in tokens) of each document;
* ``X.ds.loss``: one byte per token, 0 = no loss;
* ``X.ds.metadata``: ``"{tokenizer}|{token_size}\\n{token_count}\\n{human count}"`` with no trailing newline.

A mixture's families add, where datatrove's readers look at neither:

* ``X.ds.source``: one byte per index entry, the source of that document (or piece of one), in index order;
* a fourth metadata line, ``sources=web,code,math``: the names of the ids 0, 1, 2...
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from tokenization.errors import TokenizationError
from tokenization.formats.contents import Contents, ContentsHasher, Found
from tokenization.formats.hashed_file import FinishOrAbandon, HashedFile, InOrder, WrittenFile, written_whole
from tokenization.formats.kept import KeptPieces
from tokenization.storage.folder import Folder, StorageOptions, file_at, writing

INDEX_DTYPE = np.dtype("<u8")
LOSS_DTYPE = np.dtype("u1")
SOURCE = ".source"  # a mixture's sidecar: each index entry's source, in index order (``formats.sidecar``)
SOURCE_DTYPE = np.dtype("u1")
SOURCES_LINE = "sources="  # how a mixture's family's metadata names the sources its sidecar's ids stand for
UINT16_VOCAB_LIMIT = 65536
MAP_BYTES = 1 << 20  # a local file as large is memory-mapped (``map_array``), a smaller one read


class Observer(Protocol):
    """What sees each block a writer writes: its tokens, its index entries (relative to it), its loss bytes or None,
    and what the writer's pass that hashed the block found in it (``formats.contents.Found``)."""

    def __call__(self, tokens: np.ndarray, ends: np.ndarray, loss: np.ndarray | None, found: Found) -> None: ...


class TokenFileError(TokenizationError, ValueError):
    """A token file is missing, inconsistent or unreadable; the message names the file."""


def token_size_for_vocab(vocab_size: int) -> int:
    """Bytes per token: 2 while every id fits uint16 (datatrove's rule, added tokens included), else 4."""
    return 4 if vocab_size > UINT16_VOCAB_LIMIT else 2


def token_dtype(token_size: int) -> np.dtype:
    if token_size not in (2, 4):
        raise TokenFileError(f"token_size must be 2 or 4, got {token_size}")
    return np.dtype("<u2") if token_size == 2 else np.dtype("<u4")


def human_count(count: int, unit: str = "T") -> str:
    """``humanize.metric(count, unit)`` for counts, as datatrove prints it: 3 significant digits and an SI prefix."""
    if count == 0:
        return f"0.00 {unit}"
    exponent = math.floor(math.log10(count))
    bucket = exponent // 3 * 3
    value = count / 10**bucket
    digits = max(0, 2 - exponent % 3)
    if round(value, digits) >= 10 ** (exponent % 3 + 1):  # 999.6 rounds up into the next prefix
        exponent += 1
        value /= 10 ** (exponent // 3 * 3 - bucket)
        digits = max(0, 2 - exponent % 3)
    prefix = "kMGTPEZYRQ"[exponent // 3 - 1] if exponent >= 3 else ""
    return f"{value:.{digits}f} {prefix}{unit}"


@dataclass(frozen=True)
class Metadata:
    """datatrove's three lines; a mixture's family adds a fourth, ``sources=web,code,math``: the names of the ids
    in its ``.source`` sidecar (``formats.sidecar``), which datatrove's readers, reading the first line, pass over."""

    tokenizer: str
    token_size: int
    token_count: int
    sources: tuple[str, ...] = ()

    def render(self) -> str:
        named = f"\n{SOURCES_LINE}{','.join(self.sources)}" if self.sources else ""
        return f"{self.tokenizer}|{self.token_size}\n{self.token_count}\n{human_count(self.token_count)}{named}"

    @classmethod
    def parse(cls, text: str, source: str = "metadata") -> Metadata:
        lines = text.split("\n")
        try:
            tokenizer, size = lines[0].rsplit("|", 1)
            named = lines[3].removeprefix(SOURCES_LINE).split(",") if len(lines) > 3 else []
            return cls(tokenizer, int(size), int(lines[1]), tuple(named))
        except (ValueError, IndexError) as exc:
            raise TokenFileError(f"{source}: not a token-file metadata ({text[:80]!r})") from exc


def named_by_content(metadata: bytes, tokenizer_sha256: str) -> bytes:
    """A family's metadata as the dataset's digest covers it: its first line naming the tokenizer by its sha256
    instead of as it was typed (datatrove writes the name or path given, so ``sample/tokenizer.json``, its absolute
    path and a symlink to it write three first lines for one tokenizer); the token size and every other line as
    written. Bytes that are no metadata are left as they are."""
    first, newline, rest = metadata.partition(b"\n")
    _, bar, size = first.rpartition(b"|")
    return b"sha256:%s|%s%s%s" % (tokenizer_sha256.encode(), size, newline, rest) if bar else metadata


@dataclass(frozen=True)
class WrittenTokenFile:
    """What a :class:`TokenFileWriter` produced: the files, their checksums, the counts and its pieces' contents
    (``formats.contents``), hashed from the bytes as they were written."""

    path: Path
    tokens: int
    index_entries: int
    files: tuple[WrittenFile, ...]
    contents: Contents
    folder: str = ""  # where in its output it is published: a bucket's folder for a rank's bucket files, else ""
    hashes: np.ndarray | None = field(default=None, compare=False, repr=False)  # each entry's, when it was asked

    @property
    def name(self) -> str:
        """Its ``.ds`` file's name in the output (relative to the output folder), as records list it."""
        return self.published(self.path.name)

    def published(self, file_name: str) -> str:
        """A file of the family (named as written, in ``path``'s folder) by its name in the output."""
        return f"{self.folder}/{file_name}" if self.folder else file_name


class TokenWriter(Protocol):
    """What a :class:`SplitWriter` writes each file with: a :class:`TokenFileWriter`, or a writer of another
    format with its interface (``formats.megatron.MegatronWriter``)."""

    tokens: int

    def write(self, tokens: np.ndarray, ends: np.ndarray, loss: np.ndarray | None = None) -> None: ...

    def close(self) -> WrittenTokenFile: ...

    def abandon(self) -> None: ...


class TokenFileWriter(FinishOrAbandon):
    """Appends documents to one ``.ds`` family in a local directory, streaming every file.

    Memory stays bounded: tokens, loss bytes and index entries go to disk as they arrive, and the
    checksums and the contents are computed on the way, so closing costs no second read. The contents are hashed
    on a thread of their own (numpy releases the GIL), as the checksums are, while the caller gathers the next
    block: ``write`` takes the arrays over.
    """

    def __init__(
        self,
        path: Path,
        *,
        tokenizer: str,
        token_size: int,
        save_loss: bool,
        durable: bool = True,
        observe: Observer | None = None,
        keep_pieces: KeptPieces | None = None,
        keep_hashes: bool = False,
        expected_tokens: int = 0,
        cached: bool = True,
    ):
        """``observe(tokens, ends, loss, found)``: called with every block written, in order, on the contents' thread (a
        stage's own check, ``stages.verify.OwnCheck``, checks the blocks there instead of reading the file back).
        ``keep_pieces``: where the pieces it names (``chosen``) go as they are hashed (``formats.kept``);
        ``keep_hashes``: each index entry's hash too, which a mixture's sidecar gives its source
        (``formats.sidecar``); ``expected_tokens``: the tokens it will be given, when the caller knows (their files'
        blocks are allocated at once: ``HashedFile``); ``cached``: False for a build's last files, whose tokens and
        loss bytes go past the page cache (``HashedFile``)."""
        self.path = Path(path)
        self.observe = observe
        self.dtype = token_dtype(token_size)
        self.metadata_name = tokenizer  # as given, as datatrove writes it
        self.token_size = token_size
        self.tokens = 0
        self.index_entries = 0
        self._ds = HashedFile(self.path, durable, expected_tokens * token_size, cached)
        self._index = HashedFile(self.path.with_name(self.path.name + ".index"), durable)
        loss_path = self.path.with_name(self.path.name + ".loss")
        loss_bytes = expected_tokens * LOSS_DTYPE.itemsize
        self._loss = HashedFile(loss_path, durable, loss_bytes, cached) if save_loss else None
        keep, into = (None, None) if keep_pieces is None else (keep_pieces.chosen, keep_pieces.add)
        self.contents = ContentsHasher(keep=keep, hashes=keep_hashes, into=into)
        self._hashing = InOrder("contents")
        self.written: WrittenTokenFile | None = None

    def write(self, tokens: np.ndarray, ends: np.ndarray, loss: np.ndarray | None = None) -> None:
        """Append ``tokens``; ``ends`` are index entries relative to the start of ``tokens``."""
        if (self._loss is None) != (loss is None):
            raise ValueError("loss bytes must be given exactly when the writer saves loss")
        tokens = tokens.astype(self.dtype, copy=False)
        self._ds.write(tokens)
        if self._loss is not None and loss is not None:  # both or neither, as checked above
            loss = loss.astype(LOSS_DTYPE, copy=False)
            self._loss.write(loss)
        ends = np.asarray(ends, dtype=np.int64)
        self._index.write((ends + self.tokens).astype(INDEX_DTYPE))
        self._hashing.run(tokens.nbytes, self._hash, tokens, ends, loss)
        self.tokens += len(tokens)
        self.index_entries += len(ends)

    def _hash(self, tokens: np.ndarray, ends: np.ndarray, loss: np.ndarray | None) -> None:
        """The block's contents and, when observed, its checks: one pass over its bytes (``formats.contents``)."""
        if self.observe is None:
            self.contents.add(tokens, ends, loss)
        else:
            self.observe(tokens, ends, loss, self.contents.checked(tokens, ends, loss))

    def close(self) -> WrittenTokenFile:
        try:
            self._hashing.wait()
        finally:
            self._hashing.shutdown()
        files = [self._ds.close(), self._index.close()]
        if self._loss is not None:
            files.append(self._loss.close())
        meta_path = self.path.with_name(self.path.name + ".metadata")
        meta = Metadata(self.metadata_name, self.token_size, self.tokens).render().encode()
        with writing(meta_path):
            meta_path.write_bytes(meta)
        files.append(written_whole(meta_path.name, meta))
        contents = self.contents.result()
        hashes = self.contents.entry_hashes() if self.contents.keeps_hashes else None
        self.written = WrittenTokenFile(
            self.path, self.tokens, self.index_entries, tuple(files), contents, hashes=hashes
        )
        return self.written

    def abandon(self) -> None:
        """Release every file of the family; no metadata is written, so the family never reads as finished."""
        self._hashing.shutdown()
        for hashed in (self._ds, self._index, self._loss):
            if hashed is not None:
                hashed.abandon()


def map_array(folder: Folder, name: str, dtype: np.dtype, label: str, size: int | None = None) -> np.ndarray:
    """A whole binary file as an array: memory-mapped when local and large, read when small or remote (``size``:
    when known). Mapping a file costs ~70 us, reading a small one ~20: a rank of 100,000 one-line files opens
    100,000 indexes."""
    size = folder.size(name) if size is None else size
    if size % dtype.itemsize:
        raise TokenFileError(f"{label}: {size} bytes is not a whole number of {dtype.itemsize}-byte items")
    if size == 0:
        return np.empty(0, dtype)
    if not folder.on_disk:
        return np.frombuffer(folder.read(name), dtype=dtype)
    path = folder.path_of(name)
    if size < MAP_BYTES:
        return np.fromfile(path, dtype=dtype, count=size // dtype.itemsize)
    return np.memmap(path, dtype=dtype, mode="r")


class TokenFile:
    """Reads one ``.ds`` family, local (memory-mapped) or any fsspec URL.

    ``token_size`` comes from the ``.metadata`` file; it is never assumed. Pass it only for files written
    without metadata, and it is then checked against the file sizes. ``listing`` (the sizes of the files in its
    folder, by name, from one listing) answers every question of existence and size without a request: on S3
    each is a HEAD, about ten a file, which a bucket merge of a thousand rank files would wait for in turn.
    """

    def __init__(
        self,
        url: str,
        token_size: int | None = None,
        listing: Mapping[str, int] | None = None,
        storage_options: StorageOptions | None = None,
    ):
        self.url = url
        self.folder, self.name = file_at(url, storage_options)
        self._local = self.folder.on_disk
        self._path = self.folder.path_of(self.name)  # its files' paths, made once: a rank may open 100,000
        self.listing = listing
        if not self.exists(""):
            raise TokenFileError(f"{url}: no such token file")
        self.metadata = self._read_metadata()
        if self.metadata is not None:
            if token_size is not None and token_size != self.metadata.token_size:
                raise TokenFileError(
                    f"{url}: metadata says token_size {self.metadata.token_size}, caller expects {token_size}"
                )
            token_size = self.metadata.token_size
        if token_size is None:
            raise TokenFileError(f"{url}.metadata is missing: pass the token size explicitly")
        self.token_size = token_size
        self.dtype = token_dtype(token_size)

    @property
    def tokenizer(self) -> str:
        """The tokenizer its ``.metadata`` names (a file opened without one, by its token size, names none)."""
        if self.metadata is None:
            raise TokenFileError(f"{self.url}.metadata is missing: it names the tokenizer")
        return self.metadata.tokenizer

    def _read_metadata(self) -> Metadata | None:
        if not self.exists(".metadata"):
            return None
        suffix = ".metadata"
        data = Path(self._path + suffix).read_bytes() if self._local else self.folder.read(self.name + suffix)
        return Metadata.parse(data.decode("utf-8"), f"{self.url}.metadata")

    def exists(self, suffix: str) -> bool:
        """Whether the family's file ``suffix`` (``""``, ``".index"``, ...) exists. (Locally asked of the OS:
        fsspec's answer takes 10x longer, and a rank of 100,000 one-line files asks 300,000 times.)"""
        if self.listing is not None:
            return self.name + suffix in self.listing
        return os.path.exists(self._path + suffix) if self._local else self.folder.exists(self.name + suffix)

    def size(self, suffix: str) -> int:
        """Bytes of the family's file ``suffix``."""
        if self.listing is not None:
            return self.listing[self.name + suffix]
        return os.path.getsize(self._path + suffix) if self._local else self.folder.size(self.name + suffix)

    def _array(self, suffix: str, dtype: np.dtype) -> np.ndarray:
        size = self.size(suffix) if self.listing is not None else None
        return map_array(self.folder, self.name + suffix, dtype, self.url + suffix, size)

    @property
    def tokens(self) -> np.ndarray:
        return self._array("", self.dtype)

    @property
    def ends(self) -> np.ndarray:
        if not self.exists(".index"):
            raise TokenFileError(f"{self.url}.index is missing")
        return self._array(".index", INDEX_DTYPE)

    @property
    def loss(self) -> np.ndarray | None:
        if not self.exists(".loss"):
            return None
        return self._array(".loss", LOSS_DTYPE)

    @property
    def sources(self) -> np.ndarray | None:
        """A mixture's family: the source of each index entry (ids into ``metadata.sources``); None otherwise."""
        if not self.exists(SOURCE):
            return None
        return self._array(SOURCE, SOURCE_DTYPE)

    @property
    def num_tokens(self) -> int:
        return self.size("") // self.token_size

    def document(self, i: int) -> np.ndarray:
        ends = self.ends
        start = int(ends[i - 1]) if i > 0 else 0
        return np.asarray(self.tokens[start : int(ends[i])])


class SplitWriter(FinishOrAbandon):
    """Writes a stream of units (documents, chunks, windows) into numbered ``.ds`` families.

    A file is closed right after the unit that takes it past ``max_tokens`` (datatrove's tokenizer rule), or
    that brings it to ``max_tokens`` with ``close_at_limit`` (datatrove's merger rule); either way a file
    exceeds the limit by less than one unit. The next file opens only when another unit arrives, so there is
    never an empty trailing file. ``on_close(file, units)`` is called as each file is finished, with the number
    of units written so far: the merge publishes and checkpoints there. ``expected_tokens``: the stream's, when the
    caller knows them, which each file is told of as it opens (as many as it can take); ``cached``: as
    ``TokenFileWriter``'s.
    """

    def __init__(
        self,
        directory: Path,
        name_for: Callable[[int], str],
        *,
        tokenizer: str,
        token_size: int,
        save_loss: bool,
        max_tokens: int | None = None,
        close_at_limit: bool = False,
        on_close: Callable[[WrittenTokenFile, int], None] | None = None,
        writer_class: type = TokenFileWriter,
        observe: Callable[[Path], Observer] | None = None,
        keep_pieces: KeptPieces | None = None,
        keep_hashes: bool = False,
        expected_tokens: int = 0,
        cached: bool = True,
    ):
        self.directory = Path(directory)
        self.name_for = name_for
        self.options = {"tokenizer": tokenizer, "token_size": token_size, "save_loss": save_loss}
        if keep_pieces is not None:  # a TokenFileWriter's option, for a stream written into one file
            self.options["keep_pieces"] = keep_pieces
        if keep_hashes:  # a TokenFileWriter's option: a mixture's files
            self.options["keep_hashes"] = True
        if not cached:  # a TokenFileWriter's option: a build's last files
            self.options["cached"] = False
        self.max_tokens = max_tokens
        self.side: Literal["left", "right"] = "left" if close_at_limit else "right"
        self.on_close = on_close
        self.writer_class = writer_class
        self.observe = observe  # the observer of each file, by its path (``TokenFileWriter``)
        self.written: list[WrittenTokenFile] = []
        self.units = 0
        self._expected = expected_tokens  # of the stream, less those given to the files closed already
        self._current: TokenWriter | None = None  # a writer_class: TokenFileWriter or one with its interface

    def write(self, tokens: np.ndarray, unit_ends: np.ndarray, index_ends: np.ndarray, loss: np.ndarray | None) -> None:
        """Append whole units. ``unit_ends`` and ``index_ends`` are relative to ``tokens`` and sorted; every unit
        end is also an index entry (chunk and window modes add inner document ends)."""
        pos = 0
        while pos < len(tokens):
            if self._current is None:
                path = self.directory / self.name_for(len(self.written))
                watched = {} if self.observe is None else {"observe": self.observe(path)}
                expected = {"expected_tokens": min(self._expected, self.max_tokens or self._expected)}
                self._current = self.writer_class(path, **self.options, **watched, **expected)
            cut, full = len(tokens), False
            if self.max_tokens:
                room = self.max_tokens - self._current.tokens
                k = int(np.searchsorted(unit_ends, pos + room, side=self.side))
                if k < len(unit_ends):
                    cut, full = int(unit_ends[k]), True
            lo, hi = np.searchsorted(index_ends, [pos, cut], side="right")
            self._current.write(tokens[pos:cut], index_ends[lo:hi] - pos, None if loss is None else loss[pos:cut])
            self.units += int(np.searchsorted(unit_ends, cut, side="right") - np.searchsorted(unit_ends, pos, "right"))
            pos = cut
            if full:
                self._finish()

    def _finish(self) -> None:
        if self._current is None:
            raise RuntimeError("SplitWriter: no file is open to finish")
        written = self._current.close()
        self._current = None
        self._expected -= written.tokens
        self.written.append(written)
        if self.on_close is not None:
            self.on_close(written, self.units)

    def close(self) -> list[WrittenTokenFile]:
        if self._current is not None:
            self._finish()
        return self.written

    def abandon(self) -> None:
        """Release the file being written without finishing it: ``on_close`` never sees it."""
        if self._current is not None:
            self._current.abandon()
            self._current = None
