"""What a run adds to the tokenizer: the EOS, the BOS, and how special-token text in a document is read.

The EOS is appended by the tokenizer's post-processor, as datatrove does, but a BOS that the tokenizer's own
post-processor adds is kept (datatrove drops it: huggingface/datatrove#345). Literal special-token text in a
document, such as "<|endoftext|>", is plain text under the "text" policy and the special token under "special"
(datatrove's behaviour); it is counted either way.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Literal

from tokenizers import Tokenizer
from tokenizers.processors import TemplateProcessing

from tokenization.records import TokenizerFacts
from tokenization.tokenizer.cutting import Ranges, gaps
from tokenization.tokenizer.loading import TokenizerFile, token_of

SpecialTextPolicy = Literal["text", "special"]
SPECIAL_TEXT_POLICIES: tuple[str, ...] = ("text", "special")


@dataclass(frozen=True)
class EncodingPolicy:
    """The ids around every document and how its special-token text is read. ``tail_ids``: what follows each
    document, its EOS (or, with none, what the tokenizer's own post-processor appends)."""

    eos_token: str | None
    eos_id: int | None
    eos_source: str | None  # "param", or where the tokenizer's own was found (``TokenizerFile.choose_eos``)
    bos_ids: list[int]
    special_text: SpecialTextPolicy
    tail_ids: list[int]

    @classmethod
    def choose(
        cls, file: TokenizerFile, *, eos_token: str | None, no_eos: bool, special_text: SpecialTextPolicy
    ) -> EncodingPolicy:
        """The policy for ``file``: ``eos_token``, else its own EOS, else none with ``no_eos``."""
        bos_ids, appended = file.special_ids_around()
        eos_token, eos_source = (None, None) if no_eos else file.choose_eos(eos_token, appended)
        eos_id = None if eos_token is None else file.tokenizer.token_to_id(eos_token)
        tail_ids = appended if eos_id is None else [eos_id]
        return cls(eos_token, eos_id, eos_source, bos_ids, special_text, tail_ids)

    @classmethod
    def known(cls, facts: TokenizerFacts, special_text: SpecialTextPolicy) -> EncodingPolicy:
        """The policy that loading the tokenizer gave a build's plan (``Encoder.facts``)."""
        return cls(facts.eos_token, facts.eos_id, facts.eos_source, facts.bos_ids, special_text, facts.tail_ids)

    def describe(self) -> dict[str, Any]:
        """The manifest's record of the policy: its fields but ``tail_ids``, which the EOS and the tokenizer say."""
        described = asdict(self)
        del described["tail_ids"]
        return described

    def apply_to(self, tokenizer: Tokenizer) -> None:
        """Make the tokenizer's own ``encode`` follow the policy: its post-processor appends the EOS after its BOS
        and the text, and literal special-token text reads as the policy says."""
        if self.eos_token is not None and self.eos_id is not None:  # (set together, by ``choose``)
            bos = [(token_of(tokenizer, i), i) for i in self.bos_ids]
            template = " ".join([*(t for t, _ in bos), "$A", self.eos_token])
            tokenizer.post_processor = TemplateProcessing(
                single=template, special_tokens=list(dict.fromkeys([*bos, (self.eos_token, self.eos_id)])), pair=None
            )
        tokenizer.encode_special_tokens = self.special_text == "text"

    def special_split_problem(self, file: TokenizerFile, tokenizer: Tokenizer) -> str | None:
        """Why a chat template's special tokens cannot be encoded apart from the text around them with exactly the
        ids HF gives the whole text when it recognizes them, or None: a pre-tokenizer that prepends "▁" only at the
        start of a text, or a token that strips the spaces beside it, would make them differ. ``tokenizer``: the
        file's, with this policy applied."""
        if self.special_text != "text" or not file.special_tokens:
            return None
        around = ("Hi ", " there", "\n\nok  ")
        wholes = [token.join(around) for token in file.special_tokens]
        tokenizer.encode_special_tokens = False  # as HF reads the text of a chat template
        try:
            read = tokenizer.encode_batch_fast(wholes, add_special_tokens=False)
        finally:
            tokenizer.encode_special_tokens = True
        first, middle, last = (e.ids for e in tokenizer.encode_batch_fast(list(around), add_special_tokens=False))
        for token, whole in zip(file.special_tokens, read, strict=True):
            token_id = tokenizer.token_to_id(token)
            if whole.ids != [*first, token_id, *middle, token_id, *last]:
                return (
                    f"{file.name}: the text around its special token {token!r} encodes otherwise when the token is "
                    "encoded apart, so the special tokens of a chat template cannot be encoded exactly with the "
                    "contents as text; pass --special-tokens-in-text special"
                )
        return None


@dataclass(frozen=True)
class SpecialLiterals:
    """Finds special-token text in documents. Many documents hold none of the tokens' first characters (all of
    Mistral's, GPT-2's and Llama 3's start with "<"), which a one-character search (memchr) rules out before the
    regex runs: 10x faster on the shared corpora than testing for two-character prefixes, where it was a tenth of
    a Mistral rank's CPU."""

    pattern: re.Pattern[str] | None  # the tokens longest first, so that the longest match wins
    firsts: tuple[str, ...]  # the tokens' first characters

    @classmethod
    def of(cls, special_tokens: list[str]) -> SpecialLiterals:
        """The finder of ``special_tokens``, given longest first."""
        pattern = re.compile("|".join(map(re.escape, special_tokens))) if special_tokens else None
        return cls(pattern, tuple(sorted({t[0] for t in special_tokens if t})))

    def may_hold(self, text: str) -> bool:
        """Whether the text may hold special-token text: it holds one of their first characters (memchr), so that a
        document without any is ruled out with no Counter made (~3 us a document)."""
        return self.pattern is not None and any(c in text for c in self.firsts)

    def count(self, text: str, *, outside: Ranges | None = None) -> Counter[str]:
        """How often the text holds each special token's text, outside the sorted spans ``outside``."""
        found: Counter[str] = Counter()
        for begin, end in gaps(outside, len(text)):
            found.update(self._count(text[begin:end]))  # (the whole text: no copy)
        return found

    def _count(self, text: str) -> Counter[str]:
        if self.pattern is None or not self.may_hold(text):
            return Counter()
        return Counter(self.pattern.findall(text))

    def held_in(self, text: str) -> bool:
        """Whether the text holds any special token's text."""
        return self.pattern is not None and bool(self.pattern.search(text))
