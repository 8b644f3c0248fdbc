"""HF's tokenizer of a build's ranks, loaded once a process: a build's worker runs rank after rank (4 ranks on 2
processes: two each), and each rank loaded it again, 0.2-0.7 s for GPT-2, 1-3 s for larger vocabularies. On a next
night, a rank whose files are all hits loads it only to encode its hits' samples again, so that load was most of the
rank; the worker's second and later ranks now take the first's.

Only a rank's encoder asks for it (one made with its plan's facts, ``Encoder(known=...)``), the policy already
applied: the same bytes and policy give the same object, which no caller changes after ``apply_to``. One at a time:
a process that goes on to another tokenizer drops the last one.
"""

from __future__ import annotations

from tokenizers import Tokenizer

from tokenization.tokenizer.loading import TokenizerFile
from tokenization.tokenizer.policy import EncodingPolicy

_last: tuple[tuple[str, str], Tokenizer] | None = None  # (sha256, policy), and the tokenizer with it applied


def policy_applied(file: TokenizerFile, policy: EncodingPolicy) -> Tokenizer:
    """HF's tokenizer of ``file`` with ``policy`` applied: the one this process made last when both are the same."""
    global _last
    if _last is not None and held(file, policy):
        return _last[1]
    key = (file.sha256, repr(policy))
    tokenizer = file.tokenizer
    policy.apply_to(tokenizer)
    _last = (key, tokenizer)
    return tokenizer


def held(file: TokenizerFile, policy: EncodingPolicy) -> bool:
    """Whether this process holds HF's tokenizer of ``file`` with ``policy`` applied already (``policy_applied``
    then loads nothing)."""
    return _last is not None and _last[0] == (file.sha256, repr(policy))
