"""What decides an input file's first pass, as the key of its entry in the tokenization cache.

A file's first pass (its documents' ids, ends and loss bytes, its counts and its quarantined records, in input
order) is a function of its bytes and of what this key describes, and of nothing else: not of its name (its
quarantined records name it when a rank reads them), its rank, the seed or the shuffles, which act on it later.
The engine is not part of it either: the fast engine is exact (HF checks a sample of every run, and the tests
compare both on the shared corpora), so both give the same ids. ``ENCODING_RULES`` is raised whenever this project
changes how a file is read or encoded, so that no entry made under other rules is ever used; the version of HF
``tokenizers``, whose rules decide the ids, is part of the key for the same reason. Nor is ``save_loss``: an entry
holds its documents' loss bytes whatever the build that made it saved (``stages.tokenize.first_pass``), so a build with
``--save-loss`` and one without share it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson
import tokenizers

from tokenization.inputs.formats import file_format
from tokenization.rendering.renderer import Renderer
from tokenization.tokenizer.documents import DocumentOptions
from tokenization.tokenizer.encoding import Encoder

ENCODING_RULES = 2  # 2: an entry holds its loss bytes whatever the build saves (1 keyed save_loss)


@dataclass(frozen=True)
class CacheKey:
    """The key (``digest``) and what it covers, as the entry's marker records it for a person."""

    digest: str
    described: dict[str, Any]


def cache_key(
    content: str,
    url: str,
    *,
    encoder: Encoder,
    renderer: Renderer | None,
    options: DocumentOptions,
) -> CacheKey:
    """The key of the file at ``url`` whose bytes ``content`` identifies (``inputs.content.content_identity``), read and
    encoded with these options, encoder and renderer."""
    policy = encoder.policy
    described = {
        "rules": ENCODING_RULES,
        "content": content,
        "format": list(file_format(url)),  # the name's extension decides how the bytes are read
        "tokenizer": {
            "sha256": encoder.sha256,
            "token_size": encoder.token_size,
            "tokenizers": tokenizers.__version__,  # HF's, whose ids the entries hold (the fast engine is held to them)
        },
        "policy": {
            "eos_id": policy.eos_id,
            "bos_ids": policy.bos_ids,
            "tail_ids": policy.tail_ids,
            "special_text": policy.special_text,
        },
        "rendering": renderer and {k: v for k, v in renderer.describe().items() if k != "text"},  # its sha256 stays
        "fields": {"text": options.text_key, "id": options.id_key, "messages": options.messages_key},
        "max_record_bytes": options.max_record_bytes,
    }
    return CacheKey(hashlib.sha256(orjson.dumps(described, option=orjson.OPT_SORT_KEYS)).hexdigest(), described)
