"""Long texts cut into pieces that encode to exactly the ids of the whole, so that the memory a document needs
stays bounded.

HF holds 100-450 bytes for every character it encodes (an ``Encoding`` keeps strings and offsets for each token,
a normalized string keeps alignments for each byte): one 50 MB document would need 5 GB or more. A text longer than
``PIECE_CHARS`` is therefore cut into pieces where pretokenizers split (``CUTS``, in order of preference): at a
single space, at the start of a line, or between punctuation or a symbol and a letter or digit (code, base64, CJK's
"。"). HF confirms each cut on a window around it: the two sides must encode to exactly the ids and character spans
of the window. That makes the cut exact for the whole text where the tokenizer decides a split from the characters
beside it: the regex pretokenizers of byte-level BPE (GPT-2, Llama-3, DeepSeek) end a pretoken at such a boundary
whatever comes before, and BPE never merges across pretokens; SentencePiece BPE (Mistral), with no pretokenizer,
has no token that holds "▁" after another character, so none spans a cut at a space. It would not be exact inside a
pretoken, where BPE is not local (GPT-2 pairs a run of "a" from its start: a cut at an odd place passes its window
and changes the whole), so no cut is made there, and a tokenizer that prepends "▁" is cut at spaces only. A stretch
of more than ``MAX_PIECE_CHARS`` with no exact cut (Han characters without punctuation, a run of digits) raises
``NoExactCut``: the document is quarantined as ``NO_EXACT_CUT``, neither encoded whole nor cut inexactly.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from functools import cached_property
from itertools import islice, zip_longest
from typing import NamedTuple

import numpy as np
from tokenizers import Encoding, Tokenizer

from tokenization.tokenizer.loading import TokenizerError

log = logging.getLogger(__name__)

PIECE_CHARS = 1 << 17  # a longer text is cut into pieces of about this size; HF holds 100-450 bytes a character
MAX_PIECE_CHARS = 1 << 19  # a stretch with no exact cut is one piece up to this (HF: 230 MB of CJK), else quarantined
CUT_SEARCH_CHARS = 1 << 14  # the stretch each kind of cut is looked for in at a time; a regex scan, ~0.1 ms
CUT_TRIES = 8  # candidates of a kind HF checks at most per stretch: three encodes of <= 2 * WINDOW_CHARS, ~3 ms
WINDOW_CHARS = 512  # characters on each side of a candidate cut that HF encodes to confirm it
CUT = re.compile(r"(?<=[^\W\d_]) (?=[^\W\d_])")  # a single space between two letters: prose
SPACE_CUTS = (CUT, re.compile(r"(?<=\S) (?=\S)"))  # and between any other two characters: ". Next", "a = b"
CUTS = (  # where pretokenizers split, in order of preference; each match is the index where the next piece begins
    *SPACE_CUTS,
    re.compile(r"(?<=\n)(?=\S)"),  # the start of a line: text with line breaks but no single spaces
    re.compile(r"(?<=[^\W_])(?=[^\w\s])"),  # a letter or digit, then punctuation or a symbol: code, base64, "中文。"
    re.compile(r"(?<=[^\w\s])(?=[^\W_])"),  # punctuation or a symbol, then a letter or digit (not Llama-3's ".a")
)
CUT_PROBE = "The quick brown fox jumps over the lazy dog, said Ada to her old friend Charles."
NO_EXACT_CUT = "no_exact_cut"  # the quarantine reason of a document that cannot be cut into bounded pieces
TOO_BIG = "encoded whole it would take gigabytes; split it upstream"  # what a NoExactCut's message ends with
Ranges = list[tuple[int, int]]  # [start, end) character ranges of a document


class NoExactCut(ValueError):
    """Document ``doc`` of a batch has more than ``MAX_PIECE_CHARS`` characters with no exact cut: encoded whole it
    would take gigabytes, so it is quarantined (``NO_EXACT_CUT``). The message says where, and what is there."""

    def __init__(self, doc: int, message: str):
        super().__init__(message)
        self.doc = doc


class Piece(NamedTuple):
    """Characters ``[start, end)`` of document ``doc`` of a batch, encoded on their own, or the one special token
    they are (``token``). ``dropped_space``: the space just before ``start`` was left out of the text, and belongs
    to the first token."""

    doc: int
    start: int
    end: int
    dropped_space: bool = False
    token: int | None = None  # the special token that a template wrote here: its id, placed apart from the engine


@dataclass(frozen=True)
class Cutter:
    """Cuts the long texts of the tokenizer named ``name`` where HF confirms that it splits them exactly."""

    tokenizer: Tokenizer
    name: str

    @staticmethod
    def short(text: str) -> bool:
        """Whether ``pieces`` gives the text whole, as one piece, with no cut to look for."""
        return len(text) <= PIECE_CHARS

    def pieces(self, doc: int, text: str) -> list[Piece]:
        """The text as pieces of about ``PIECE_CHARS`` characters: one when it is short, or has no exact cut and is
        at most ``MAX_PIECE_CHARS`` long. Raises ``NoExactCut`` for a longer stretch with none."""
        if self.short(text):
            return [Piece(doc, 0, len(text))]
        skip = self.continuation
        if skip is None:
            if len(text) > MAX_PIECE_CHARS:
                raise NoExactCut(doc, f"{len(text)} characters, and its tokenizer cannot be cut exactly: {TOO_BIG}")
            return [Piece(doc, 0, len(text))]
        cuts = self._cuts(doc, text, skip)  # where each piece after the first begins, less its dropped space
        ends = [*cuts, len(text)]
        rest = [Piece(doc, cut + skip, end, skip == 1) for cut, end in zip(cuts, ends[1:], strict=True)]
        return [Piece(doc, 0, ends[0]), *rest]

    def pieces_around(self, doc: int, text: str, specials: Ranges) -> list[Piece]:
        """The pieces of the text between the special tokens that a chat template wrote at ``specials``, and those
        tokens as pieces of their own, as HF reads a text when it recognizes special tokens: it splits them out,
        then normalizes and pre-tokenizes each stretch between them on its own."""
        pieces: list[Piece] = []
        for (begin, end), special in zip_longest(gaps(specials, len(text)), specials):
            if end > begin:
                stretch = self.pieces(doc, text[begin:end])
                pieces += [p._replace(start=p.start + begin, end=p.end + begin) for p in stretch]
            if special is not None:
                token = text[special[0] : special[1]]
                if (token_id := self.tokenizer.token_to_id(token)) is None:
                    raise TokenizerError(f"{self.name}: a chat template's {token!r} is not one of its tokens")
                pieces.append(Piece(doc, special[0], special[1], token=token_id))
        return pieces

    @cached_property
    def continuation(self) -> int | None:
        """How the piece after a cut begins: 0, with its space (byte-level BPE, where " world" is one pre-token),
        or 1, without it (normalizers that prepend "▁", as SentencePiece does: "world" becomes "▁world", which is
        what the whole text holds). None when neither reproduces the probe: long texts are then encoded whole, up
        to ``MAX_PIECE_CHARS``."""
        cuts = [match.start() for match in CUT.finditer(CUT_PROBE)]
        for skip in (0, 1):
            if all(self._splits_exactly(CUT_PROBE, cut, skip) for cut in cuts):
                return skip
        log.warning("%s: no exact way to cut long documents into pieces: each is encoded whole", self.name)
        return None

    def _cuts(self, doc: int, text: str, skip: int) -> list[int]:
        """Where to cut a long text: places about ``PIECE_CHARS`` apart at which HF splits it exactly. Only spaces
        when a "▁" is prepended (``skip`` 1): after any other cut the piece would begin with a "▁" that the whole
        text does not hold."""
        kinds = CUTS if skip == 0 else SPACE_CUTS
        cuts: list[int] = []
        begin = 0  # where the piece being cut begins
        while len(text) - begin > PIECE_CHARS:
            cut = self._cut_after(text, begin, skip, kinds)
            if cut is None and len(text) - begin > MAX_PIECE_CHARS:
                raise NoExactCut(doc, no_cut_reason(text, begin))
            if cut is None:  # the rest is one piece, of at most MAX_PIECE_CHARS
                break
            cuts.append(cut)
            begin = cut + skip
        return cuts

    def _cut_after(self, text: str, begin: int, skip: int, kinds: tuple[re.Pattern[str], ...]) -> int | None:
        """The first exact cut that leaves the piece from ``begin`` between ``PIECE_CHARS`` and ``MAX_PIECE_CHARS``
        long, looked for in stretches of ``CUT_SEARCH_CHARS``, each kind of cut in turn, so that a cut is found
        wherever one exists and a piece grows no longer than it must."""
        limit = min(len(text), begin + MAX_PIECE_CHARS)
        for start in range(begin + PIECE_CHARS, limit, CUT_SEARCH_CHARS):
            for kind in kinds:
                cut = self._cut_near(text, kind, start, min(start + CUT_SEARCH_CHARS, limit), skip)
                if cut is not None:
                    return cut
        return None

    def _cut_near(self, text: str, kind: re.Pattern[str], start: int, stop: int, skip: int) -> int | None:
        """The first of at most ``CUT_TRIES`` candidates of a kind in ``[start, stop)`` that HF confirms on a window
        around it."""
        for match in islice(kind.finditer(text, start, stop), CUT_TRIES):
            cut = match.start()
            begin = max(0, cut - WINDOW_CHARS)
            if self._splits_exactly(text[begin : cut + WINDOW_CHARS], cut - begin, skip):
                return cut
        return None

    def _splits_exactly(self, text: str, cut: int, skip: int) -> bool:
        """HF gives ``text`` the ids and character spans of ``text[:cut]`` followed by those of the rest, which
        begins ``skip`` characters after the cut."""
        left, rest = Piece(0, 0, cut), Piece(0, cut + skip, len(text), skip == 1)
        whole, *parts = self.tokenizer.encode_batch([text, text[:cut], text[rest.start :]], add_special_tokens=False)
        if whole.ids != parts[0].ids + parts[1].ids:
            return False
        spans = np.concatenate([token_spans(parts[0], left), token_spans(parts[1], rest)])
        return np.array_equal(token_spans(whole, Piece(0, 0, len(text))), spans)


def no_cut_reason(text: str, begin: int) -> str:
    """Why a text cannot be cut, with a glimpse of the stretch: a run of one script with no punctuation, a run of
    digits or of symbols."""
    stop = begin + MAX_PIECE_CHARS
    return (
        f"{len(text)} characters, and characters {begin}-{stop} hold no exact cut (a space between letters, a line "
        f"start, or punctuation next to a letter or digit, that the tokenizer splits at), such as "
        f"{text[begin + PIECE_CHARS : begin + PIECE_CHARS + 16]!r}...: {TOO_BIG}"
    )


def gaps(spans: Ranges | None, length: int) -> Ranges:
    """The stretches of a ``length``-character text between sorted ``spans``; the whole text when there are none."""
    bounds = [0, *(x for span in spans or () for x in span), length]
    return list(zip(bounds[::2], bounds[1::2], strict=True))


def token_spans(encoding: Encoding, piece: Piece) -> np.ndarray:
    """The tokens' ``[begin, end)`` characters in the piece's document. A dropped space belongs to the first token,
    which is that space alone when it shares its characters with the next (a prepended "▁" before byte tokens)."""
    spans = np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2) + piece.start
    if piece.dropped_space and len(spans):
        spans[0, 0] = piece.start - 1
        if len(spans) > 1 and spans[0, 1] > spans[1, 0]:
            spans[0, 1] = piece.start
    return spans
