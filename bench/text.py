"""Web-like text at any scale, seeded, for the benchmark rows that describe scale.

    python -m bench.text --out DIR --gb 1 [--seed 0] [--files N]   # JSON lines {"text": ...}, N files
    python -m bench.text --fit [CORPORA]                            # the fitted parameters, measured again

A corpus repeated (``bench.run``'s copies) warms every cache a real corpus never warms: an encoder that keeps each
pre-token it has seen meets no new one after the first copy. This text keeps bringing new words at the rate web text
does, so what a stage holds and how fast it runs at 4 GB is what a real corpus of that size would show.

Fitted on the shared corpora's ``web_*`` files (``fit``: 740 non-empty Common Crawl documents, 3.18 MB, 465 k words,
a word being a run of ``\\w`` characters, lowercased):

* Document lengths, in UTF-8 bytes of text, are log-normal: the natural log has mean 7.22 and standard deviation
  1.62 (median 1.4 kB, mean 5.0 kB), the mean and deviation of the logs. Lengths are drawn so, clipped at 1 MB.
* Heaps' law: after n words read, K n^β distinct words, with β = 0.822 and K = 1.84 (``heaps``: least squares on
  the log-log curve at 20 points, evenly spaced in log, from 10 k words to all 465 k; 83.8 k distinct).
* Zipf's law: the frequency of the word of rank r falls as r^-s with s = 0.92 (``zipf``: least squares on the
  log-log rank-frequency curve, ranks 10 to 10,000).

A word's rank is drawn from an unbounded Zipf law whose distinct ranks grow as Heaps' law says, for ever: past rank
``HEAD_RANKS``, P(rank r) falls as r^-a with a = 1/β = 1.22, so n draws hold ~n^(1/a) = n^β distinct ranks (the
tail of ``Generator.zipf(a)``); up to it, as r^-s (the two meet at the seam). ``HEAD_RANKS`` = 28 sets K: it was
chosen so that this text's distinct words after 465 k words match the corpus's, counted as the corpus's are; it
gives 82-86 k, β = 0.84 and K = 1.6 (``tests/bench/test_bench_text.py`` holds it within 10% of K n^β). A draw of
independent words cannot also have the corpus's flat head: its rank-frequency slope is 1.16, not 0.92 (the
corpus's documents each repeat their own words, and a mix of topics and languages flattens its head); the
vocabulary's growth, what caches grow with, is what it follows. A word's spelling is a function of its rank alone:
the bijective base-S numeral of the rank in its script's S syllables, each digit scrambled by the ones before it,
so frequent ranks are short (Latin: 2.7 letters up to rank 240, 5.3 up to 58 k, 8 up to 14 M). Made-up words cost
GPT-2 more tokens than English does: 0.42 tokens a byte here, 0.39 on the corpus.

In proportions chosen after the corpus (its words: 6.8% numbers, 0.4% code-like, 0.08% URLs; its documents: 91%
Latin, 4% Cyrillic, 3% CJK; 9% of its words end a line, 2.9% a paragraph):

* a document's script: Latin 88%, Cyrillic 4%, CJK (Han, words of 1-3 characters, no spaces) 3%, Arabic 2%, Greek
  1.5%, Devanagari 1.5%; every script's numbers, URLs and code are ASCII;
* a slot of a document: a word 94.5%, a number 5% (years, counts, 12,345, 3.14, 45%, $9.99, long ids), code-like
  0.4% (snake_case, camelCase, ``x.y(z)``, ``C:\\x\\y.txt``), a URL 0.1%;
* after a slot: a space 80%, a comma 6%, a full stop 3.5%, a line break 5.5%, a paragraph break 1.2%, a full stop
  and a paragraph break 1.5%, a colon 0.6%, a question mark 0.4%, an opening or closing quote 0.65% each; in
  each script's own marks (CJK: no space, and its own comma, stop and quotes). Cased scripts capitalize the word
  after a sentence or a line, and one rank in 16 past the hundredth always (names).

Every piece is stored as JSON escapes it (``\\n``, ``\\"``, ``\\\\``), so a document is valid JSON and UTF-8 as
assembled: array gathers from a table of pieces (numpy; the 65,536 most frequent words of each script are pieces of
their own), ~15 MB/s a process, a file a process: same seed and files, same bytes.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import math
import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SHARED_CORPORA = Path(__file__).resolve().parents[2] / "shared" / "data" / "corpora"

# Fitted on the shared web_* files (``fit``).
LENGTH_MU, LENGTH_SIGMA = 7.22, 1.62  # log-normal document lengths, bytes of text
HEAPS_BETA, HEAPS_K = 0.822, 1.84  # distinct words K n^beta after n words
ZIPF_S = 0.92  # frequency of rank r as r^-s, ranks 10 to 10,000
HEAD_RANKS = 28  # where the tail of exponent 1 / HEAPS_BETA begins (sets Heaps' K; see above)
MAX_DOCUMENT = 1_000_000  # bytes of text a document at most
TAIL_RANKS = 2**61  # a tail rank past this (a word seen once anyway) is drawn again in [2^61, 2^62)

SCRIPTS = {"latin": 0.88, "cyrillic": 0.04, "cjk": 0.03, "arabic": 0.02, "greek": 0.015, "devanagari": 0.015}
CASED = ("latin", "cyrillic", "greek")
KINDS = {"word": 0.945, "number": 0.05, "code": 0.004, "url": 0.001}
# After a slot, by what it does: the share of each, and those after which a cased script capitalizes.
SEPARATORS = {
    "space": 0.8,
    "comma": 0.06,
    "stop": 0.035,
    "line": 0.055,
    "paragraph": 0.012,
    "stop_paragraph": 0.015,
    "colon": 0.006,
    "question": 0.004,
    "quote_open": 0.0065,
    "quote_close": 0.0065,
}
SENTENCE_ENDS = ("stop", "line", "paragraph", "stop_paragraph", "question")
MARKS = {  # each script's spelling of SEPARATORS, in order
    "latin": (" ", ", ", ". ", "\n", "\n\n", ".\n\n", ": ", "? ", ' "', '" '),
    "cyrillic": (" ", ", ", ". ", "\n", "\n\n", ".\n\n", ": ", "? ", " «", "» "),
    "greek": (" ", ", ", ". ", "\n", "\n\n", ".\n\n", ": ", "; ", ' "', '" '),
    "arabic": (" ", "، ", ". ", "\n", "\n\n", ".\n\n", ": ", "؟ ", ' "', '" '),
    "devanagari": (" ", ", ", "। ", "\n", "\n\n", "।\n\n", ": ", "? ", ' "', '" '),
    "cjk": ("", "，", "。", "\n", "\n\n", "。\n\n", "：", "？", "「", "」"),
}
NUMBERS = {"year": 0.25, "small": 0.4, "thousands": 0.1, "decimal": 0.1, "percent": 0.05, "price": 0.05, "long": 0.05}
CODES = ("snake", "camel", "call", "path")
TLDS = ("com", "org", "net", "de", "ru", "io", "co.uk", "fr", "jp", "edu")
OPEN, CLOSE = '{"text": "', '"}\n'  # a document's JSON line around its text
WORD_TABLE = 1 << 16  # the ranks spelled once a process, as a piece a word
DOCUMENTS_A_BATCH = 256  # ~1.3 MB of text: a batch's arrays stay small enough to reuse freed memory


def _syllables(onsets: Iterable[str], vowels: Iterable[str], codas: Iterable[str]) -> list[str]:
    return [o + v + c for o in onsets for v in vowels for c in codas]


SYLLABLES = {
    "latin": _syllables(["", *"bcdfghlmnprstw", "th"], "aeiou", ["", "n", "r"]),
    "cyrillic": _syllables(["", *"бвгдзклмнпрстхч"], "аеиоу", ["", "н", "р"]),
    "greek": _syllables(["", *"βγδζθκλμνπρστφχ"], "αεηιο", ["", "ν", "ρ"]),
    "arabic": _syllables("ابتثجحخدذرزسشصضطظعغفقكلمنهوي", ["", "ا", "و", "ي"], [""]),
    "devanagari": _syllables("कखगघचछजझटठडढणतथदधनपफबभमयरलवशषसह", ["", "ा", "ि", "ी", "ु", "े", "ो"], [""]),
    "cjk": [chr(c) for c in range(0x4E00, 0x4E00 + 2500)],
}


@dataclass(frozen=True)
class Pieces:
    """Every string a document is made of, as JSON escapes it, one after another in ``data``; a piece's id is its
    index. Groups of pieces (a script's syllables, its capitalized syllables right after them) by first id."""

    data: np.ndarray  # uint8
    starts: np.ndarray  # int64: where each piece begins in data
    sizes: np.ndarray  # int64: its bytes in the JSON line
    text_sizes: np.ndarray  # int64: its bytes of text (0 for the JSON around the text)
    first: dict[str, int]

    @staticmethod
    def of(groups: dict[str, list[str]]) -> Pieces:
        """The table of these groups of strings, in order; the JSON line's opening and closing are not text."""
        strings = [s for group in groups.values() for s in group]
        framing = (OPEN, CLOSE)
        data = [s.encode() if s in framing else json.dumps(s, ensure_ascii=False)[1:-1].encode() for s in strings]
        sizes = np.array([len(b) for b in data], dtype=np.int64)
        first, at = {}, 0
        for name, group in groups.items():
            first[name], at = at, at + len(group)
        return Pieces(
            data=np.frombuffer(b"".join(data), dtype=np.uint8),
            starts=np.cumsum(sizes) - sizes,
            sizes=sizes,
            text_sizes=np.array([0 if s in framing else len(s.encode()) for s in strings], dtype=np.int64),
            first=first,
        )

    def words(self, spelled: Ragged, name: str) -> Pieces:
        """This table and, after it, the words ``spelled`` (each a run of this table's pieces) as pieces of their
        own, the group ``name``."""
        sizes = np.add.reduceat(self.sizes[spelled.values], np.cumsum(spelled.lengths) - spelled.lengths)
        return Pieces(
            data=np.concatenate([self.data, render(self, spelled.values)]),
            starts=np.concatenate([self.starts, len(self.data) + np.cumsum(sizes) - sizes]),
            sizes=np.concatenate([self.sizes, sizes]),
            text_sizes=np.concatenate([self.text_sizes, sizes]),  # syllables need no escape
            first=self.first | {name: len(self.sizes)},
        )


@functools.cache
def syllables() -> Pieces:
    """The pieces words, numbers, URLs and code are spelled with, and what separates them."""
    groups: dict[str, list[str]] = {}
    for script, spelled in SYLLABLES.items():
        groups[f"syllables:{script}"] = spelled
        if script in CASED:
            groups[f"capitals:{script}"] = [s[0].upper() + s[1:] for s in spelled]
        groups[f"marks:{script}"] = list(MARKS[script])
    groups["digits"] = list("0123456789")
    groups["tlds"] = list(TLDS)
    for single in (",", ".", "%", "$", "https://", "www.", "/", "-", ".html", "_", "(", ")", "C:\\", "\\", ".txt"):
        groups[single] = [single]
    return Pieces.of(groups | {OPEN: [OPEN], CLOSE: [CLOSE]})


@functools.cache
def pieces() -> Pieces:
    """The syllables' table and, after it, the words of each script's ``WORD_TABLE`` most frequent ranks as pieces
    of their own, lower case then capitalized: most words a document holds are one piece, not a syllable a piece.
    Made once a process."""
    table, ranks = syllables(), np.arange(1, WORD_TABLE + 1)
    for script in SCRIPTS:
        capitals = (False, True) if script in CASED else (False,)
        spelled = [syllabic(ranks, script, np.full(WORD_TABLE, capital)) for capital in capitals]
        both = Ragged(np.concatenate([s.values for s in spelled]), np.concatenate([s.lengths for s in spelled]))
        table = table.words(both, f"words:{script}")
    return table


@dataclass(frozen=True)
class Ragged:
    """A list of items, each a run of piece ids: ``values`` one item after another, ``lengths`` pieces an item."""

    values: np.ndarray  # int64
    lengths: np.ndarray  # int64

    @staticmethod
    def one(ids: np.ndarray | int, present: np.ndarray) -> Ragged:
        """One piece an item where ``present`` (``ids``: one id, or an id an item), none elsewhere."""
        ids = np.broadcast_to(np.asarray(ids, dtype=np.int64), present.shape)
        return Ragged(ids[present], present.astype(np.int64))

    def where(self, present: np.ndarray) -> Ragged:
        """The items where ``present``, the others emptied."""
        return Ragged(self.values[np.repeat(present, self.lengths)], self.lengths * present)

    def positions(self, starts: np.ndarray) -> np.ndarray:
        """Where each value goes when item i's first goes to ``starts[i]``."""
        begins = np.cumsum(self.lengths) - self.lengths
        return np.repeat(starts - begins, self.lengths) + np.arange(len(self.values))


def join(*parts: Ragged) -> Ragged:
    """Item i is item i of each part, one after the other."""
    lengths = sum(p.lengths for p in parts)
    values = np.empty(int(lengths.sum()), dtype=np.int64)
    at = np.cumsum(lengths) - lengths
    for part in parts:
        values[part.positions(at)] = part.values
        at = at + part.lengths
    return Ragged(values, lengths)


def place(n: int, parts: Sequence[tuple[np.ndarray, Ragged]]) -> Ragged:
    """``n`` items, each made by the one part whose indices name it."""
    lengths = np.zeros(n, dtype=np.int64)
    for index, part in parts:
        lengths[index] = part.lengths
    values = np.empty(int(lengths.sum()), dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    for index, part in parts:
        values[part.positions(starts[index])] = part.values
    return Ragged(values, lengths)


@functools.cache
def head_cdf() -> tuple[np.ndarray, float]:
    """The cumulative probability of ranks 1 to ``HEAD_RANKS`` (r^-s), and the tail's share: the tail's density
    (r^-a, a = 1 / beta) meets the head's at the seam."""
    a = 1 / HEAPS_BETA
    head = np.cumsum(np.arange(1, HEAD_RANKS + 1, dtype=np.float64) ** -ZIPF_S)
    tail = HEAD_RANKS ** (1 - ZIPF_S) / (a - 1)  # the sum of HEAD_RANKS^(a - s) r^-a past the seam, as an integral
    return head / (head[-1] + tail), tail / (head[-1] + tail)


def draw_ranks(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` word ranks (1: the most frequent): the head's by its table, the tail's by inverting
    P(R > r) = (HEAD_RANKS / r)^(a - 1)."""
    cdf, tail_share = head_cdf()
    u = rng.random(n)
    ranks = np.searchsorted(cdf, u, side="right") + 1
    tail = u >= 1 - tail_share
    v = (u[tail] - (1 - tail_share)) / tail_share
    beyond = HEAD_RANKS * (1 - v) ** (-HEAPS_BETA / (1 - HEAPS_BETA))  # (1 - v)^(-1 / (a - 1))
    far = beyond >= TAIL_RANKS
    beyond[far] = rng.integers(TAIL_RANKS, 2 * TAIL_RANKS, int(far.sum()))
    ranks[tail] = np.floor(beyond).astype(np.int64) + 1
    return ranks


@functools.cache
def numeral(script: str) -> tuple[np.ndarray, np.ndarray]:
    """The ranks that end each numeral length (S, S + S^2, ...; capped at int64), and the script's digit scramble."""
    size, ends, total, power = len(SYLLABLES[script]), [], 0, 1
    while total < 2**63 - 1:
        power *= size
        total = min(total + power, 2**63 - 1)
        ends.append(total)
    return np.array(ends, dtype=np.int64), np.random.default_rng(list(script.encode())).permutation(size)


def syllabic(ranks: np.ndarray, script: str, capital: np.ndarray) -> Ragged:
    """Each rank's word as syllables (``syllables()``'s pieces): the bijective base-S numeral of the rank (so a
    rank needs more syllables the rarer it is), each digit scrambled by the ones before it; the first syllable
    capitalized where ``capital`` or where the rank is a name (cased scripts)."""
    ends, scramble = numeral(script)
    size, first = len(SYLLABLES[script]), syllables().first[f"syllables:{script}"]
    length = np.searchsorted(ends, ranks, side="left") + 1
    rest = ranks - 1 - np.concatenate([[0], ends])[length - 1]
    digits = np.zeros((len(ranks), int(length.max(initial=1))), dtype=np.int64)
    previous = length.copy()
    for i in range(digits.shape[1]):
        longer = np.flatnonzero(length > i)  # fewer each time: most words are short
        previous[longer] = scramble[(rest[longer] % size + 31 * previous[longer] + 7 * i) % size]
        digits[longer, i] = first + previous[longer]
        rest[longer] //= size
    if script in CASED:
        digits[:, 0] += size * (capital | names(ranks))
    return Ragged(digits[np.arange(digits.shape[1]) < length[:, None]], length)


def names(ranks: np.ndarray) -> np.ndarray:
    """One rank in 16 past the hundredth, by a hash: a name, always capitalized."""
    return (ranks > 100) & (ranks.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) >> np.uint64(60) == 0)


def spell(ranks: np.ndarray, script: str, capital: np.ndarray) -> Ragged:
    """Each rank's word (capitalized where ``capital``, in a cased script) as ``pieces()``: one piece for a rank
    of the word table, its syllables past it."""
    table = ranks <= WORD_TABLE
    common, rare = np.flatnonzero(table), np.flatnonzero(~table)
    ids = pieces().first[f"words:{script}"] + ranks[common] - 1 + WORD_TABLE * (capital[common] & (script in CASED))
    spelled = Ragged(ids, np.ones(len(common), dtype=np.int64))
    return place(len(ranks), [(common, spelled), (rare, syllabic(ranks[rare], script, capital[rare]))])


def words(rng: np.random.Generator, script: str, capital: np.ndarray) -> Ragged:
    return spell(draw_ranks(rng, len(capital)), script, capital)


def digits(values: np.ndarray, width: int, present: np.ndarray) -> Ragged:
    """Each value's decimal digits, zero-padded to ``width``, where ``present``."""
    count = np.maximum(width, 1 + sum((values >= 10**k).astype(np.int64) for k in range(1, 19)))
    most = int(count.max(initial=1))
    column = np.arange(most)
    matrix = values[:, None] // 10 ** (most - 1 - column) % 10 + syllables().first["digits"]
    keep = (column >= most - count[:, None]) & present[:, None]
    return Ragged(matrix[keep], count * present)


def numbers(rng: np.random.Generator, n: int) -> Ragged:
    """Years, small counts, 12,345, 3.14, 45%, $9.99 and long ids, in the shares of ``NUMBERS``."""
    kind = rng.choice(list(NUMBERS), n, p=list(NUMBERS.values()))
    is_ = {name: kind == name for name in NUMBERS}
    whole = np.select(
        [is_["year"], is_["small"], is_["long"]],
        [rng.integers(1950, 2030, n), rng.geometric(0.08, n), np.floor(10 ** rng.uniform(4, 9, n)).astype(np.int64)],
        rng.integers(1, 1000, n),
    )
    fraction = is_["decimal"] | is_["price"]
    first = pieces().first
    return join(
        Ragged.one(first["$"], is_["price"]),
        digits(whole, 1, np.ones(n, dtype=bool)),
        Ragged.one(first[","], is_["thousands"]),
        digits(rng.integers(0, 1000, n), 3, is_["thousands"]),
        Ragged.one(first["."], fraction),
        digits(rng.integers(0, 100, n), 2, fraction),
        Ragged.one(first["%"], is_["percent"]),
    )


def urls(rng: np.random.Generator, n: int) -> Ragged:
    """https://[www.]site.tld/page[-page][.html]."""
    first, every, lower = pieces().first, np.ones(n, dtype=bool), np.zeros(n, dtype=bool)
    www, hyphen, html = (rng.random(n) < share for share in (0.5, 0.6, 0.3))
    return join(
        Ragged.one(first["https://"], every),
        Ragged.one(first["www."], www),
        words(rng, "latin", lower),
        Ragged.one(first["."], every),
        Ragged.one(first["tlds"] + rng.integers(0, len(TLDS), n), every),
        Ragged.one(first["/"], every),
        words(rng, "latin", lower),
        Ragged.one(first["-"], hyphen),
        words(rng, "latin", lower).where(hyphen),
        Ragged.one(first[".html"], html),
    )


def code(rng: np.random.Generator, n: int) -> Ragged:
    """snake_case (half of them with a third word), camelCase, x.y(z) and C:\\x\\y.txt, in equal shares."""
    kind = rng.integers(0, len(CODES), n)
    snake, camel, call, path = (kind == k for k in range(len(CODES)))
    third = call | (snake & (rng.random(n) < 0.5))
    first, lower = pieces().first, np.zeros(n, dtype=bool)
    return join(
        Ragged.one(first["C:\\"], path),
        words(rng, "latin", lower),
        Ragged.one(np.select([snake, call], [first["_"], first["."]], first["\\"]), ~camel),
        words(rng, "latin", camel),
        Ragged.one(np.where(snake, first["_"], first["("]), third),
        words(rng, "latin", lower).where(third),
        Ragged.one(np.where(call, first[")"], first[".txt"]), call | path),
    )


def slots(rng: np.random.Generator, script: np.ndarray, opens: np.ndarray, closes: np.ndarray) -> Ragged:
    """Documents' slots, in order (``script``: each slot's, as an index of ``SCRIPTS``): a word of its script, a
    number, code or a URL, then what follows it. ``opens`` marks a document's first slot, which the JSON line's
    opening precedes; ``closes`` its last, whose separator is the line's closing."""
    n, first = len(script), pieces().first
    kind = rng.choice(len(KINDS), n, p=list(KINDS.values()))
    separator = rng.choice(len(SEPARATORS), n, p=list(SEPARATORS.values()))
    ends = np.isin(separator, [list(SEPARATORS).index(name) for name in SENTENCE_ENDS])
    capital = opens | np.concatenate([[True], ends[:-1]])
    made = []
    for k, name in enumerate(SCRIPTS):
        index = np.flatnonzero((kind == 0) & (script == k))
        made.append((index, words(rng, name, capital[index])))
    for k, make in ((1, numbers), (2, code), (3, urls)):
        index = np.flatnonzero(kind == k)
        made.append((index, make(rng, len(index))))
    marks = np.array([first[f"marks:{name}"] for name in SCRIPTS])[script] + separator
    lengths = opens + np.ones(n, dtype=np.int64)
    for index, part in made:
        lengths[index] += part.lengths
    starts = np.cumsum(lengths) - lengths
    values = np.empty(int(lengths.sum()), dtype=np.int64)
    values[starts[opens]] = first[OPEN]
    for index, part in made:
        values[part.positions(starts[index] + opens[index])] = part.values
    values[starts + lengths - 1] = np.where(closes, first[CLOSE], marks)
    return Ragged(values, lengths)


@functools.cache
def slot_bytes() -> np.ndarray:
    """Mean bytes of text a slot (a word or other, and what follows it), by script: a document's length in bytes
    becomes its number of slots. Measured once a process on 100 k slots of each script, under a seed of its own,
    so that it is the same whatever the run's seed."""
    rng, n, none = np.random.default_rng(0), 100_000, np.zeros(100_000, dtype=bool)
    text_sizes = pieces().text_sizes
    return np.array([text_sizes[slots(rng, np.full(n, k), none, none).values].sum() / n for k in range(len(SCRIPTS))])


def render(table: Pieces, ids: np.ndarray) -> np.ndarray:
    """The bytes of these pieces, one after the other: one gather from the piece table."""
    sizes = table.sizes[ids]
    ends = np.cumsum(sizes)
    source = np.repeat(table.starts[ids] - (ends - sizes), sizes)
    source += np.arange(len(source))
    return table.data[source]


@dataclass(frozen=True)
class Batch:
    """Documents as JSON lines: their bytes, where each line ends, and each document's bytes of text."""

    data: np.ndarray
    ends: np.ndarray
    text_sizes: np.ndarray


def documents(rng: np.random.Generator, count: int) -> Batch:
    """``count`` documents: each a script and a length in bytes of text (log-normal), as that many slots."""
    script = rng.choice(len(SCRIPTS), count, p=list(SCRIPTS.values()))
    wanted = np.minimum(rng.lognormal(LENGTH_MU, LENGTH_SIGMA, count), MAX_DOCUMENT)
    lengths = np.maximum(1, np.rint(wanted / slot_bytes()[script])).astype(np.int64)
    last = np.cumsum(lengths) - 1
    opens, closes = np.zeros(last[-1] + 1, dtype=bool), np.zeros(last[-1] + 1, dtype=bool)
    opens[last - lengths + 1], closes[last] = True, True
    made = slots(rng, np.repeat(script, lengths), opens, closes)
    piece_ends = np.cumsum(made.lengths)[last]
    table = pieces()
    return Batch(
        data=render(table, made.values),
        ends=np.cumsum(table.sizes[made.values])[piece_ends - 1],
        text_sizes=np.add.reduceat(table.text_sizes[made.values], np.concatenate([[0], piece_ends[:-1]])),
    )


def write_file(path: Path, seed: int, index: int, text_bytes: int) -> int:
    """Whole documents until ``text_bytes`` of text are reached, from the file's own generator (the seed and its
    index, so that files can be made in any order, by any process), under a temporary name, then renamed. Its
    bytes of text."""
    rng = np.random.default_rng([seed, index])
    temporary = path.with_name(f".{path.name}.tmp")
    written = 0
    with temporary.open("wb") as f:
        while written < text_bytes:
            batch = documents(rng, DOCUMENTS_A_BATCH)
            keep = min(len(batch.ends), int(np.searchsorted(np.cumsum(batch.text_sizes), text_bytes - written)) + 1)
            f.write(batch.data[: batch.ends[keep - 1]].tobytes())
            written += int(batch.text_sizes[:keep].sum())
    os.replace(temporary, path)
    return written


def file_name(index: int) -> str:
    return f"web-{index:05d}.jsonl"


def generate(out: Path, gb: float, seed: int = 0, files: int = 0) -> int:
    """``gb`` GB of text (1e9 bytes) in ``files`` files in ``out`` (0: one for each 250 MB, at least two, so that
    both cores work), a process for each core, each file its share; the bytes of text written."""
    files = files or max(2, math.ceil(gb * 4))
    total = round(gb * 1e9)
    shares = [total // files + (k < total % files) for k in range(files)]
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / file_name(k) for k in range(files)]
    with ProcessPoolExecutor(max_workers=min(files, os.cpu_count() or 1)) as pool:
        return sum(pool.map(write_file, paths, [seed] * files, range(files), shares))


WORD = re.compile(r"\w+")


def corpus_words(texts: Iterable[str]) -> list[str]:
    """The words of ``texts`` in order: runs of ``\\w`` characters, lowercased."""
    return [word for text in texts for word in WORD.findall(text.lower())]


def distinct_words(words_read: Sequence[str], points: Sequence[int]) -> list[int]:
    """Distinct words after each of ``points`` (ascending) words read."""
    seen, counts, at = set(), [], 0
    for point in points:
        seen.update(words_read[at:point])
        counts.append(len(seen))
        at = point
    return counts


def heaps(words_read: Sequence[str], start: int = 10_000) -> tuple[float, float]:
    """Heaps' beta and K: least squares on log distinct words against log words read, at 20 points spaced
    evenly in log from ``start`` to every word."""
    points = np.unique(np.geomspace(start, len(words_read), 20).astype(np.int64))
    beta, log_k = np.polyfit(np.log(points), np.log(distinct_words(words_read, points.tolist())), 1)
    return float(beta), float(math.exp(log_k))


def zipf(words_read: Sequence[str], ranks: tuple[int, int] = (10, 10_000)) -> float:
    """Zipf's s: minus the least-squares slope of log frequency against log rank, over ``ranks``."""
    frequencies = np.array(sorted(Counter(words_read).values(), reverse=True), dtype=np.float64)
    rank = np.arange(1, len(frequencies) + 1)
    chosen = (rank >= ranks[0]) & (rank <= ranks[1])
    return float(-np.polyfit(np.log(rank[chosen]), np.log(frequencies[chosen]), 1)[0])


def lognormal(lengths: Sequence[int]) -> tuple[float, float]:
    """The mean and standard deviation of the natural log of the (non-zero) lengths."""
    logs = np.log(np.asarray(lengths, dtype=np.float64))
    return float(logs.mean()), float(logs.std())


def web_texts(folder: Path) -> list[str]:
    """The non-empty texts of the folder's ``web_*.jsonl.gz`` files."""
    texts = []
    for path in sorted(folder.glob("web_*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:  # iterating splits on "\n" only, not on U+2028
            texts += [text for line in f if (text := json.loads(line)["text"])]
    return texts


def fit(texts: Sequence[str]) -> dict[str, float]:
    """The parameters this module's constants hold, measured on ``texts``."""
    read = corpus_words(texts)
    mu, sigma = lognormal([len(text.encode()) for text in texts])
    beta, k = heaps(read)
    return {
        "documents": len(texts),
        "bytes": sum(len(text.encode()) for text in texts),
        "words": len(read),
        "distinct": len(set(read)),
        "length_mu": mu,
        "length_sigma": sigma,
        "heaps_beta": beta,
        "heaps_k": k,
        "zipf_s": zipf(read),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.text", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, help="the folder the JSON-lines files go to")
    parser.add_argument("--gb", type=float, default=1.0, help="GB of text (1e9 bytes of UTF-8; default 1)")
    parser.add_argument("--seed", type=int, default=0, help="the same seed and files give the same bytes (default 0)")
    parser.add_argument("--files", type=int, default=0, help="files (default: one for each 250 MB, at least 2)")
    parser.add_argument("--fit", type=Path, nargs="?", const=SHARED_CORPORA, help="print the fitted parameters")
    args = parser.parse_args(argv)
    if args.fit:
        if not any(args.fit.glob("web_*.jsonl.gz")):
            parser.error(f"{args.fit} holds no web_*.jsonl.gz file to fit on")
        print(json.dumps(fit(web_texts(args.fit)), indent=2))
    elif args.out is None or args.gb <= 0 or args.files < 0:
        parser.error("give --out DIR, a positive --gb and a --files of 0 or more")
    else:
        written = generate(args.out, args.gb, args.seed, args.files)
        print(f"{written:,} bytes of text in {args.out}")


if __name__ == "__main__":
    main()
